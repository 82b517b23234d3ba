"""Every other ``/v1`` endpoint, passed through to a backend unscheduled.

The gateway schedules generation (``/v1/completions``, ``/v1/chat/completions``); the rest of
the OpenAI-compatible surface a vLLM or SGLang server offers (``/v1/embeddings``,
``/v1/responses``, ``/v1/tokenize`` and ``/detokenize`` under ``/v1`` where the engine has them,
``/v1/audio/...``, ``/v1/score``, ...) is forwarded as it came: same method, path, query, body
and headers, except hop-by-hop headers (:data:`HOP_BY_HOP` and those its ``Connection`` header
names), the client's ``Forwarded``, ``X-Forwarded-*`` and ``X-Real-IP`` (the gateway sets
``X-Forwarded-For`` and ``X-Forwarded-Proto`` itself: :func:`forwarded_headers`) and
``Authorization``, which becomes the backend's own ``api_key`` when one is set (and is left out
otherwise: the gateway's API keys are not the backend's). The answer, streamed or not, comes back as
the backend gave it, except for its hop-by-hop headers, its ``Server`` and ``Date`` (the gateway's
own are sent, once) and a ``Location`` naming the backend, which is made relative (a redirect must
not tell the client where its backends are). ``passthrough`` (the gateway's setting) may limit the
paths that go, or turn them all off: any other is a 404.

Only paths under ``/v1`` go: one with a ``.``, ``..`` or empty segment (``/v1/../sleep``, also
percent-encoded) is a 404, never sent (an HTTP client resolves such a path, which would reach the
engine's other endpoints, ``/reset_prefix_cache``, ``/sleep``, ``/collective_rpc``, or its generation
endpoints unscheduled); the path goes out as the client spelled it. A body over ``max_body_bytes`` is
a 413 (at once for a ``Content-Length`` over it), one that has not arrived whole within
``body_timeout_s`` a 408, as for generation requests.

These requests are **unscheduled**: they do not wait in the policy's queue and do not count
against a backend's admission limits. Each goes to the reachable backend with the fewest
passed-through requests in flight (ties: the first configured); a backend that refuses the
connection is marked down for ``backend_down_s`` and the next one is tried. With API keys
required they need a valid key like any other endpoint.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse

from headway.serve._errors import api_error
from headway.serve._intake import Refused, check_length, read_body

__all__ = ["GATEWAY_PATHS", "HOP_BY_HOP", "Passthrough", "backend_headers", "forwarded_headers", "passed_through"]

HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that belong to one connection (RFC 9110 section 7.6.1) and are never forwarded."""

GATEWAY_PATHS: frozenset[str] = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models"})
"""Paths the gateway answers itself (with ``/v1/requests/{id}``): never passed through."""

_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "authorization", "forwarded", "x-real-ip"}
"""A client's headers left out (with every ``X-Forwarded-*``): the gateway sends its own, or none."""
_NOT_RETURNED = HOP_BY_HOP | {"content-length", "server", "date"}
"""A backend's headers left out of its answer: the gateway's server sends its own ``Server`` and ``Date``."""


def backend_headers(api_key: str) -> dict[str, str]:
    """The ``Authorization`` header a backend with this ``api_key`` expects ({} for none)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def forwarded_headers(request: HTTPRequest) -> dict[str, str]:
    """``X-Forwarded-For`` and ``X-Forwarded-Proto`` for a request forwarded to a backend: the client's
    address and scheme as the gateway's server sees them. That is the connection's peer, unless the
    peer is a proxy that ``forwarded_allow_ips`` trusts: uvicorn then reads the client from that
    proxy's own ``X-Forwarded-For`` and ``X-Forwarded-Proto``. A client's own are never sent on."""
    out = {"X-Forwarded-Proto": str(request.scope.get("scheme", "http"))}
    if request.client is not None and request.client.host:
        out["X-Forwarded-For"] = request.client.host
    return out


def end_to_end(items: Iterable[tuple[str, str]], drop: frozenset[str]) -> list[tuple[str, str]]:
    """``items`` less the headers named in ``drop`` (lower case) and those a ``Connection`` header
    names, which belong to that connection alone (RFC 9110 section 7.6.1)."""
    items = list(items)
    named = {t.strip().lower() for k, v in items if k.lower() == "connection" for t in v.split(",")}
    return [(k, v) for k, v in items if k.lower() not in drop and k.lower() not in named]


def passed_through(path: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``passthrough`` = ``allowed`` lets ``path`` go: ``("all",)``, ``("none",)``, or paths
    under ``/v1``, each allowing itself and every path under it (``/v1/files`` allows
    ``/v1/files/f1``, not ``/v1/filesystem``)."""
    if allowed == ("all",):
        return True
    return any(path == a or path.startswith(a + "/") for a in allowed if a != "none")


