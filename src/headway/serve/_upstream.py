"""A small keep-alive HTTP/1.1 client for the gateway's hot path (POST to a backend).

``http://`` and ``https://`` backends (TLS verified against the system's CA store, or a given
``ssl.SSLContext``); an ``api_key`` goes out as ``Authorization: Bearer <key>`` on every request.

httpx/httpcore spend milliseconds of CPU per request in their connection pool under
concurrency (the pool re-scans every connection for every request), which alone capped
the gateway's request rate on 2 cores. This client keeps a LIFO stack of
idle connections per backend and parses only what a JSON/SSE response needs
(status, Content-Length or chunked encoding with any trailer fields, Connection: close),
passing over interim answers (100 Continue, 103 Early Hints) and reading no body after a
204 or 304. (aiohttp's client would do all of this, at a higher CPU cost per streamed event
and per answer: ``tests/serve/test_upstream.py`` pins the behaviour a replacement must keep.)

Closing a response before its end closes the connection: the backend sees the client
go away (vLLM aborts the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

__all__ = [
    "UpstreamConnectError",
    "UpstreamConnectionLost",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
]


class UpstreamError(Exception):
    """The backend broke the HTTP exchange (reset, malformed, timeout)."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (backend down)."""


class UpstreamConnectionLost(UpstreamError):
    """The connection was reset or closed before any response (the backend went away)."""


class UpstreamTimeout(UpstreamError):
    """No response headers in time (the backend accepted the request and stalled)."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class UpstreamResponse:
    """Status and headers of a response whose body is read with :meth:`read` or :meth:`iter_chunks`."""

    def __init__(
        self,
        pool: UpstreamPool,
        conn: _Conn,
        status: int,
        headers: dict[str, str],
        read_timeout: float,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status_code = status
        self.headers = headers
        self._timeout = read_timeout
        te = headers.get("transfer-encoding", "").lower()
        cl = headers.get("content-length")
        self._length = int(cl) if cl is not None and cl.isdigit() else None
        if status in (204, 304):  # no body, whatever the headers say (RFC 9112 6.3)
            te, self._length = "", 0
        self._chunked = "chunked" in te
        self._keep = headers.get("connection", "").lower() != "close" and (self._chunked or self._length is not None)
        self._done = False

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive; raises :class:`UpstreamError` if the body breaks off."""
        conn = self._conn
        if conn is None or self._done:
            return
        reader = conn.reader
        try:
            if self._chunked:
                while True:
                    async with asyncio.timeout(self._timeout):
                        line = await reader.readuntil(b"\r\n")
                        size = int(line.split(b";", 1)[0], 16)
                        if size == 0:
                            while await reader.readuntil(b"\r\n") != b"\r\n":
                                pass  # trailer fields, up to the empty line that ends the message
                            break
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._length is not None:
                remaining = self._length
                while remaining > 0:
                    async with asyncio.timeout(self._timeout):
                        data = await reader.read(min(remaining, 65536))
                    if not data:
                        self.close()
                        raise UpstreamError("connection closed before the end of the body")
                    remaining -= len(data)
                    yield data
            else:
                while True:
                    async with asyncio.timeout(self._timeout):
                        data = await reader.read(65536)
                    if not data:
                        break
                    yield data
        except TimeoutError:  # before OSError, of which it is a subclass
            self.close()
            raise UpstreamTimeout(f"no data from the backend for {self._timeout:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise UpstreamError(f"{type(exc).__name__} while reading the body") from None
        self._done = True
        self._release()

    async def read(self) -> bytes:
        parts = [c async for c in self.iter_chunks()]
        return b"".join(parts)

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep and self._done:
            self._pool._put(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Stop reading; an unfinished body closes the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._done and self._keep:
                self._pool._put(conn)
            else:
                conn.close()


class UpstreamPool:
    """Keep-alive connections to one backend (``http://host:port`` or ``https://host:port``)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 300.0,
        max_idle: int = 512,
        api_key: str = "",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the upstream client speaks http:// or https://, got {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc.encode()
        self._ssl: ssl.SSLContext | None = None
        if self.tls:
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._auth = b"Authorization: Bearer " + api_key.encode("latin-1") + b"\r\n" if api_key else b""
        self._idle: list[_Conn] = []
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle

    def _put(self, conn: _Conn) -> None:
        if len(self._idle) < self._max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, limit=1 << 20, ssl=self._ssl, server_hostname=self.host if self._ssl else None
                )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}") from None
        return _Conn(reader, writer)

    async def post(
        self, path: str, body: bytes, headers: bytes = b"", *, headers_timeout: float | None = None
    ) -> UpstreamResponse:
        """Send a JSON POST; returns once the status line and headers arrived.

        ``headers``: extra header lines, each ending in CRLF (the load generator's keys);
        ``headers_timeout``: wait this long for the headers instead of the read timeout."""
        head = (
            b"POST " + (self.prefix + path).encode() + b" HTTP/1.1\r\nHost: " + self._host_header
            + b"\r\nContent-Type: application/json\r\nAccept: */*\r\n" + self._auth + headers + b"Content-Length: "
            + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.close()
                continue
            try:
                return await self._exchange(conn, head, body, headers_timeout)
            except _StaleConnection:
                continue  # the backend closed an idle connection: retry on another
        return await self._exchange(await self._connect(), head, body, headers_timeout, fresh=True)

    async def _exchange(
        self, conn: _Conn, head: bytes, body: bytes, headers_timeout: float | None, fresh: bool = False
    ) -> UpstreamResponse:
        wait = self._read_timeout if headers_timeout is None else headers_timeout
        try:
            conn.writer.write(head + body)
            async with asyncio.timeout(wait):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                while raw.startswith(b"HTTP/1.1 1") and not raw.startswith(b"HTTP/1.1 101"):  # 100, 103: interim
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            conn.close()
            if not fresh and not exc.partial:
                raise _StaleConnection from None
            raise UpstreamConnectionLost("connection closed before a response") from None
        except TimeoutError:  # before OSError, of which it is a subclass
            conn.close()
            raise UpstreamTimeout(f"no response within {wait:g} s") from None
        except (OSError, asyncio.LimitOverrunError) as exc:
            conn.close()
            if not fresh and isinstance(exc, ConnectionResetError | BrokenPipeError):
                raise _StaleConnection from None
            if isinstance(exc, ConnectionError):
                raise UpstreamConnectionLost(f"{type(exc).__name__} while waiting for the response") from None
            raise UpstreamError(f"{type(exc).__name__} while waiting for the response") from None
        except asyncio.CancelledError:
            conn.close()
            raise
        lines = raw[:-4].split(b"\r\n")
        try:
            status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            conn.close()
            raise UpstreamError(f"malformed status line {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        return UpstreamResponse(self, conn, status, headers, self._read_timeout)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class _StaleConnection(Exception):
    pass
