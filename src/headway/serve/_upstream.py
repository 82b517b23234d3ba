"""The gateway's client for its backends (POST to a backend), on aiohttp's keep-alive pool.

``http://`` and ``https://`` backends (TLS verified against the system's CA store, or a given
``ssl.SSLContext``); an ``api_key`` goes out as ``Authorization: Bearer <key>`` on every request.
The body goes out and comes back byte for byte: no compression is asked for and none undone.

What the exchange needs on top of aiohttp's client is kept here: its errors told apart (refused,
lost, stalled, broken: :class:`UpstreamError` and its subclasses), a deadline for the response
headers and another between body pieces, and one retry of a POST that met a kept-alive
connection the backend had just closed (aiohttp retries only idempotent methods; a request on a
fresh connection that is dropped is *lost*, never sent twice). Closing a response before its end
closes the connection: the backend sees the client go away (vLLM aborts the request).
``tests/serve/test_upstream.py`` pins that behaviour against a raw HTTP/1.1 server.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp

__all__ = [
    "UpstreamConnectError",
    "UpstreamConnectionLost",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_LOST = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)
"""A connection reset or broken while the request went out: the backend went away."""
_LOST_CAUSES = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
"""The same, where aiohttp wraps it without an errno: a request body written to a transport that the
backend's reset had closed after the headers were buffered is ``ClientOSError(None, "Can not write
request body ...")`` caused by ``ClientConnectionResetError("Cannot write to closing transport")``."""


def _lost(exc: aiohttp.ClientOSError) -> bool:
    """Whether an OS error before any response means the connection broke (the backend went away)."""
    return exc.errno in _LOST or isinstance(exc.__cause__, _LOST_CAUSES)


KEEPALIVE_S = 4.0
"""How long an idle connection is kept: below uvicorn's ``timeout_keep_alive`` (5 s, which
vLLM's and SGLang's servers keep), so the client rarely sends on a connection the server is
closing (:meth:`UpstreamPool.post` retries the rest)."""


class UpstreamError(Exception):
    """The backend broke the HTTP exchange (reset, malformed, timeout)."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (backend down)."""


class UpstreamConnectionLost(UpstreamError):
    """The connection was reset or closed before any response (the backend went away)."""


class UpstreamTimeout(UpstreamError):
    """No response headers in time (the backend accepted the request and stalled)."""


class UpstreamResponse:
    """Status and headers of a response whose body is read with :meth:`read` or :meth:`iter_chunks`."""

    __slots__ = ("_resp", "_timeout", "headers", "status_code")

    def __init__(self, resp: aiohttp.ClientResponse, read_timeout: float) -> None:
        self._resp: aiohttp.ClientResponse | None = resp
        self.status_code = resp.status
        self.headers: Mapping[str, str] = resp.headers  # case-insensitive
        self._timeout = read_timeout

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive; raises :class:`UpstreamError` if the body breaks off."""
        resp = self._resp
        if resp is None:
            return
        content = resp.content
        try:
            while True:
                async with asyncio.timeout(self._timeout):
                    data = await content.readany()
                if not data:
                    break
                yield data
        except TimeoutError:
            self.close()
            raise UpstreamTimeout(f"no data from the backend for {self._timeout:g} s") from None
        except aiohttp.ClientPayloadError:
            self.close()
            raise UpstreamError("connection closed before the end of the body") from None
        except (aiohttp.ClientError, OSError) as exc:
            self.close()
            raise UpstreamError(f"{type(exc).__name__} while reading the body") from None
        self._resp = None
        resp.release()  # read to its end: the connection goes back to the pool

    async def read(self) -> bytes:
        parts = [c async for c in self.iter_chunks()]
        return b"".join(parts)

    def close(self) -> None:
        """Stop reading; an unfinished body closes the connection."""
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()


async def _on_reuse(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
    ctx.trace_request_ctx.reused = True


class UpstreamPool:
    """Keep-alive connections to one backend (``http://host:port`` or ``https://host:port``)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 300.0,
        api_key: str = "",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the upstream client speaks http:// or https://, got {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._headers = {"Content-Type": "application/json", "Accept": "*/*"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        """The session, made at the first request (aiohttp binds it to the running loop)."""
        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(_on_reuse)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, ssl=self._ssl),
            headers=self._headers,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            trace_configs=[trace],
        )
        return self._session

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *, headers_timeout: float | None = None
    ) -> UpstreamResponse:
        """Send a JSON POST; returns once the status line and headers arrived.

        ``headers``: extra request headers (the load generator's keys, the gateway's
        ``X-Forwarded-For``); ``headers_timeout``: wait this long for the headers instead of the
        read timeout."""
        session = self._session or self._open()
        wait = self._read_timeout if headers_timeout is None else headers_timeout
        url = self._base + path
        while True:
            ctx = SimpleNamespace(reused=False)
            try:
                async with asyncio.timeout(wait):
                    resp = await session.post(url, data=body, headers=headers, trace_request_ctx=ctx)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # (a TimeoutError too)
                # (no address: the gateway's 502 quotes it, and clients are never told where its backends are)
                raise UpstreamConnectError(f"cannot connect ({type(exc).__name__})") from None
            except TimeoutError:  # before OSError, of which it is a subclass
                raise UpstreamTimeout(f"no response within {wait:g} s") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if ctx.reused:
                    continue  # the backend closed an idle connection: again, on the next one or a fresh one
                if isinstance(exc, aiohttp.ServerDisconnectedError) or _lost(exc):
                    raise UpstreamConnectionLost("connection closed before a response") from None
                raise UpstreamError(f"{type(exc).__name__} while waiting for the response") from None
            except aiohttp.ClientError as exc:
                raise UpstreamError(f"{type(exc).__name__} while waiting for the response") from None
            return UpstreamResponse(resp, self._read_timeout)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