class Passthrough:
    """The ASGI endpoint of ``/v1/{path}``: forward to the least-busy reachable backend.

    ``backends``: the gateway's live :class:`~headway.serve._dispatch.Backend` objects (their
    ``config.url``, ``config.api_key``, ``down_until``, ``reachable``); ``client``: returns the
    gateway's httpx client (None before startup); ``authorize``: the request -> an error response
    (401, or 503 while keys cannot be looked up), or None to let it through."""

    def __init__(
        self,
        backends: Sequence[Any],
        *,
        client: Callable[[], httpx.AsyncClient | None],
        authorize: Callable[[HTTPRequest], Awaitable[Response | None]],
        backend_down_s: float,
        max_body_bytes: int,
        body_timeout_s: float = 30.0,
        allowed: tuple[str, ...] = ("all",),
    ) -> None:
        self._backends = list(backends)
        self._allowed = allowed
        self._client = client
        self._authorize = authorize
        self._down_s = backend_down_s
        self._max_body = max_body_bytes
        self._body_timeout_s = body_timeout_s
        self.in_flight = [0] * len(self._backends)
        """Passed-through requests in flight per backend (separate from scheduled ones)."""

    def _order(self, now: float) -> list[int]:
        idx = range(len(self._backends))
        up = [i for i in idx if self._backends[i].down_until <= now]
        rest = [i for i in idx if i not in up]
        return sorted(up, key=lambda i: (not self._backends[i].reachable, self.in_flight[i], i)) + rest

    async def __call__(self, request: HTTPRequest) -> Response:
        path = request.url.path  # percent-decoded
        if path in GATEWAY_PATHS or path.startswith("/v1/requests/"):
            raise HTTPException(405)  # the gateway's own endpoint, with another method
        *inner, last = path.split("/")[1:]  # (a trailing slash leaves the last one empty)
        if any(s in ("", ".", "..") for s in inner) or last in (".", "..") or path.rstrip("/") in GATEWAY_PATHS:
            raise HTTPException(404)  # never resolved: it would leave /v1, or reach the gateway's own endpoints
        if not passed_through(path, self._allowed):
            raise HTTPException(404)  # the operator's passthrough setting leaves it out
        denied = await self._authorize(request)
        if denied is not None:
            return denied
        try:  # (the limits of generation requests: 413 at once, 413, 408, 499)
            check_length(request, self._max_body)
            body = await read_body(request, self._max_body, self._body_timeout_s)
        except Refused as exc:
            return exc.response
        raw_path = request.scope.get("raw_path")
        path = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else quote(path)  # as the client spelled it
        client = self._client()
        if client is None:
            return api_error("upstream_error", detail="the gateway is not started yet")
        headers = [(k, v) for k, v in end_to_end(request.headers.items(), _NOT_FORWARDED)
                   if not k.lower().startswith("x-forwarded-")]  # fmt: skip
        headers += forwarded_headers(request).items()  # the client's address, not what it claims
        query = request.url.query
        last = "no backend"
        for i in self._order(time.monotonic()):
            b = self._backends[i]
            url = b.config.url + path + (f"?{query}" if query else "")
            out = client.build_request(
                request.method, url, headers=[*headers, *backend_headers(b.config.api_key).items()], content=body
            )
            self.in_flight[i] += 1
            try:
                resp = await client.send(out, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.in_flight[i] -= 1
                b.down_until = time.monotonic() + self._down_s
                b.reachable = False
                last = type(exc).__name__
                continue
            except httpx.HTTPError as exc:
                self.in_flight[i] -= 1
                return api_error("upstream_error", detail=f"the backend failed: {type(exc).__name__}")
            b.reachable = True
            answer = dict(end_to_end(resp.headers.items(), _NOT_RETURNED))
            if "location" in resp.headers:
                answer["location"] = _relative(resp.headers["location"], b.config.url)
            return StreamingResponse(self._body(resp, i), status_code=resp.status_code, headers=answer)
        return api_error("upstream_error", detail=f"no backend reachable ({last})")

    async def _body(self, resp: httpx.Response, i: int) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            return  # the backend broke off mid-body: the client sees the body end early
        finally:  # also when the client went away (the generator is closed)
            self.in_flight[i] -= 1
            await resp.aclose()


def _relative(location: str, backend_url: str) -> str:
    """A redirect's ``location`` without the backend's scheme and address, when it names them."""
    where = urlsplit(location)
    if where.netloc and where.netloc.lower() == urlsplit(backend_url).netloc.lower():
        return where.path + (f"?{where.query}" if where.query else "")
    return location
