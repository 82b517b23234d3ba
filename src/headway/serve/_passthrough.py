"""Every other ``/v1`` endpoint, passed through to a backend unscheduled.

The gateway schedules generation (``/v1/completions``, ``/v1/chat/completions``); the rest of
the OpenAI-compatible surface a vLLM or SGLang server offers (``/v1/embeddings``,
``/v1/responses``, ``/v1/tokenize`` and ``/detokenize`` under ``/v1`` where the engine has them,
``/v1/audio/...``, ``/v1/score``, ...) is forwarded as it came: same method, path, query, body
and headers, except hop-by-hop headers and ``Authorization``, which becomes the backend's own
``api_key`` when one is set (and is left out otherwise: the gateway's API keys are not the
backend's). The answer, streamed or not, comes back as the backend gave it.

These requests are **unscheduled**: they do not wait in the policy's queue and do not count
against a backend's admission limits. Each goes to the reachable backend with the fewest
passed-through requests in flight (ties: the first configured); a backend that refuses the
connection is marked down for ``backend_down_s`` and the next one is tried. With API keys
required they need a valid key like any other endpoint.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse

from headway.serve._errors import api_error

__all__ = ["GATEWAY_PATHS", "HOP_BY_HOP", "Passthrough", "backend_headers"]

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

_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "authorization"}


def backend_headers(api_key: str) -> dict[str, str]:
    """The ``Authorization`` header a backend with this ``api_key`` expects ({} for none)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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
    ) -> None:
        self._backends = list(backends)
        self._client = client
        self._authorize = authorize
        self._down_s = backend_down_s
        self._max_body = max_body_bytes
        self.in_flight = [0] * len(self._backends)
        """Passed-through requests in flight per backend (separate from scheduled ones)."""

    def _order(self, now: float) -> list[int]:
        idx = range(len(self._backends))
        up = [i for i in idx if self._backends[i].down_until <= now]
        rest = [i for i in idx if i not in up]
        return sorted(up, key=lambda i: (not self._backends[i].reachable, self.in_flight[i], i)) + rest

    async def __call__(self, request: HTTPRequest) -> Response:
        path = request.url.path
        if path in GATEWAY_PATHS or path.startswith("/v1/requests/"):
            raise HTTPException(405)  # the gateway's own endpoint, with another method
        denied = await self._authorize(request)
        if denied is not None:
            return denied
        body = await request.body()
        if len(body) > self._max_body:
            return api_error("request_too_large", limit=self._max_body)
        client = self._client()
        if client is None:
            return api_error("upstream_error", detail="the gateway is not started yet")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED]
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
            return StreamingResponse(
                self._body(resp, i),
                status_code=resp.status_code,
                headers={k: v for k, v in resp.headers.items() if k.lower() not in _NOT_FORWARDED},
            )
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
