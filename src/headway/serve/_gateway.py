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

Backend failures (what each one costs the request, and its counter, are in ``docs/gateway.md``'s
failure table): a backend that refuses the connection, drops it before answering, or does not
answer within ``headers_timeout_s`` is skipped for ``backend_down_s`` and the request goes back to
the queue in its place (a refusal is no attempt; a dropped or stalled exchange is one, so a request
that crashes every backend it meets ends after ``max_attempts`` with a 502); a backend is reachable
again at the next ``/metrics`` poll that connects. Waiting is
bounded by the queue TTL only, so that a backend restarting in a few seconds loses no request
(503 ``no_backend`` when the TTL runs out with none reachable; ``/health`` says ``degraded``
meanwhile). A 5xx is retried on another backend, up to ``max_attempts``, then 502; a 503 that is
vLLM's admission control (or from a backend where other requests of this run are) says it is
full: the request waits in the queue, not an attempt. A stream's 200 goes to the client with its
first event, so everything before it can be retried; a failure after it ends the stream as vLLM's
server ends a failed one (an error event, then ``[DONE]``); mid-body of a non-streamed response, a 502.
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
off or for an admin key; a tenant key sees only series labelled with its tenant: its queue
length, queue wait, latencies, finished requests and rejections; no key: 401), ``/health`` and
``/openapi.json``. A 401 on these endpoints is not counted in ``headway_rejections``, which counts
generation requests only (so that ``headway_requests_finished`` + ``headway_rejections`` =
generation requests answered).
Every other ``/v1`` path (embeddings, responses, tokenize, ...) is passed through to a backend
unscheduled (``headway.serve._passthrough``), as far as ``passthrough`` allows.

Forwarded requests, scheduled or passed through, carry the gateway's ``X-Forwarded-For`` and
``X-Forwarded-Proto`` (the client's address and scheme; ``forwarded_allow_ips`` names the proxies
trusted to tell them), never a client's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from headway.core import Policy, Request, make_policy
from headway.policies.driftsched import DriftEstimator
from headway.routers import make_router
from headway.serve._arrivals import Arrivals
from headway.serve._backend_load import parse_backend_load
from headway.serve._config import GatewayConfig, hash_api_key
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError
from headway.serve._errors import ERRORS, api_error, error_response
from headway.serve._exchange import Exchange
from headway.serve._intake import Intake, Refused
from headway.serve._ledger import Ledger
from headway.serve._logging import LimitedWarnings
from headway.serve._metrics import GatewayMetrics
from headway.serve._models import check_models, merged_model_list, watch_models
from headway.serve._openapi import openapi_schema
from headway.serve._passthrough import Passthrough, backend_headers, forwarded_headers
from headway.serve._peers import PeerChannel, PeerUnavailable, owner_of
from headway.serve._redis_queue import RedisDispatcher
from headway.serve._scorer import BatchScorer, OnlineScoring
from headway.serve._tenants import ANONYMOUS, DirectoryUnavailable, Identity, TenantDirectory
from headway.serve._upstream import UpstreamPool
from headway.serve._watch import Watch, wait_disconnect
from headway.serve._wire import Parsed

__all__ = ["Gateway", "create_app"]

