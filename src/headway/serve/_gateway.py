"""The gateway app: OpenAI-compatible endpoints in front of a policy-ordered queue.

Life of a request: a 413 at once for a ``Content-Length`` over ``max_body_bytes``;
authenticate (401, before any byte of the body is read; 503
``auth_unavailable`` while a key kept in Redis cannot be looked up), read the body (413 over
the limit, 408 after ``body_timeout_s``), validate (400 naming the field), admit it (429 when the
queue is full, before any scoring), score it if a scorer is configured (a bounded prefix of the
prompt; a request that cannot be scored gets the fallback score, :mod:`._arrivals`),
queue it, wait for the dispatcher to hand it a backend (408 once the queue TTL, counted from
arrival, is over; removed on client
disconnect), forward it (retry on another backend while nothing was streamed), pass
the response through (SSE event by event) and report progress and the final
``usage.completion_tokens`` to the policy.

The fast path (``scorer_fast_path``, on by default, in-memory mode): with a scorer, a request that
competes with no other for a backend slot is not queued and not waited for: when it has been
admitted, nothing is queued and the backends have more free slots
(:meth:`Dispatcher.free_slots`) than the requests being scored before they are queued plus those
admitted in the same turn of the event loop (counted while the request yields once), it is
dispatched at once (:meth:`Dispatcher.dispatch_unscored`) and scored in the background; the
policy hears of its arrival, progress and finish, in that order, once its score is known, and a
retry waits for the score before queueing it again (:mod:`._arrivals`). Whenever requests
compete, each waits for its score and the policy orders them as without the fast path.

Every request ends in exactly one terminal
answer, counted once in ``headway_requests_finished`` or ``headway_rejections{reason}``.

Backend failures: a backend that refuses the connection is marked down for
``backend_down_s`` and unreachable, and the request goes back to the queue (same policy
position) to wait for it or another backend (counted in ``headway_retries``); nothing had
reached the client. Waiting is bounded by the queue TTL only, so that a backend restarting in
a few seconds loses no request; when the TTL runs out while no backend is reachable (each
one's last connection attempt failed), the answer is a 503 ``no_backend`` rather than the 408,
and ``/health`` says ``degraded`` (503) meanwhile. A backend that took the request and then
dropped the connection, or ended its stream, before answering anything is marked down too and
the request waits in the queue again, but that counts as an attempt: a request that crashes
every backend it meets ends after ``max_attempts`` with a 502. A 5xx, a broken exchange or a
stream whose response headers, or whose first event after them, do not come within
``headers_timeout_s`` (a stalled backend, then also skipped for ``backend_down_s``) is retried
on another backend (``max_attempts``), then 502. A stream's 200 goes to the client with its
first event, so everything before it can still be retried. A backend failing mid-stream ends
the stream with an error event and ``[DONE]``; mid-body of a non-streamed response, a 502.
Client-visible messages never name a backend or the Redis address (the log does).

Shutdown: on SIGTERM the gateway drains (new requests 503 ``draining``); when
``drain_timeout_s`` is over, every request still open ends at once: a 503 ``drain_timeout``
with Retry-After, or, mid-stream, a final error event and ``[DONE]``.

Unchecked fields go to the backend as they came: an unknown ``model`` gets the backend's
answer (vLLM's 404 ``NotFoundError``, passed through). ``n`` is checked (1 to ``MAX_N``): the
queue counts a request once, whatever its number of completions.

Errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` with ``code``
always a string; a 4xx of a backend is passed through as it is.

Other endpoints: ``GET``/``DELETE /v1/requests/{id}`` (status / cancel one of the caller's own
requests, on any replica: one held by another replica is asked through Redis, :mod:`._peers`;
another tenant's request is a 404, like a missing one), ``/metrics`` (everything with API keys
off or for an admin key; a tenant key sees only series labelled with its tenant, which today is
``headway_queue_length`` alone; no key: 401), ``/health`` and ``/openapi.json``. A 401 on these
endpoints is not counted in ``headway_rejections``, which counts generation requests only (so
that ``headway_requests_finished`` + ``headway_rejections`` = generation requests answered).
Every other ``/v1`` path (embeddings, responses, tokenize, ...) is passed through to a backend
unscheduled (``headway.serve._passthrough``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from headway.core import Policy, Request, RequestState, make_policy
from headway.predict.score import scoring_text
from headway.routers import make_router
from headway.serve._arrivals import Arrivals
from headway.serve._backend_load import parse_backend_load
from headway.serve._config import GatewayConfig, hash_api_key
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError
from headway.serve._errors import ERRORS, api_error, error_response, sse_error
from headway.serve._logging import LimitedWarnings
from headway.serve._metrics import GatewayMetrics
from headway.serve._openapi import openapi_schema
from headway.serve._passthrough import Passthrough, backend_headers
from headway.serve._peers import PeerChannel, PeerUnavailable, owner_of
from headway.serve._prefix_hash import HASH_BLOCK_TOKENS, prefix_block_hashes
from headway.serve._redis_queue import RedisDispatcher
from headway.serve._scorer import BatchScorer, OnlineScoring
from headway.serve._tenants import DirectoryUnavailable, Identity, TenantDirectory
from headway.serve._upstream import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
)
from headway.serve._wire import (
    BadRequest,
    NonFinite,
    Parsed,
    completion_tokens,
    loads_json,
    nonfinite_field,
    sse_data,
    sse_newlines,
    validate_body,
)

__all__ = ["Gateway", "create_app"]

log = logging.getLogger("headway.serve")

SCORED_TOKENS_DEFAULT = 512
"""Tokens' worth of a prompt kept for scoring without ``scorer_max_length``: the longest input
of the BERT-family encoders the predictors use; a scorer keeps fewer if its checkpoint's
length is shorter."""


_STOP_EVENTS: dict[str, bytes] = {
    "cancelled": sse_error("the request was cancelled", "cancelled", "cancelled"),
    "shutdown": sse_error(
        "the gateway shut down before the stream ended (drain timeout); retry later",
        "service_unavailable",
        "drain_timeout",
    ),
}
"""Why a stream was stopped (:class:`_Watch`) -> its final error event and ``[DONE]``."""
_STOP_REASONS = {"cancelled": "cancelled", "shutdown": "drain_timeout", "disconnected": "client_disconnected"}
"""Why a request was stopped -> its ``headway_rejections`` reason."""


async def _chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``head``, then what ``rest`` yields (a stream whose first piece was read already)."""
    yield head
    async for chunk in rest:
        yield chunk


