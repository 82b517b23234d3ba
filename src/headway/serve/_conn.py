"""Client connections: a deadline on every phase, a cap on open connections, quiet error logs.

uvicorn's HTTP/1.1 protocol (h11) with four changes (:func:`guarded_protocol`):

- **Request head deadline.** A request line and headers must be complete within
  ``header_timeout_s`` of the connection opening, or of the first byte of a later request on a
  kept-alive connection; otherwise the connection is closed (after a 408 in OpenAI's JSON if
  part of a head came). A connection that sends nothing is closed at the same deadline, and an
  idle kept-alive one after uvicorn's ``timeout_keep_alive``. The body has the gateway's own
  ``body_timeout_s``. Heads are also bounded in size (:data:`MAX_HEAD_BYTES`: a larger one is a 400).
- **Send deadline.** A client that stops taking the answer (a stream it never reads, or reads a
  byte a minute) is cut off: once the connection's write buffer is over its high-water mark
  (asyncio's 64 KiB), the client must take some of it within ``send_timeout_s``, and again within
  each ``send_timeout_s`` after that, until the buffer is back under its low-water mark; otherwise
  the connection is aborted (as nginx's ``send_timeout``). Without it a send to such a client
  waits for good, and a stream waiting on it holds its backend slot for good. The request's scope
  is marked (:data:`SEND_TIMED_OUT`), so that the stream ends counted as ``client_send_timeout``.
- **Connection cap.** Beyond ``max_connections`` open connections, a new one gets a 503
  ``too_many_connections`` with Retry-After at once and is closed half a second later (far
  beyond the cap, closed at once: :func:`guarded_protocol`): the gateway does not run out of file descriptors because of
  idle clients, and clients within the cap are unaffected.
- **Parser errors** (a malformed request line or header, a head over the limit) answer 400
  ``invalid_request`` in OpenAI's JSON instead of uvicorn's plain text.

:class:`RateLimitedLog` keeps error floods (a storm of bad requests, ``EMFILE`` from the
accept loop) to a few lines: each message template at most ``burst`` times per ``period_s``,
then one line saying how many were left out.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from headway.serve._errors import ERRORS

__all__ = [
    "ACCEPT_BACKLOG",
    "SEND_TIMED_OUT",
    "RateLimitedLog",
    "default_max_connections",
    "guarded_protocol",
    "install_log_limits",
]

log = logging.getLogger("headway.serve.conn")

_LOGGERS = (
    "uvicorn.error",
    "asyncio",
    "headway.serve",
    "headway.serve.conn",
    "headway.serve.dispatch",
    "headway.serve.redis",
    "headway.serve.scorer",
)
"""Loggers whose records :func:`install_log_limits` rate-limits."""


_LINGER_S = 0.5
"""How long a connection refused over the cap stays open after its 503 (see ``connection_made``)."""

SEND_TIMED_OUT = "headway.send_timed_out"
"""Key set (True) in the scope of a request whose client was cut off by the send deadline."""

MAX_HEAD_BYTES = 16384
"""Largest request line and headers accepted (h11's own limit for a head arriving in pieces;
checked here for one arriving whole too): a larger head is a 400."""


def default_max_connections() -> int:
    """A quarter of the soft limit on open files (``RLIMIT_NOFILE``), between 64 and 8192: the
    rest is left for connections refused over the cap (each open for a moment), the ones the
    accept loop takes in one go (``ACCEPT_BACKLOG``), the backend connections, Redis and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 8192
    return max(64, min(8192, soft // 4))


ACCEPT_BACKLOG = 128
"""uvicorn's ``backlog`` for the gateway (its default is 2048): also how many connections
asyncio accepts in one go before any of them is looked at, so a flood cannot take that many
file descriptors at once."""


def _raw_error(status: int, code: str, message: str, retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 error response with an OpenAI-style body and ``Connection: close``."""
    body = json.dumps({"error": {"message": message, "type": ERRORS[code].type, "param": None, "code": code}}).encode()
    phrase = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = [f"HTTP/1.1 {status} {phrase}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]  # fmt: skip
    if retry_after_s is not None:
        head.append(f"retry-after: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _GuardedH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0
    send_timeout_s: float = 60.0
    max_connections: int = 1024
    retry_after_s: int = 1
    abort_above: int = 2048
    """Beyond this many connections a new one is closed at once, without its 503."""
    num_refused: int = 0
    """Connections refused over the cap (counted on the class :func:`guarded_protocol` made)."""
    num_send_timeouts: int = 0
    """Connections cut off by the send deadline (likewise)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: Any = None
        self._head_bytes = 0
        self._refused = False
        self._send_timer: Any = None
        self._send_left = 0
        """Bytes in the write buffer when the send deadline was last armed."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        n = len(self.connections)
        if n > self.max_connections:
            # over the cap: the 503 at once, then a half-close; what the client sends meanwhile is
            # read and dropped (closing on unread data would reset the connection, and the 503
            # could be lost with it), for at most _LINGER_S: a refused connection holds its file
            # descriptor that long, and beyond ``abort_above`` not at all
            self._refused = True
            type(self).num_refused += 1
            if n > self.abort_above:
                transport.abort()
                return
            msg = ERRORS["too_many_connections"].message
            transport.write(_raw_error(503, "too_many_connections", msg, self.retry_after_s))
            if transport.can_write_eof():
                transport.write_eof()
            self._head_timer = self.loop.call_later(min(_LINGER_S, self.header_timeout_s), transport.close)
            return
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered already: dropped
            return
        if self.conn.their_state is h11.IDLE:
            if self._head_timer is None:
                self._arm_head_timer()  # the first byte of a request on a kept-alive connection
            end = data.find(b"\r\n\r\n")
            if self._head_bytes + (len(data) if end < 0 else end + 4) > MAX_HEAD_BYTES:
                self.send_400_response(f"request head over {MAX_HEAD_BYTES} bytes")
                return
        self._head_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()  # the head is in

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes:
            msg = ERRORS["header_timeout"].message.format(seconds=self.header_timeout_s)
            self.transport.write(_raw_error(408, "header_timeout", msg))
        self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._arm_send_timer()

    def resume_writing(self) -> None:
        self._disarm_send_timer()
        super().resume_writing()

    def _arm_send_timer(self) -> None:
        self._send_left = self.transport.get_write_buffer_size()
        self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_timed_out)

    def _disarm_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if self.transport.get_write_buffer_size() < self._send_left:  # it took some: a slow client, not a stuck one
            self._arm_send_timer()
            return
        # (a closing transport too: its close waits for a buffer this client will never take)
        type(self).num_send_timeouts += 1
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.scope[SEND_TIMED_OUT] = True  # type: ignore[literal-required]
        log.warning(
            "client %s took none of the answer for %g s: connection closed",
            _peer(self.client),
            self.send_timeout_s,
        )
        self.transport.abort()  # connection_lost follows: the app sees the client go away

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_send_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._disarm_head_timer()
        self.transport.write(_raw_error(400, "invalid_request", f"invalid HTTP request: {msg}"))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "(unknown)"


def guarded_protocol(
    header_timeout_s: float, max_connections: int, retry_after_s: int = 1, send_timeout_s: float = 60.0
) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the head deadline, the send deadline, the connection cap and
    JSON parser errors.

    Connections over the cap get their 503 while fewer than ``abort_above`` are open: twice the
    cap, or half way from the cap to the open-file limit if that is lower (the 503s must not use
    up the descriptors); beyond it they are closed at once."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    abort_above = 2 * max_connections
    if soft != resource.RLIM_INFINITY:
        abort_above = min(abort_above, max_connections + max(0, soft - max_connections) // 2)
    attrs = {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
             "retry_after_s": retry_after_s, "abort_above": abort_above,
             "send_timeout_s": send_timeout_s}  # fmt: skip
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), attrs)


class RateLimitedLog(logging.Filter):
    """Let each message template through at most ``burst`` times per ``period_s``; the first
    record after a period that dropped some says how many."""

    def __init__(self, burst: int = 5, period_s: float = 10.0) -> None:
        super().__init__()
        self.burst = burst
        self.period_s = period_s
        self._seen: dict[tuple[str, str], tuple[float, int, int]] = {}
        """(logger, template) -> (period start, records let through, records dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        start, passed, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.period_s:
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like it in the last {now - start:.0f} s not logged]"
            start, passed, dropped = now, 0, 0
        if passed >= self.burst:
            self._seen[key] = (start, passed, dropped + 1)
            return False
        self._seen[key] = (start, passed + 1, dropped)
        if len(self._seen) > 4096:
            self._seen.clear()
        return True


_FILTER = RateLimitedLog()


def install_log_limits() -> RateLimitedLog:
    """Rate-limit the records of the gateway's, uvicorn's and asyncio's loggers (idempotent)."""
    for name in _LOGGERS:
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)
    return _FILTER
