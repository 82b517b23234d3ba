"""Run the gateway (or the stub) under uvicorn: in the foreground with a SIGTERM drain, or
in a background thread on a free port (tests, benchmarks).

In the foreground the listening sockets are bound first (:func:`bind_sockets`) and handed to
uvicorn, so that a port already in use is one :class:`ListenError` (the bind's own failure: no
check-then-bind race), and the address is held before the app starts (a slow scorer load then
cannot lose it to another process)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from headway.serve._conn import ACCEPT_BACKLOG, default_max_connections, guarded_protocol, install_log_limits

__all__ = ["ListenError", "bind_sockets", "free_port", "listen_url", "run_app", "serve_in_thread"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ListenError(OSError):
    """The server cannot listen on its address: ``errno`` (``EADDRINUSE`` for a port in use) and a
    message for the user (``strerror``) that names the port and why."""


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound (not yet listening) to every address of ``host`` (``""``: all interfaces) and
    ``port``, as asyncio's ``create_server`` binds them for uvicorn (``SO_REUSEADDR`` on POSIX,
    IPv6 sockets IPv6-only); :class:`ListenError` when one cannot be bound."""
    where = _host_port(host or "0.0.0.0", port)
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(exc.errno, f"cannot listen on {where} ({exc.strerror})") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ListenError(exc.errno, f"port {port} is already in use (on {address[0]})") from None
                raise ListenError(exc.errno, f"cannot listen on {where} ({exc.strerror or exc})") from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def listen_url(host: str, sockets: list[socket.socket]) -> str:
    """``http://HOST:PORT`` of a server on ``sockets`` (the port they are bound to: port 0 picks one)."""
    port = int(sockets[0].getsockname()[1]) if sockets else 0
    return "http://" + _host_port(host or "0.0.0.0", port)


_BACKSTOP_S = 3
"""A gateway ends its open requests itself at the drain timeout; uvicorn's own cut (a bare 500,
a broken stream) comes this much later, for whatever is still stuck."""


def _gateway_of(app: Any) -> Any:
    return getattr(getattr(app, "state", None), "gateway", None)


class _DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: mark the gateway draining (503 to new requests on open
    connections, /health 503), stop accepting, let in-flight work (queued requests are
    in-flight HTTP requests) finish for ``drain_timeout_s``, then have the gateway end what
    is left (:meth:`~headway.serve.Gateway.end_drain`: 503s and final SSE error events)."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain_timeout_s: float | None = None,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self.on_listening = on_listening
        self._exit_at: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_listening is not None:  # the app has started and accepts connections
            self.on_listening()

    def handle_exit(self, sig: int, frame: Any) -> None:
        gw = _gateway_of(self.config.app)
        if gw is not None:
            gw.draining = True
        if self._exit_at is None:
            self._exit_at = time.monotonic()
            if gw is not None:  # (uvicorn's own lines say only that it shuts down)
                within = f"up to {self.drain_timeout_s:g} s" if self.drain_timeout_s is not None else "no limit"
                logging.getLogger("headway.serve").info(
                    "headway gateway draining (%s): %d requests open, new connections refused",
                    within,
                    len(gw.ledger.active),
                )
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        gw = _gateway_of(self.config.app)
        timer: asyncio.TimerHandle | None = None
        if gw is not None and self.drain_timeout_s is not None:
            gw.draining = True
            start = self._exit_at if self._exit_at is not None else time.monotonic()
            delay = max(0.0, start + self.drain_timeout_s - time.monotonic())
            timer = asyncio.get_running_loop().call_later(delay, gw.end_drain)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


def _config(
    app: Starlette,
    host: str,
    port: int,
    drain_timeout_s: float | None,
    log_level: str,
    access_log: bool = False,
    own_logging: bool = False,
) -> uvicorn.Config:
    graceful = None
    if drain_timeout_s is not None:
        graceful = max(1, math.ceil(drain_timeout_s)) + (_BACKSTOP_S if _gateway_of(app) is not None else 0)
    extra: dict[str, Any] = {"timeout_keep_alive": 30}
    gw = _gateway_of(app)
    if gw is not None:  # deadlines on every phase of a client connection, a cap on their number
        cfg = gw.config
        cap = cfg.max_connections or default_max_connections()
        extra = {
            "timeout_keep_alive": cfg.keep_alive_timeout_s,
            "http": guarded_protocol(cfg.client_header_timeout_s, cap, cfg.retry_after_s, cfg.client_send_timeout_s),
            "backlog": ACCEPT_BACKLOG,
            # a client's X-Forwarded-For and -Proto are read only from the proxies the operator trusts
            "proxy_headers": bool(cfg.forwarded_allow_ips),
            "forwarded_allow_ips": list(cfg.forwarded_allow_ips) or None,
        }
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=graceful,
        log_config=None if own_logging else uvicorn.config.LOGGING_CONFIG,
        **extra,
    )


def run_app(
    app: Starlette,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    drain_timeout_s: float | None = None,
    log_level: str = "info",
    access_log: bool = False,
    own_logging: bool = False,
    sockets: list[socket.socket] | None = None,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` in the foreground until SIGTERM/SIGINT (then drain). Repeated log lines
    (a flood of bad requests, ``EMFILE``) are rate-limited (:func:`install_log_limits`).
    ``own_logging``: leave the logging setup as it is (uvicorn's loggers then go to the root
    handlers, e.g. JSON lines).

    ``sockets``: from :func:`bind_sockets` (default: bound here, :class:`ListenError` when they
    cannot be); closed on return. ``on_listening(url)`` is called once the app has started and
    the server accepts connections (uvicorn's own "running on" line is not logged)."""
    if sockets is None:
        sockets = bind_sockets(host, port)
    try:
        install_log_limits()
        url = listen_url(host, sockets)
        server = _DrainingServer(
            _config(app, host, port, drain_timeout_s, log_level, access_log, own_logging),
            drain_timeout_s,
            None if on_listening is None else lambda: on_listening(url),
        )
        server.run(sockets)
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def serve_in_thread(
    app: Starlette, port: int | None = None, *, log_level: str = "warning", startup_timeout_s: float = 10.0
) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 in a daemon thread; yields its base URL."""
    port = port or free_port()
    server = _DrainingServer(_config(app, "127.0.0.1", port, 5.0, log_level), 5.0)
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.serve())

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        loop.close()