def _either(a: asyncio.Future[Any], b: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    return {a, b}


class _Watch:
    """Why a request should stop early: its client disconnected (``"disconnected"``), it was
    cancelled by API (``"cancelled"``) or the drain timeout ran out (``"shutdown"``)."""

    __slots__ = ("stop", "task", "upstream")

    def __init__(self, task: asyncio.Future[None]) -> None:
        self.task = task
        self.stop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.upstream: UpstreamResponse | None = None
        """The backend's response being streamed, closed by :meth:`end` to wake the relay."""
        task.add_done_callback(self._on_disconnect)

    def _on_disconnect(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if not self.stop.done():
            self.stop.set_result("disconnected")

    def end(self, reason: str) -> None:
        if not self.stop.done():
            self.stop.set_result(reason)
            if self.upstream is not None:
                self.upstream.close()  # a relay waiting for the backend's next event ends now

    @property
    def reason(self) -> str | None:
        return self.stop.result() if self.stop.done() else None

    def close(self) -> None:
        self.task.cancel()


@dataclass(slots=True)
class _Active:
    req: Request
    watch: _Watch


class Gateway:
    """State of one gateway app (policy, queue, backends, HTTP client, metrics)."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        policy: Policy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        redis: Any = None,
    ) -> None:
        self.config = config
        self.policy = policy if policy is not None else make_policy(config.policy, **dict(config.policy_args))
        self.backends = [Backend(b, i) for i, b in enumerate(config.backends)]
        self._redis = redis
        self.dispatcher: Dispatcher
        self.peers: PeerChannel | None = None
        """With Redis: status and cancel of requests other replicas hold (:mod:`._peers`)."""
        if config.redis_url:
            listener: Any = None
            if self._redis is None:
                import redis.asyncio as aioredis

                # a bounded pool that waits for a free connection (the default one raises
                # "Too many connections" under load), and a connection of its own for the
                # blocking grant listener so that it is never starved
                pool = aioredis.BlockingConnectionPool.from_url(
                    config.redis_url, max_connections=64, timeout=config.redis_retry_s + 1
                )
                self._redis = aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes it
                listener = aioredis.from_url(config.redis_url, max_connections=4)
            self._listen_redis = listener
            self.dispatcher = RedisDispatcher(
                self.policy,
                self.backends,
                self._redis,
                max_queue_len=config.max_queue_len,
                max_queue_per_tenant=config.max_queue_per_tenant,
                prefix=config.redis_prefix,
                on_dispatch=self._on_dispatch,
                lease_s=config.redis_lease_s,
                retry_s=config.redis_retry_s,
                listen_redis=listener,
                score_hold_s=config.scorer_hold_s if config.scorer else 0.0,
            )
            self._id_prefix = f"hw-{self.dispatcher.replica}-"
            self.peers = PeerChannel(
                self._redis, self.dispatcher.listen_redis, config.redis_prefix, self.dispatcher.replica, self._on_peer
            )
        else:
            self.dispatcher = Dispatcher(
                self.policy,
                self.backends,
                max_queue_len=config.max_queue_len,
                max_queue_per_tenant=config.max_queue_per_tenant,
                on_dispatch=self._on_dispatch,
                router=make_router(config.router, **dict(config.router_args)),
                score_hold_s=config.scorer_hold_s if config.scorer else 0.0,
            )
            self._id_prefix = "hw-"
        # prompt-text prefix hashes only for a router that reads them (--router prefix-aware)
        self._hash_prefixes = self.dispatcher.router.uses_block_hashes
        self._admin_keys = frozenset(config.admin_api_key_sha256)
        self.active: dict[str, _Active] = {}
        """Requests being served (queued, running or streaming), by id."""
        self.recent: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Recently ended requests: id -> (tenant, final status), bounded."""
        self.metrics = GatewayMetrics(self._queue_lengths, self._in_flight)
        self._transport = transport
        self.tenants = TenantDirectory(config, self._redis)
        self._log_limited = LimitedWarnings(log)
        self.arrivals = Arrivals(config, self.dispatcher, self.policy, self.metrics, self._log_limited)
        """Scoring (with a scorer), the fallback score and the fast path (:mod:`._arrivals`)."""
        self.client: httpx.AsyncClient | None = None
        """For /metrics polls and /v1/models; requests go through :attr:`pools`."""
        self.pools = [
            UpstreamPool(
                b.url, connect_timeout=config.connect_timeout_s, read_timeout=config.read_timeout_s, api_key=b.api_key
            )
            for b in config.backends
        ]
        self._passthrough = Passthrough(
            self.backends,
            client=lambda: self.client,
            authorize=self._authorize_other,
            backend_down_s=config.backend_down_s,
            max_body_bytes=config.max_body_bytes,
        )
        self.draining = False
        self.drain_expired = False
        """The drain timeout ran out: requests still open are ended (see :meth:`end_drain`)."""
        limit = config.max_tokens_limit
        self._default_max_tokens = min(config.default_max_tokens, limit or config.default_max_tokens)
        """Added to a request without ``max_tokens`` (0: nothing added, the request goes as sent)."""
        self._assumed_max_tokens = self._default_max_tokens or min(
            config.assumed_output_tokens, limit or config.assumed_output_tokens
        )
        """The queued length of a request without ``max_tokens`` (a scheduling estimate)."""
        self._pollers: list[asyncio.Task[None]] = []
        self._models_cache: tuple[float, bytes] | None = None
        self.finished_requests: list[Request] = []
        """Most recent finished/aborted requests (bounded), for tests and debugging."""
        self._scored_tokens = config.scorer_max_length or SCORED_TOKENS_DEFAULT
        """The scorer reads at most this many tokens' worth of a prompt (see ``scoring_text``): a
        request keeps that prefix only, whatever the prompt's size."""

    @property
    def scorer(self) -> BatchScorer | None:
        return self.arrivals.scorer

    @property
    def online(self) -> OnlineScoring | None:
        return self.arrivals.online

    @property
    def num_score_fallbacks(self) -> int:
        """Requests given the fallback score (:mod:`._arrivals`)."""
        return self.arrivals.num_score_fallbacks

    # -------------------------------------------------------------- lifecycle
    async def startup(self) -> None:
        limit = sum(b.max_concurrency or 256 for b in self.config.backends) + 64
        self.client = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(self.config.read_timeout_s, connect=self.config.connect_timeout_s),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
        )
        if isinstance(self.dispatcher, RedisDispatcher):
            await self.dispatcher.start()
            if self.peers is not None:
                self.peers.start()
        for b in self.backends:
            if b.config.metrics_poll_s > 0:
                self._pollers.append(asyncio.create_task(self._poll_backend(b)))

    def end_drain(self) -> None:
        """The drain timeout is over: end every request still open now (a 503, or mid-stream a
        final error event), so that none is cut by the server's own shutdown (a bare 500 or a
        broken stream)."""
        self.drain_expired = True
        for entry in list(self.active.values()):
            entry.watch.end("shutdown")

    async def shutdown(self) -> None:
        self.draining = True
        for t in self._pollers:
            t.cancel()
        for t in self._pollers:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.dispatcher.fail_all(RuntimeError("gateway shutting down"))
        if isinstance(self.dispatcher, RedisDispatcher):
            if self.peers is not None:
                await self.peers.stop()
            await self.dispatcher.stop()
        if self.client is not None:
            await self.client.aclose()
        for pool in self.pools:
            pool.close()
        await self.arrivals.close()
        for client in (self._redis, getattr(self, "_listen_redis", None)):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    # ---------------------------------------------------------------- metrics
    def _queue_lengths(self) -> list[tuple[str, str, int]]:
        return [(t, tier, n) for (t, tier), n in self.dispatcher.queued_per_tenant.items()]

    def _in_flight(self) -> list[tuple[str, int]]:
        return [(b.url, b.in_flight) for b in self.backends]

    def _on_dispatch(self, req: Request, backend: Backend) -> None:
        self.metrics.dispatches.labels(backend.url).inc()
        if req.first_scheduled_time is not None and req.num_preemptions == 0:
            self.metrics.wait_time.labels(req.tenant_id, req.tier.name.lower()).observe(
                req.first_scheduled_time - req.arrival_time
            )

    async def _poll_backend(self, b: Backend) -> None:
        """Read the backend's waiting count and KV usage (vLLM's or SGLang's gauges) periodically."""
        assert self.client is not None
        while True:
            try:
                r = await self.client.get(b.url + "/metrics", timeout=2.0, headers=backend_headers(b.config.api_key))
                r.raise_for_status()
                load = parse_backend_load(r.text)
                b.polled_waiting, b.polled_kv_usage = load.waiting, load.kv_usage
                b.dispatched_since_poll = b.finished_since_poll = 0
                b.last_poll_ok = b.reachable = True
            except (httpx.HTTPError, ValueError) as exc:
                if b.last_poll_ok:
                    log.warning("backend %s: cannot read its /metrics (%s)", b.url, exc)
                b.last_poll_ok = False
            self.dispatcher.dispatch()
            await asyncio.sleep(b.config.metrics_poll_s)

    # -------------------------------------------------------------- handlers
    async def health(self, request: HTTPRequest) -> Response:
        """200 ``ok``; 503 ``draining``, or ``degraded`` while no backend is reachable or the
        Redis queue cannot be reached (route traffic elsewhere: requests wait in the queue, up
        to the queue TTL, for a backend or for Redis to come back).

        The body also counts the requests ``queued`` (with Redis: this replica's), except with
        API keys on for a caller without the admin key: load balancers probe without keys, and
        the count would tell anyone how much the tenants send."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        body: dict[str, Any] = {"status": "ok"}
        if not self._any_reachable():
            body = {"status": "degraded", "reason": "no backend reachable"}
        elif isinstance(self.dispatcher, RedisDispatcher) and not self.dispatcher.redis_reachable:
            body = {"status": "degraded", "reason": "queue store unreachable"}
        if not self.tenants.enabled or self._is_admin(request):
            body["queued"] = len(self.dispatcher.queue)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    def _is_admin(self, request: HTTPRequest) -> bool:
        token = self.tenants.bearer(request.headers.get("authorization"))
        return token is not None and hash_api_key(token) in self._admin_keys

    def _any_reachable(self) -> bool:
        return any(b.reachable for b in self.backends)

    async def prom(self, request: HTTPRequest) -> Response:
        """All series with API keys off or for an admin key; a tenant's key sees its own only."""
        tenant: str | None = None
        if self.tenants.enabled and not self._is_admin(request):
            ident = await self._identify(request, count=False)
            if isinstance(ident, Response):
                return ident
            tenant = ident.tenant
        return Response(self.metrics.render(tenant), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: HTTPRequest) -> Response:
        return JSONResponse(openapi_schema(self.config))

    # ---------------------------------------------------------- request status
    def _remember(self, req: Request, watch: _Watch) -> None:
        status = "cancelled" if watch.reason == "cancelled" else req.state.name.lower()
        self.recent[req.request_id] = (req.tenant_id, status)
        if len(self.recent) > 10_000:
            self.recent.popitem(last=False)

    def _ended(self, req: Request, watch: _Watch) -> None:
        if self.active.pop(req.request_id, None) is not None:
            self._remember(req, watch)

    @staticmethod
    def _status_of(req: Request) -> str:
        if req.state in (RequestState.WAITING, RequestState.PREEMPTED):
            return "queued"
        return req.state.name.lower()

    def _not_found(self, request_id: str) -> Response:
        # the same answer for "no such request" and "another tenant's request"
        return api_error("request_not_found", request_id=request_id)

    def _lookup(self, op: str, rid: str, tenant: str) -> dict[str, Any]:
        """Status (``op`` ``"status"``) or cancel (``"cancel"``) of request ``rid`` of ``tenant``
        on this replica: ``{"status": ...}``, ``{"cancelled": True}``, ``{"ended": status}`` or
        ``{"missing": True}`` (none, or another tenant's)."""
        entry = self.active.get(rid)
        if entry is not None and entry.req.tenant_id == tenant:
            if op == "cancel":
                entry.watch.end("cancelled")
                return {"cancelled": True}
            return {"status": self._status_of(entry.req)}
        done = self.recent.get(rid)
        if done is not None and done[0] == tenant:
            return {"ended": done[1]} if op == "cancel" else {"status": done[1]}
        return {"missing": True}

    async def _on_peer(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._lookup(str(message.get("op")), str(message.get("id")), str(message.get("tenant")))

    async def _request_op(self, request: HTTPRequest, op: str) -> Response:
        """``GET``/``DELETE /v1/requests/{id}``: answered here, or by the replica that holds the
        request (named in its id) through Redis."""
        ident = await self._identify(request, count=False)
        if isinstance(ident, Response):
            return ident
        rid = request.path_params["request_id"]
        found = self._lookup(op, rid, ident.tenant)
        owner = owner_of(rid)
        if "missing" in found and self.peers is not None and owner is not None and owner != self.peers.replica:
            try:
                found = await self.peers.ask(owner, {"op": op, "id": rid, "tenant": ident.tenant}) or found
            except PeerUnavailable as exc:
                self._log_limited("peer", "%s: answered 503", exc)
                return api_error("queue_error", headers={"Retry-After": str(self.config.retry_after_s)})
        if "status" in found:
            return JSONResponse({"id": rid, "object": "request", "status": found["status"]})
        if "cancelled" in found:
            return JSONResponse({"id": rid, "object": "request", "cancelled": True})
        if "ended" in found:
            return api_error("request_ended", request_id=rid, status=found["ended"])
        return self._not_found(rid)

    async def request_status(self, request: HTTPRequest) -> Response:
        return await self._request_op(request, "status")

    async def request_cancel(self, request: HTTPRequest) -> Response:
        return await self._request_op(request, "cancel")

    async def models(self, request: HTTPRequest) -> Response:
        ident = await self._identify(request, count=False)
        if isinstance(ident, Response):
            return ident
        loop = asyncio.get_running_loop()
        if self._models_cache is not None and self._models_cache[0] > loop.time():
            return Response(self._models_cache[1], media_type="application/json")
        assert self.client is not None
        last = "no backend answered"
        for b in self.backends:
            try:
                r = await self.client.get(b.url + "/v1/models", timeout=5.0, headers=backend_headers(b.config.api_key))
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
                continue
            if r.status_code == 200:
                self._models_cache = (loop.time() + 5.0, r.content)
                return Response(r.content, media_type="application/json")
            last = f"HTTP {r.status_code}"
        return api_error("upstream_error", detail=f"no backend listed models ({last})")

    async def passthrough(self, request: HTTPRequest) -> Response:
        """Any other ``/v1`` endpoint: forwarded unscheduled (``headway.serve._passthrough``)."""
        return await self._passthrough(request)

    async def _authorize_other(self, request: HTTPRequest) -> Response | None:
        ident = await self._identify(request, count=False)
        return ident if isinstance(ident, Response) else None

    async def _identify(self, request: HTTPRequest, count: bool = True) -> Identity | Response:
        """The caller's identity, or the answer: 401, or 503 ``auth_unavailable`` with
        Retry-After while a key not in the config cannot be looked up in Redis. ``count``: a
        generation request, counted in ``headway_rejections``."""
        try:
            ident = await self.tenants.resolve(request.headers.get("authorization"))
        except DirectoryUnavailable as exc:
            self._log_limited("auth", "%s: answered 503", exc)
            resp = api_error("auth_unavailable", headers={"Retry-After": str(self.config.retry_after_s)})
            return self._reject("auth_unavailable", resp) if count else resp
        return self._unauthorized(count) if ident is None else ident

    def _unauthorized(self, count: bool = True) -> Response:
        """401; ``count``: a generation request, counted in ``headway_rejections``."""
        if count:
            self.metrics.rejections.labels("unauthorized").inc()
        return api_error("invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def _reject(self, reason: str, resp: Response) -> Response:
        self.metrics.rejections.labels(reason).inc()
        return resp

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._handle(request, "/v1/completions", chat=False)

    async def chat_completions(self, request: HTTPRequest) -> Response:
        return await self._handle(request, "/v1/chat/completions", chat=True)

    async def _read_body(self, request: HTTPRequest) -> bytes | None:
        """The body; None over ``max_body_bytes``; TimeoutError after ``body_timeout_s``."""
        limit = self.config.max_body_bytes
        buf = bytearray()
        async with asyncio.timeout(self.config.body_timeout_s):
            async for chunk in request.stream():
                buf += chunk
                if len(buf) > limit:
                    return None
        return bytes(buf)

    async def _handle(self, request: HTTPRequest, path: str, chat: bool) -> Response:
        if self.draining:
            return self._reject(
                "draining",
                api_error("draining", headers={"Connection": "close", "Retry-After": str(self.config.retry_after_s)}),
            )
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > self.config.max_body_bytes:  # before any work
            return self._reject("too_large", api_error("request_too_large", limit=self.config.max_body_bytes))
        ident = await self._identify(request)  # before the body: no key, no reading
        if isinstance(ident, Response):
            return ident
        try:
            raw = await self._read_body(request)
        except TimeoutError:
            return self._reject(
                "body_timeout",
                api_error("body_timeout", headers={"Connection": "close"}, seconds=self.config.body_timeout_s),
            )
        if raw is None:
            return self._reject(
                "too_large",
                api_error("request_too_large", limit=self.config.max_body_bytes),
            )
        try:
            body = loads_json(raw)
        except NonFinite as exc:
            where = nonfinite_field(raw)
            what = f"'{where}'" if where else "a number in the request body"
            return self._reject(
                "invalid",
                api_error("invalid_value", param=where, detail=f"{what} must be a finite number, got {exc}"),
            )
        except ValueError as exc:
            return self._reject(
                "invalid",
                api_error("invalid_json", detail=f"request body is not valid JSON: {exc}"),
            )
        except RecursionError:
            return self._reject(
                "invalid",
                api_error("invalid_json", detail="request body is nested too deeply"),
            )
        try:
            parsed = validate_body(body, chat)
        except BadRequest as exc:
            return self._reject("invalid", api_error("invalid_value", param=exc.param, detail=exc))
        limit = self.config.max_tokens_limit
        if limit and parsed.max_tokens is not None and parsed.max_tokens > limit:
            name = parsed.max_tokens_field
            return self._reject(
                "invalid",
                api_error(
                    "invalid_value", param=name, detail=f"'{name}' must be at most {limit}, got {parsed.max_tokens}"
                ),
            )
        return await self._serve(request, path, body, raw, parsed, ident)

    def _new_id(self) -> str:
        """A random id (``hw-`` and 16 hex digits, after the replica's name with Redis): a
        sequential one would tell each tenant how much traffic the others send."""
        while True:
            rid = f"{self._id_prefix}{secrets.token_hex(8)}"
            if rid not in self.active and rid not in self.recent:
                return rid

    def _new_request(self, parsed: Parsed, ident: Identity) -> Request:
        return Request(
            request_id=self._new_id(),
            arrival_time=self.dispatcher.now(),
            num_prompt_tokens=parsed.num_prompt_tokens,
            max_tokens=parsed.max_tokens or self._assumed_max_tokens,
            tenant_id=ident.tenant,
            tier=ident.tier,
            priority=parsed.priority,
            prompt=scoring_text(parsed.prompt_text, self._scored_tokens) or None,
            block_hashes=prefix_block_hashes(parsed.prompt_text) if self._hash_prefixes else (),
            hash_block_size=HASH_BLOCK_TOKENS,
        )

    def _record(self, req: Request) -> None:
        req.prompt = None  # the scored prefix is not needed any more: kept, 4096 of them would weigh
        req.block_hashes = ()  # likewise the prefix hashes (the router read them when it chose)
        self.finished_requests.append(req)
        if len(self.finished_requests) > 4096:
            del self.finished_requests[:2048]

    def _abort(self, req: Request) -> None:
        if not req.is_finished:
            req.transition(RequestState.ABORTED)
            req.finish_time = self.dispatcher.now()
            self._record(req)

    async def _serve(
        self,
        request: HTTPRequest,
        path: str,
        body: dict[str, Any],
        raw: bytes,
        parsed: Parsed,
        ident: Identity,
    ) -> Response:
        arrived = asyncio.get_running_loop().time()  # the queue TTL counts from here, scoring included
        req = self._new_request(parsed, ident)
        model = body.get("model")
        req.extra["model"] = model if isinstance(model, str) else ""
        req.extra["stream"] = parsed.stream
        try:
            self.dispatcher.admit(req)  # a full queue answers 429 now, not after scoring
        except QueueFullError as exc:
            self._abort(req)
            return self._queue_full(exc)
        backend = await self.arrivals.arrive(req)  # scored, or dispatched at once (fast path)
        # the request goes as the client sent it, unless a documented option adds a field
        payload = raw
        if parsed.stream and not parsed.wants_usage and self.config.add_stream_usage:
            body = dict(body)
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts
            payload = json.dumps(body).encode()
        if parsed.max_tokens is None and self._default_max_tokens:
            # make the queued length and the upstream cap agree
            if payload is raw:
                body = dict(body)
            body["max_tokens"] = req.max_tokens
            payload = json.dumps(body).encode()

        watch = _Watch(asyncio.ensure_future(self._wait_disconnect(request)))
        self.active[req.request_id] = _Active(req, watch)
        if self.drain_expired:
            watch.end("shutdown")
        streaming = False
        try:
            resp = await self._serve_watched(request, req, path, payload, parsed, watch, arrived, backend)
            streaming = isinstance(resp, StreamingResponse)
            return resp
        finally:
            if not streaming:  # a stream ends in _relay
                self._ended(req, watch)

    async def _serve_watched(
        self,
        request: HTTPRequest,
        req: Request,
        path: str,
        payload: bytes,
        parsed: Parsed,
        watch: _Watch,
        arrived: float,
        granted: Backend | None = None,
    ) -> Response:
        """Queue ``req`` (unless ``granted`` a backend already: the fast path), forward it, and
        queue it again after a retryable failure."""
        loop = asyncio.get_running_loop()
        deadline = arrived + self.config.queue_ttl_s
        exclude: frozenset[int] = frozenset()
        last_error = ""
        handed_off = False
        attempts = 0
        try:
            while True:
                if granted is None:
                    got = await self._queued(req, exclude, watch, deadline)
                    if got is None:
                        continue  # the queue store was unavailable for a while: queue it again
                    if isinstance(got, Response):
                        return got
                    backend = got
                else:  # dispatched at once (the fast path)
                    backend, granted = granted, None
                # ---- upstream
                outcome = await self._forward(request, req, backend, path, payload, parsed, watch)
                if isinstance(outcome, Response):
                    handed_off = True  # _forward released the backend / owns the stream now
                    return outcome
                # retryable failure before anything was sent to the client
                message, kind = outcome
                last_error = message  # the client is not told which backend (the log is)
                log.warning("request %s failed on %s (%s)", req.request_id, backend.url, message)
                self.dispatcher.release(backend, req)
                if watch.stop.done():
                    self._abort(req)
                    return self._stopped(watch)
                req.transition(RequestState.PREEMPTED)
                req.num_preemptions += 1
                reached = kind != "refused"  # a refused connection reached no backend
                if reached:
                    attempts += 1  # so a request that crashes every backend it meets ends
                waits = kind != "failed" and self.config.backend_down_s > 0 and loop.time() < deadline
                if waits and attempts < self.config.max_attempts:
                    # the backend is down or went away (marked down for backend_down_s): wait in
                    # the queue, in order, for it or another one
                    self.metrics.retries.labels(backend.url).inc()
                    continue
                if not reached:
                    attempts += 1
                exclude = exclude | {backend.index}
                if attempts >= self.config.max_attempts or self.dispatcher.all_backends_excluded(exclude):
                    break
                self.metrics.retries.labels(backend.url).inc()
            self._abort(req)
            return self._reject(
                "backend_error",
                api_error("upstream_error", detail=f"no backend could serve the request (last error: {last_error})"),
            )
        except asyncio.CancelledError:
            if self.dispatcher.cancel(req):
                self._abort(req)
            raise
        finally:
            if not handed_off:
                watch.close()

    async def _queued(
        self, req: Request, exclude: frozenset[int], watch: _Watch, deadline: float
    ) -> Backend | Response | None:
        """Queue ``req`` and wait for its backend: the backend, the answer that ends the request
        (TTL, client gone, queue full, policy error...), or None to queue it again (the queue store
        came back)."""
        loop = asyncio.get_running_loop()
        await self.arrivals.told(req)  # dispatched before its score: the policy knows of it first
        try:
            fut = self.dispatcher.submit(req, exclude)
        except (ValueError, TypeError, LookupError) as exc:  # the policy refused it
            log.warning("policy %s rejected request %s: %s", self.policy.name, req.request_id, exc)
            self._abort(req)
            return self._reject(
                "policy_error",
                api_error("policy_error", detail=exc),
            )
        except QueueFullError as exc:
            self._abort(req)
            return self._queue_full(exc)
        remaining = deadline - loop.time()
        if not fut.done():
            await asyncio.wait(
                _either(fut, watch.stop),
                timeout=max(remaining, 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
        if not fut.done():
            self.dispatcher.cancel(req)
            fut.cancel()
            self._abort(req)
            if watch.stop.done():
                return self._stopped(watch)
            if not self._any_reachable():  # every backend's last connection attempt failed
                return self._reject(
                    "no_backend",
                    api_error(
                        "no_backend",
                        headers={"Retry-After": str(self.config.retry_after_s)},
                        seconds=self.config.queue_ttl_s,
                    ),
                )
            if isinstance(self.dispatcher, RedisDispatcher) and not self.dispatcher.redis_reachable:
                return self._reject(
                    "queue_error",
                    api_error("queue_error", headers={"Retry-After": str(self.config.retry_after_s)}),
                )
            return self._reject(
                "ttl",
                api_error("queue_timeout", seconds=self.config.queue_ttl_s),
            )
        try:
            backend = fut.result()
        except QueueFullError as exc:  # the shared (Redis) queue is full
            self._abort(req)
            return self._queue_full(exc)
        except (ValueError, TypeError, LookupError) as exc:  # the (Redis) queue cannot take its key
            log.warning("policy %s: request %s cannot be queued: %s", self.policy.name, req.request_id, exc)
            self._abort(req)
            return self._reject(
                "policy_error",
                api_error("policy_error", detail=exc),
            )
        except Exception as exc:  # queue store unavailable
            pause = min(float(max(self.config.retry_after_s, 1)), deadline - loop.time())
            if pause > 0:  # wait for it (up to the queue TTL), then queue again
                self._log_limited("queue", "request %s: queue store unavailable (%s); waiting for it",
                                  req.request_id, exc)  # fmt: skip
                await asyncio.wait({watch.stop}, timeout=pause)
                if watch.stop.done():
                    self._abort(req)
                    return self._stopped(watch)
                if loop.time() < deadline:
                    return None  # queue it again
            self._abort(req)
            self._log_limited("queue", "request %s: queue unavailable: %s", req.request_id, exc)
            return self._reject(
                "queue_error",
                api_error("queue_error", headers={"Retry-After": str(self.config.retry_after_s)}),
            )
        return backend

    def _stopped(self, watch: _Watch) -> Response:
        reason = watch.reason
        if reason == "cancelled":
            return self._reject(
                "cancelled",
                api_error("cancelled"),
            )
        if reason == "shutdown":
            return self._reject(
                "drain_timeout",
                api_error(
                    "drain_timeout",
                    headers={"Retry-After": str(self.config.retry_after_s), "Connection": "close"},
                    seconds=self.config.drain_timeout_s,
                ),
            )
        return self._reject("client_disconnected", Response(status_code=499))

    def _queue_full(self, exc: QueueFullError) -> Response:
        where = "queue" if exc.scope == "global" else "queue of your tenant"
        return self._reject(
            "queue_full",
            api_error("queue_full", headers={"Retry-After": str(self.config.retry_after_s)}, where=where),
        )

    @staticmethod
    async def _wait_disconnect(request: HTTPRequest) -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    async def _forward(
        self,
        request: HTTPRequest,
        req: Request,
        backend: Backend,
        path: str,
        payload: bytes,
        parsed: Parsed,
        watch: _Watch,
    ) -> Response | tuple[str, str]:
        """Send to ``backend``. A Response ends the request; ``(message, kind)`` is a retryable
        failure (nothing reached the client): ``kind`` is ``refused`` (no connection: nothing
        reached the backend), ``lost`` (the backend took the request and dropped the connection,
        or ended its stream, before answering anything) or ``failed`` (a 5xx, a stall, a broken
        exchange)."""
        wait = self.config.headers_timeout_s if parsed.stream else 0.0
        send = asyncio.ensure_future(self.pools[backend.index].post(path, payload, headers_timeout=wait or None))
        await asyncio.wait(_either(send, watch.stop), return_when=asyncio.FIRST_COMPLETED)
        if not send.done():  # client went away (or cancelled) while we connected
            send.cancel()
            with contextlib.suppress(BaseException):
                await send
            self.dispatcher.release(backend, req)
            self._abort(req)
            watch.close()
            return self._stopped(watch)
        try:
            resp = send.result()
        except UpstreamConnectError as exc:  # refused: the backend is down (or restarting)
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            backend.reachable = False
            return str(exc), "refused"
        except UpstreamConnectionLost as exc:  # it took the request and dropped it: crashed, restarting?
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return str(exc), "lost"
        except UpstreamTimeout as exc:
            # it took the request and stalled: try another one, and skip it for a while
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return str(exc), "failed"
        except UpstreamError as exc:
            return str(exc), "failed"
        backend.reachable = True
        if resp.status_code >= 500:
            with contextlib.suppress(UpstreamError):
                await resp.read()
            resp.close()
            return f"HTTP {resp.status_code}", "failed"
        if resp.status_code != 200 or not parsed.stream:
            return await self._finish_plain(req, backend, resp, watch)
        # the first event before the client sees a 200: a backend that sends its headers and then
        # fails or stalls has streamed nothing, so the request can still go to another
        chunks = resp.iter_chunks()
        first = asyncio.ensure_future(anext(chunks))
        await asyncio.wait(_either(first, watch.stop), timeout=wait or None, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            resp.close()
            if watch.stop.done():  # the client went away (or was cancelled) meanwhile
                self.dispatcher.release(backend, req)
                self._abort(req)
                watch.close()
                return self._stopped(watch)
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return f"no event within {wait:g} s of the response headers", "failed"
        try:
            head = first.result()
        except UpstreamTimeout as exc:  # stalled after its headers
            resp.close()
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return f"the stream stalled before its first event ({exc})", "failed"
        except (StopAsyncIteration, UpstreamError) as exc:  # it ended the stream, or dropped it
            resp.close()
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            why = "the stream ended" if isinstance(exc, StopAsyncIteration) else f"the stream broke ({exc})"
            return f"{why} before its first event", "lost"
        watch.close()  # StreamingResponse watches for disconnects from here on
        watch.upstream = resp
        return StreamingResponse(
            self._relay(req, backend, resp, _chain(head, chunks), parsed.wants_usage, watch),
            status_code=200,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": req.request_id},
        )

    async def _finish_plain(self, req: Request, backend: Backend, resp: UpstreamResponse, watch: _Watch) -> Response:
        """Read a non-streamed (or error) response whole, racing the client's disconnect."""
        read = asyncio.ensure_future(resp.read())
        try:
            await asyncio.wait(_either(read, watch.stop), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read
                self._abort(req)
                return self._stopped(watch)
            try:
                content = read.result()
            except UpstreamError as exc:
                self._abort(req)
                return self._reject(
                    "backend_error",
                    api_error("upstream_error", detail=f"backend failed while responding: {exc}"),
                )
        finally:
            watch.close()
            resp.close()
            self.dispatcher.release(backend, req)
        now = self.dispatcher.now()
        if resp.status_code != 200:
            self._abort(req)
            self.metrics.rejections.labels(f"backend_{resp.status_code}").inc()
            ctype = resp.headers.get("content-type", "application/json")
            return Response(content, status_code=resp.status_code, media_type=ctype)
        n = completion_tokens(content)
        if n is None:  # the backend gave no count: the policy is told it is unknown, not 0
            req.output_tokens_known = False
        req.first_token_time = req.last_token_time = now
        self._complete(req, n or 0, now)
        return Response(content, media_type="application/json", headers={"X-Request-Id": req.request_id})

    def _complete(self, req: Request, completion_tokens: int, now: float) -> None:
        delta = completion_tokens - req.num_output_tokens
        if delta > 0:
            req.num_output_tokens = completion_tokens
            req.num_computed_tokens = req.num_prompt_tokens + completion_tokens
            self.arrivals.on_progress(req, now, delta)
        elif completion_tokens:
            req.num_output_tokens = completion_tokens
        req.finish_time = now
        req.transition(RequestState.FINISHED)
        if self.online is not None and req.output_tokens_known:  # queued for the learner's thread
            self.online.observe(req.prompt, req.num_output_tokens, str(req.extra.get("model") or "") or None)
        self.arrivals.on_finish(req, now)  # and the queued keys follow what the policy learned
        self.metrics.finished.labels(req.tenant_id, req.tier.name.lower()).inc()
        streamed = req.extra.get("stream") is True and req.first_token_time is not None
        self.metrics.observe_latency(
            str(req.extra.get("model") or ""),
            req.priority,
            now - req.arrival_time,
            req.first_token_time - req.arrival_time if streamed and req.first_token_time is not None else None,
        )
        self._record(req)

    async def _relay(
        self,
        req: Request,
        backend: Backend,
        resp: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        wants_usage: bool,
        watch: _Watch,
    ) -> AsyncIterator[bytes]:
        """Pass SSE events through one by one; count tokens; read the final usage.

        Events are split per the SSE spec (CRLF, CR or LF line ends; ``data:`` with or without
        a space); vLLM's ``data: {...}\\n\\n`` takes the fast path."""
        on_progress = self.arrivals.on_progress
        progress_hook = self.dispatcher.hooks.on_progress
        now = self.dispatcher.now
        stop = watch.stop
        usage_tokens: int | None = None
        done = False
        buf = held = b""
        reason = "client_disconnected"  # unless set below: the client went away mid-stream
        try:
            try:
                async for chunk in chunks:
                    if held or b"\r" in chunk:
                        chunk, held = sse_newlines(held + chunk)
                    buf += chunk
                    while True:
                        cut = buf.find(b"\n\n")
                        if cut < 0:
                            break
                        event, buf = buf[: cut + 2], buf[cut + 2 :]
                        if event.startswith(b"data: "):
                            data = event[6:-2]
                            if b"\n" in data:
                                data = sse_data(event)
                        else:
                            data = sse_data(event)
                        if data == b"[DONE]":
                            done = True
                        elif data.startswith(b"{"):
                            if b'"usage":{' in data or b'"usage": {' in data:
                                with contextlib.suppress(ValueError, TypeError, KeyError):
                                    obj = json.loads(data)
                                    usage_tokens = int(obj["usage"]["completion_tokens"])
                                    if not obj.get("choices") and not wants_usage:
                                        continue  # the usage chunk we asked for, not the client
                            elif b'"choices":[]' not in data and b'"role"' not in data:  # chat's role chunk: no token
                                t = now()
                                if req.first_token_time is None:
                                    req.first_token_time = t
                                    if backend.config.metrics_poll_s > 0:  # no longer waiting there
                                        backend.note_started(req)
                                        self.dispatcher.dispatch()
                                req.last_token_time = t
                                req.num_output_tokens += 1
                                req.num_computed_tokens = req.num_prompt_tokens + req.num_output_tokens
                                if progress_hook:
                                    on_progress(req, t, 1)
                        yield event
                    if stop.done() and not done:
                        break
                else:
                    if held:
                        buf += b"\n"
                    if buf:
                        yield buf
            except UpstreamError as exc:
                if not stop.done():  # not the gateway closing it (cancel, drain timeout)
                    reason = "backend_error_midstream"
                    log.warning("request %s: backend %s failed mid-stream: %s", req.request_id, backend.url, exc)
                    yield sse_error(f"the backend failed mid-stream: {exc}")
                    return
            if stop.done() and not done:
                why = stop.result()
                reason = _STOP_REASONS.get(why, reason)
                if why in _STOP_EVENTS:
                    yield _STOP_EVENTS[why]
                return
            if not done and usage_tokens is None:
                reason = "backend_error_midstream"
                log.warning("request %s: backend %s closed the stream early", req.request_id, backend.url)
                yield sse_error("the backend closed the stream early")
                return
            self._complete(req, usage_tokens if usage_tokens is not None else req.num_output_tokens, now())
        finally:
            if not req.is_finished:
                self.metrics.rejections.labels(reason).inc()
                self._abort(req)
            watch.upstream = None
            resp.close()  # mid-body: closes the upstream connection: the backend aborts the request
            self.dispatcher.release(backend, req)
            self._ended(req, watch)


class _GatewayApp(Starlette):
    """The Starlette app, with the gateway's startup and shutdown as its ASGI lifespan: a startup
    failure (Redis unreachable, say) is one line in the server's log, not a traceback."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await super().__call__(scope, receive, send)
            return
        gw: Gateway = self.state.gateway
        await receive()  # lifespan.startup
        try:
            await gw.startup()
        except Exception as exc:
            with contextlib.suppress(Exception):
                await gw.shutdown()
            await send({"type": "lifespan.startup.failed", "message": f"cannot start the gateway: {exc}"})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        try:
            await gw.shutdown()
        except Exception as exc:
            log.exception("gateway shutdown failed")
            await send({"type": "lifespan.shutdown.failed", "message": f"gateway shutdown failed: {exc}"})
            return
        await send({"type": "lifespan.shutdown.complete"})


def create_app(
    config: GatewayConfig,
    *,
    policy: Policy | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    redis: Any = None,
) -> Starlette:
    """The gateway as an ASGI app; ``app.state.gateway`` is its :class:`Gateway`.

    ``policy``: a ready policy instance instead of ``make_policy(config.policy, ...)``;
    ``transport``: httpx transport for the side traffic (``/metrics`` polls,
    ``/v1/models``); requests themselves use the gateway's own HTTP/1.1 pool;
    ``redis``: a ``redis.asyncio`` client instead of one from ``config.redis_url``.
    """
    gw = Gateway(config, policy=policy, transport=transport, redis=redis)

    async def http_error(request: HTTPRequest, exc: Exception) -> Response:
        # Starlette's own 404/405 (unknown path, wrong method) as OpenAI-style JSON
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        kind = ERRORS[code]
        return error_response(exc.status_code, str(exc.detail), kind.type, code=code, headers=dict(exc.headers or {}))

    app = _GatewayApp(
        exception_handlers={HTTPException: http_error},
        routes=[
            Route("/v1/completions", gw.completions, methods=["POST"]),
            Route("/v1/chat/completions", gw.chat_completions, methods=["POST"]),
            Route("/v1/models", gw.models, methods=["GET"]),
            Route("/health", gw.health, methods=["GET"]),
            Route("/metrics", gw.prom, methods=["GET"]),
            Route("/v1/requests/{request_id}", gw.request_status, methods=["GET"]),
            Route("/v1/requests/{request_id}", gw.request_cancel, methods=["DELETE"]),
            Route("/openapi.json", gw.openapi, methods=["GET"]),
            Route("/v1/{path:path}", gw.passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ],
    )
    # /health/ is a 404, not a redirect: Starlette builds that redirect from the Host header
    app.router.redirect_slashes = False
    app.state.gateway = gw
    return app
