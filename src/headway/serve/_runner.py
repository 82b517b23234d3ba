"""Run the gateway (or the stub) under uvicorn: in the foreground with a SIGTERM drain, or
in a background thread on a free port (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from headway.serve._conn import ACCEPT_BACKLOG, default_max_connections, guarded_protocol, install_log_limits

__all__ = ["free_port", "run_app", "serve_in_thread"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float | None = None) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self._exit_at: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        gw = _gateway_of(self.config.app)
        if gw is not None:
            gw.draining = True
        if self._exit_at is None:
            self._exit_at = time.monotonic()
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
            "http": guarded_protocol(cfg.client_header_timeout_s, cap, cfg.retry_after_s),
            "backlog": ACCEPT_BACKLOG,
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
) -> None:
    """Serve ``app`` in the foreground until SIGTERM/SIGINT (then drain). Repeated log lines
    (a flood of bad requests, ``EMFILE``) are rate-limited (:func:`install_log_limits`).
    ``own_logging``: leave the logging setup as it is (uvicorn's loggers then go to the root
    handlers, e.g. JSON lines)."""
    install_log_limits()
    server = _DrainingServer(
        _config(app, host, port, drain_timeout_s, log_level, access_log, own_logging), drain_timeout_s
    )
    server.run()


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