log = logging.getLogger("headway.serve")


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
            id_prefix = f"hw-{self.dispatcher.replica}-"
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
            id_prefix = "hw-"
        # prompt-text prefix hashes only for a router that reads them (--router prefix-aware)
        self.intake = Intake(config, hash_prefixes=self.dispatcher.router.uses_block_hashes)
        self._admin_keys = frozenset(config.admin_api_key_sha256)
        self.ledger = Ledger(id_prefix, self.dispatcher.now)
        self.active = self.ledger.active
        """Requests being served (queued, running or streaming), by id."""
        self.finished_requests = self.ledger.finished_requests
        """Most recent finished/aborted requests (bounded), for tests and debugging."""
        self._queue_keys: dict[tuple[str, str], None] = dict.fromkeys(
            [(t.name, t.tier.name.lower()) for t in config.tenants]
            if config.auth_enabled
            else [(ANONYMOUS.tenant, ANONYMOUS.tier.name.lower())]
        )
        """The configured tenants and tiers, which ``headway_queue_length`` reads from the start (those
        known from Redis's records join once they have queued; never a client's word)."""
        self.metrics = GatewayMetrics(
            self._queue_lengths, self._in_flight, backend_up=self._backend_up, drift_bias=self._drift_bias
        )
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
            body_timeout_s=config.body_timeout_s,
            allowed=config.passthrough,
        )
        self.exchange = Exchange(
            config, self.dispatcher, self.pools, self.metrics, self.ledger, self.arrivals, self._log_limited
        )
        self.draining = False
        self.drain_expired = False
        """The drain timeout ran out: requests still open are ended (see :meth:`end_drain`)."""
        self._pollers: list[asyncio.Task[None]] = []
        self._models_cache: tuple[float, bytes] | None = None

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
            if b.config.metrics_poll_s > 0:  # (which also reads its models, :mod:`._models`)
                self._pollers.append(asyncio.create_task(self._poll_backend(b)))
            else:  # its models all the same, so that requests naming one go where it is served
                self._pollers.append(asyncio.create_task(watch_models(self.client, b, self.backends)))

    def end_drain(self) -> None:
        """The drain timeout is over: end every request still open now (a 503, or mid-stream a
        final error event), so that none is cut by the server's own shutdown (a bare 500 or a
        broken stream)."""
        self.drain_expired = True
        self.ledger.end_all("shutdown")

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
            await pool.aclose()
        await self.arrivals.close()
        self.exchange.failures.flush()  # the failures counted since the last summary line
        self.exchange.full.flush()
        self._log_limited.flush()  # the latest warning of each kind left out, with the count of the others
        for client in (self._redis, getattr(self, "_listen_redis", None)):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    # ---------------------------------------------------------------- metrics
    def _queue_lengths(self) -> list[tuple[str, str, int]]:
        """Every tenant and tier known here, 0 when it has nothing queued: the configured tenants
        (or ``default`` with API keys off) from the start, and one known from Redis once it has
        queued (a gauge that vanished when idle would read "no data" rather than 0)."""
        queued = self.dispatcher.queued_per_tenant  # (kept at 0 once a tenant has queued: Dispatcher._forget)
        return [(t, tier, queued.get((t, tier), 0)) for t, tier in {**self._queue_keys, **queued}]

    def _in_flight(self) -> list[tuple[str, int]]:
        return [(b.label, b.in_flight) for b in self.backends]

    def _backend_up(self) -> list[tuple[str, int]]:
        return [(b.label, int(b.usable)) for b in self.backends]

    def _drift_bias(self) -> dict[str, float]:
        """A DriftSched policy's learned ``B_runtime`` per category (``{}`` for other policies)."""
        est = getattr(self.policy, "estimator", None)
        return dict(est.b_runtime) if isinstance(est, DriftEstimator) else {}

    def _on_dispatch(self, req: Request, backend: Backend) -> None:
        # (headway_dispatches counts the requests that reach a backend: Exchange.forward)
        if req.first_scheduled_time is not None and req.num_preemptions == 0:
            self.metrics.wait_time.labels(req.tenant_id, req.tier.name.lower()).observe(
                req.first_scheduled_time - req.arrival_time
            )

    async def _poll_backend(self, b: Backend) -> None:
        """Read the backend's waiting count and KV usage (vLLM's or SGLang's gauges) periodically.

        A poll that cannot connect counts as a refused request does: the backend is unreachable
        (``/health`` degraded when none is reachable, a 503 ``no_backend`` at the queue TTL) and
        skipped for ``backend_down_s``, so that queued requests wait for it instead of being sent
        to a closed port; the next poll that connects makes it reachable again."""
        assert self.client is not None
        models_due = True  # read at the first answer, and at the first after it was unreachable
        seen = False  # it has answered a poll (a gateway may start before its backends)
        while True:
            answered = False
            try:
                r = await self.client.get(b.url + "/metrics", timeout=2.0, headers=backend_headers(b.config.api_key))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing answers there
                if b.last_poll_ok or b.reachable:
                    log.warning("backend %s: unreachable: cannot read its /metrics (%s)", b.label, exc)
                b.last_poll_ok = False
                models_due = True
                self.dispatcher.mark_unreachable(b, self.config.backend_down_s)
            except httpx.HTTPError as exc:
                self._poll_failed(b, exc, answered=False)
            else:
                answered = True
                if not b.reachable:
                    log.info("backend %s: reachable%s", b.label, " again" if seen else "")
                b.reachable = seen = True  # it answered, whatever its /metrics say
                try:
                    r.raise_for_status()
                    load = parse_backend_load(r.text)
                except (httpx.HTTPError, ValueError) as exc:
                    if not b.load_read and b.models is None:  # is an OpenAI server there at all?
                        models_due = False
                        await check_models(self.client, b, self.backends)
                    self._poll_failed(b, exc, answered=True)
                else:
                    b.polled_waiting, b.polled_kv_usage = load.waiting, load.kv_usage
                    b.dispatched_since_poll = b.finished_since_poll = 0
                    b.last_poll_ok = b.load_read = True
                    if b.load_unreadable:
                        b.load_unreadable = False
                        log.info("backend %s: its /metrics show its load now: it takes requests", b.label)
            if answered and models_due:  # (before dispatching: it may have come back serving others)
                models_due = not await check_models(self.client, b, self.backends)  # (a failed read: next poll)
            self.dispatcher.dispatch()
            await asyncio.sleep(b.config.metrics_poll_s)

    @staticmethod
    def _poll_failed(b: Backend, exc: Exception, *, answered: bool) -> None:
        """A poll that reached ``b`` (or timed out) but got no load from it: its last one stands.
        A backend that ``answered`` with no load before any poll read one, and lists no models on
        its ``/v1/models`` either, takes no requests (``load_unreadable``: most often a wrong URL,
        which would answer each a 404); one that lists models is an OpenAI server without vLLM's or
        SGLang's metrics (SGLang without ``--enable-metrics``): it is sent requests as before, as
        its ``max_concurrency`` allows, with a warning that nothing tells how busy it is."""
        reason = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else str(exc)
        if answered and not b.load_read:
            if b.models is None:  # nothing there answers as an OpenAI server
                if not b.load_unreadable:
                    log.error(
                        "backend %s: takes no requests: neither its /metrics (%s) nor its /v1/models answer as "
                        "an OpenAI server's do; check the URL (the server's root, e.g. http://HOST:8000)",
                        b.url,
                        reason,
                    )
                b.load_unreadable = True
            else:
                if b.load_unreadable:
                    log.info("backend %s: its /v1/models answer now: it takes requests", b.label)
                    b.load_unreadable = False
                if not b.no_load_warned:
                    b.no_load_warned = True
                    limit = b.config.max_concurrency
                    log.warning(
                        "backend %s: cannot read its load from its /metrics (%s): it is sent requests %s; use "
                        "vLLM's or SGLang's metrics (SGLang: --enable-metrics), or bound it with "
                        "--backend-concurrency N",
                        b.url,
                        reason,
                        f"up to its max_concurrency {limit}" if limit else "as if idle",
                    )
        elif b.last_poll_ok:  # its last load stands
            log.warning("backend %s: cannot read its /metrics (%s)", b.label, reason)
        b.last_poll_ok = False

    # -------------------------------------------------------------- handlers
    async def health(self, request: HTTPRequest) -> Response:
        """200 ``ok``; 503 ``draining``, or ``degraded`` while no backend is reachable or the
        Redis queue cannot be reached (route traffic elsewhere: requests wait in the queue, up
        to the queue TTL, for a backend or for Redis to come back).

        The body also counts the requests ``queued`` (with Redis: this replica's) and lists the
        ``models_unavailable`` (served by some backend, but by none that can take requests now: the
        gateway stays ``ok`` for the others), except with API keys on for a caller without the admin
        key: load balancers probe without keys, and the count would tell anyone how much the tenants
        send."""
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        body: dict[str, Any] = {"status": "ok"}
        if not self.dispatcher.any_reachable():
            body = {"status": "degraded", "reason": "no backend reachable"}
        elif isinstance(self.dispatcher, RedisDispatcher) and not self.dispatcher.redis_reachable:
            body = {"status": "degraded", "reason": "queue store unreachable"}
        if not self.tenants.enabled or self._is_admin(request):
            body["queued"] = len(self.dispatcher.queue)
            if down := self.dispatcher.models_unavailable():
                body["models_unavailable"] = down
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    def _is_admin(self, request: HTTPRequest) -> bool:
        token = self.tenants.bearer(request.headers.get("authorization"))
        return token is not None and hash_api_key(token) in self._admin_keys

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
    def _not_found(self, request_id: str) -> Response:
        # the same answer for "no such request" and "another tenant's request"
        return api_error("request_not_found", request_id=request_id)

    async def _on_peer(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.ledger.lookup(str(message.get("op")), str(message.get("id")), str(message.get("tenant")))

    async def _request_op(self, request: HTTPRequest, op: str) -> Response:
        """``GET``/``DELETE /v1/requests/{id}``: answered here, or by the replica that holds the
        request (named in its id) through Redis."""
        ident = await self._identify(request, count=False)
        if isinstance(ident, Response):
            return ident
        rid = request.path_params["request_id"]
        found = self.ledger.lookup(op, rid, ident.tenant)
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
        content = await merged_model_list(self.client, self.backends)
        if isinstance(content, str):
            return api_error("upstream_error", detail=f"no backend listed models ({content})")
        self._models_cache = (loop.time() + 5.0, content)
        return Response(content, media_type="application/json")

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
            return self.metrics.reject("auth_unavailable", resp) if count else resp
        return self._unauthorized(count) if ident is None else ident

    def _unauthorized(self, count: bool = True) -> Response:
        """401; ``count``: a generation request, counted in ``headway_rejections``."""
        if count:
            self.metrics.rejected("unauthorized")
        return api_error("invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._handle(request, "/v1/completions", chat=False)

    async def chat_completions(self, request: HTTPRequest) -> Response:
        return await self._handle(request, "/v1/chat/completions", chat=True)

    async def _handle(self, request: HTTPRequest, path: str, chat: bool) -> Response:
        if self.draining:
            return self.metrics.reject(
                "draining",
                api_error("draining", headers={"Connection": "close", "Retry-After": str(self.config.retry_after_s)}),
            )
        ident: Identity | Response | None = None
        try:
            self.intake.check_length(request)  # before any work
            ident = await self._identify(request)  # before the body: no key, no reading
            if isinstance(ident, Response):
                return ident
            body, raw, parsed = await self.intake.read(request, chat)
            self.intake.bound_priority(body, parsed, ident)
        except Refused as exc:
            return self.metrics.reject(exc.reason, exc.response, ident if isinstance(ident, Identity) else None)
        return await self._serve(request, path, body, raw, parsed, ident)

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
        req = self.intake.new_request(self.ledger.new_id(), self.dispatcher.now(), body, parsed, ident)
        try:
            self.dispatcher.admit(req)  # a full queue answers 429 now, not after scoring
        except QueueFullError as exc:
            self.ledger.abort(req)
            return self.exchange.queue_full(exc, req)
        ids = partial(self.intake.token_text, parsed) if parsed.prompt_token_ids and self.intake.tokenizer else None
        backend = await self.arrivals.arrive(req, ids)  # scored, or dispatched at once (fast path)
        payload = self.intake.payload(body, raw, parsed, req)
        watch = Watch(asyncio.ensure_future(wait_disconnect(request)), request.scope)
        self.ledger.open(req, watch)
        if self.drain_expired:
            watch.end("shutdown")
        streaming = False
        try:
            resp = await self.exchange.serve(
                req, path, payload, parsed, watch, arrived, backend, headers=forwarded_headers(request)
            )
            streaming = isinstance(resp, StreamingResponse)
            return resp
        finally:
            if not streaming:  # a stream ends in Exchange._relay
                self.ledger.ended(req, watch)


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
