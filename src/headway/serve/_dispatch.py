"""Admission control: the policy-ordered waiting queue and the backends' capacity.

Each HTTP handler submits a :class:`~headway.core.Request` and awaits the future that
:class:`Dispatcher` resolves with a :class:`Backend` once the request is first in policy
order and some backend has room. Dispatching happens synchronously whenever capacity
frees or a request arrives: every pop is O(log n) and nothing polls the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from headway.core import Policy, PolicyQueue, Request, RequestState
from headway.routers import DEFAULT_ROUTER, Estimator, LoadTracker, Router, make_router, policy_estimator
from headway.serve._config import BackendConfig, redact_url

__all__ = ["Backend", "Dispatcher", "QueueFullError"]

log = logging.getLogger("headway.serve.dispatch")


class QueueFullError(Exception):
    """The global or per-tenant queue limit was reached."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope


LOOK_PAST = 256
"""Queued requests one :meth:`Dispatcher.dispatch` looks past for one that may use a free backend the
head may not (the head failed there, or that backend does not serve its model): bounded, so that a
deep queue of one busy model costs each dispatch little."""

_STARTED = "headway.started_on_backend"
"""``Request.extra`` flag: its backend began answering it (see :meth:`Backend.note_started`)."""


@dataclass(eq=False, slots=True)
class Backend:
    """Live state of one upstream server."""

    config: BackendConfig
    index: int
    in_flight: int = 0
    down_until: float = 0.0
    full_until: float = 0.0
    """It answered that it is full (a 503: vLLM's ``max_num_queued_reqs`` or ``max_num_queued_tokens``
    reached): no room until a request of ours on it ends, or until this time."""
    polled_waiting: float = 0.0
    polled_kv_usage: float = 0.0
    dispatched_since_poll: int = 0
    finished_since_poll: int = 0
    last_poll_ok: bool = True
    reachable: bool = True
    """False since a connection attempt failed (a request's, or a poll of its ``/metrics``), until
    it answers again (``/health``, the 503 ``no_backend``); a backend never tried counts as
    reachable (:meth:`Dispatcher.mark_unreachable`)."""
    load_read: bool = False
    """A poll of its ``/metrics`` has read its load at least once."""
    load_unreadable: bool = False
    """Polled, it answered but no poll has read its load yet (its ``/metrics`` a 404 or without
    vLLM's or SGLang's gauges) and its ``/v1/models`` list nothing: most often a wrong URL. No
    room, and not :attr:`usable`, until a poll reads its load or its models, rather than sending
    requests where nothing says they can be served."""
    no_load_warned: bool = False
    """The warning that it lists models but its ``/metrics`` tell no load was logged."""
    models: tuple[str, ...] | None = None
    """The model ids its ``/v1/models`` listed last (sorted; None until read, :mod:`._models`)."""
    extra: dict[str, object] = field(default_factory=dict)

    label: str = ""
    """Its URL as ``/metrics`` labels it: a password in it shown as ``***``."""

    def __post_init__(self) -> None:
        self.label = redact_url(self.config.url)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def usable(self) -> bool:
        """Whether it can be sent requests at all: reachable, and not :attr:`load_unreadable`
        (``/health``, the 503 ``no_backend``, ``headway_backend_up``)."""
        return self.reachable and not self.load_unreadable

    def has_room(self, now: float) -> bool:
        c = self.config
        if now < self.down_until or now < self.full_until:
            return False
        if c.max_concurrency and self.in_flight >= c.max_concurrency:
            return False
        if c.metrics_poll_s > 0:
            if self.load_unreadable or self.polled_kv_usage >= c.max_kv_usage:
                return False
            undelivered = max(0, self.dispatched_since_poll - self.finished_since_poll)
            if self.polled_waiting + undelivered > c.max_waiting:
                return False
        return True

    def note_started(self, request: Request) -> None:
        """The backend began answering ``request`` (its first token came): it no longer waits in
        the backend's own queue, so it stops counting against ``max_waiting`` before the next poll
        (else a burst would be let in one request per poll)."""
        if not request.extra.get(_STARTED):
            request.extra[_STARTED] = True
            self.finished_since_poll += 1

    def note_released(self, request: Request | None) -> None:
        """``request`` ended; counted here unless :meth:`note_started` counted it already. Its end
        makes room on a backend that answered it was full."""
        self.full_until = 0.0
        if request is None or not request.extra.pop(_STARTED, False):
            self.finished_since_poll += 1

    def load(self) -> float:
        c = self.config
        base = self.in_flight / c.max_concurrency if c.max_concurrency else float(self.in_flight)
        return base + self.polled_waiting + self.polled_kv_usage


class Dispatcher:
    """Waiting queue + per-backend capacity; hands requests to backends in policy order."""

    def __init__(
        self,
        policy: Policy,
        backends: list[Backend],
        *,
        max_queue_len: int,
        max_queue_per_tenant: int = 0,
        clock: Callable[[], float] = time.monotonic,
        on_dispatch: Callable[[Request, Backend], None] | None = None,
        router: Router | None = None,
        score_hold_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self.hooks = type(policy).hooks()
        """The hooks ``policy`` overrides (those it does not are not called)."""
        self.score_hold_s = score_hold_s
        self.scoring = 0
        """Requests being scored before they are queued (the gateway counts them; see :meth:`_holding`)."""
        self.arriving = 0
        """Requests admitted with a scorer that have not yet taken the fast path or started being
        scored (the gateway counts them; see :meth:`dispatch_unscored`)."""
        self._hold_since: float | None = None
        self._soon = False
        self.router = router if router is not None else make_router(DEFAULT_ROUTER)
        # backends with a concurrency limit count as that much faster: load-proportional routing
        limits = [b.config.max_concurrency for b in backends]
        speeds = [lim / max(limits) for lim in limits] if backends and all(limits) else None
        self.tracker = (
            LoadTracker(len(backends) if speeds is None else None, speeds=speeds, names=[b.url for b in backends])
            if backends
            else None
        )
        self._estimate: Estimator | None = policy_estimator(policy)
        self.queue = PolicyQueue(policy)
        self.backends = backends
        self.max_queue_len = max_queue_len
        self.max_queue_per_tenant = max_queue_per_tenant
        self._t0 = clock()
        self._clock = clock
        self._seq = itertools.count()
        self._waiters: dict[Request, tuple[asyncio.Future[Backend], frozenset[int]]] = {}
        self._timers: dict[Request, asyncio.TimerHandle] = {}
        self.queued_per_tenant: Counter[tuple[str, str]] = Counter()
        self._on_dispatch = on_dispatch
        self._wakeup_handle: asyncio.TimerHandle | None = None
        if policy.oracle:
            # Behind the gateway the only length a client states is max_tokens: with
            # ``ignore_eos`` (benchmarks) it is the true output length.
            policy.bind_oracle(lambda r: r.max_tokens)

    # ------------------------------------------------------------------ time
    def now(self) -> float:
        """Seconds since the dispatcher started (the policy clock)."""
        return self._clock() - self._t0

    def next_seq(self) -> int:
        return next(self._seq)

    # --------------------------------------------------------------- arrival
    def admit(self, request: Request) -> None:
        """Raise :class:`QueueFullError` when ``request`` would not fit the queue: checked on
        arrival, before any scoring, so that a 429 under overload costs nothing. Requests being
        scored count as queued for the global limit (:meth:`submit` checks again)."""
        if len(self.queue) + self.scoring + self.arriving >= self.max_queue_len:
            raise QueueFullError("global")
        self._admit_tenant(request)

    def _admit_tenant(self, request: Request) -> None:
        tenant_key = (request.tenant_id, request.tier.name.lower())
        if self.max_queue_per_tenant and self.queued_per_tenant[tenant_key] >= self.max_queue_per_tenant:
            raise QueueFullError("tenant")

    def submit(self, request: Request, exclude: frozenset[int] = frozenset()) -> asyncio.Future[Backend]:
        """Queue ``request`` (arrival or a retry); the future resolves with its backend."""
        tenant_key = (request.tenant_id, request.tier.name.lower())
        if len(self.queue) >= self.max_queue_len:
            raise QueueFullError("global")
        if self.max_queue_per_tenant and self.queued_per_tenant[tenant_key] >= self.max_queue_per_tenant:
            raise QueueFullError("tenant")
        now = self.now()
        fut: asyncio.Future[Backend] = asyncio.get_running_loop().create_future()
        if request.seq < 0:
            request.seq = self.next_seq()
            self.policy.on_arrival(request, now)
        self._waiters[request] = (fut, exclude)
        self.queue.add(request, now)
        self.queued_per_tenant[tenant_key] += 1
        self._arm_rekey(request)
        if self.scoring:
            self._dispatch_soon()
        else:
            self.dispatch()
        return fut

    def _dispatch_soon(self) -> None:
        """Dispatch once the tasks already ready in this loop iteration ran: the rest of a scored
        batch resume together, and the first of them must not be dispatched before the others
        are queued."""
        if not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._run_soon)

    def _run_soon(self) -> None:
        self._soon = False
        self.dispatch()

    def _arm_rekey(self, request: Request) -> None:
        if not self.hooks.rekey_at_time:
            return
        at = self.policy.rekey_at_time(request)
        if at is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, at - self.now())
        self._timers[request] = loop.call_later(delay, self._rekey, request)

    def _rekey(self, request: Request) -> None:
        self._timers.pop(request, None)
        if request in self.queue:
            self.queue.rekey(request, self.now())
            self._arm_rekey(request)
            self.dispatch()

    def cancel(self, request: Request) -> bool:
        """Remove a queued request (client gone, TTL); returns whether it was queued."""
        if not self.queue.remove(request):
            return False
        self._forget(request)
        return True

    def _forget(self, request: Request) -> None:
        self._waiters.pop(request, None)
        timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()
        key = (request.tenant_id, request.tier.name.lower())
        # kept at 0, not deleted: headway_queue_length reads 0 for an idle tenant (the tenants are
        # the operator's, from the config or Redis's records, so the keys stay few)
        self.queued_per_tenant[key] = max(self.queued_per_tenant[key] - 1, 0)

    def not_serving(self, model: object) -> frozenset[int]:
        """The backends a request for ``model`` is kept from: while some backend's ``/v1/models``
        lists it, those whose list was read and does not (one not read, not polled or not yet, may
        serve it). None for a request without a model, nor for a model no backend lists: it goes
        to any backend, as with one model, and the backend answers it (vLLM with its 404; a server
        that takes any name, with its model)."""
        if not isinstance(model, str) or not model:
            return frozenset()
        if not any(b.models is not None and model in b.models for b in self.backends):
            return frozenset()
        return frozenset(b.index for b in self.backends if b.models is not None and model not in b.models)

    def models_unavailable(self) -> list[str]:
        """The models some backend lists that no usable backend may serve now (sorted): every
        backend listing them is unreachable or unreadable, and no usable backend's list is unknown."""
        if any(b.usable and b.models is None for b in self.backends):
            return []
        listed = {m for b in self.backends for m in b.models or ()}
        served = {m for b in self.backends if b.usable for m in b.models or ()}
        return sorted(listed - served)

    # -------------------------------------------------------------- dispatch
    def _candidates(self, now: float, exclude: frozenset[int]) -> list[int]:
        return [b.index for b in self.backends if b.index not in exclude and b.has_room(now)]

    def _route(self, req: Request, candidates: list[int]) -> Backend:
        """The router's pick among ``candidates`` (recorded in the tracker until :meth:`release`)."""
        assert self.tracker is not None
        router = self.router
        if len(candidates) == 1 and not (router.uses_estimate or router.uses_block_hashes):
            # one choice: a router that learns from its decisions (a prefix index) still sees it
            k = candidates[0]
            self.tracker.assign(req, k, float(req.num_prompt_tokens + req.max_tokens))
        else:
            try:
                k = self.router.route(req, self.tracker, candidates, estimate=self._estimate)
            except ValueError:  # a bad estimate: fall back to the plain prompt-length one
                k = self.router.route(req, self.tracker, candidates)
        return self.backends[k]

    def _holding(self, now_mono: float) -> bool:
        """Whether free backends should wait for scores still being computed.

        While more requests are being scored than are queued, the best next request is more
        likely among those not yet scored (in a burst, the first few scored would otherwise
        be dispatched before the rest are known, whatever their length). A hold lasts at
        most ``score_hold_s`` (0: never hold); a timer re-runs :meth:`dispatch` when it ends.
        """
        if self.score_hold_s <= 0 or self.scoring <= len(self.queue):
            self._hold_since = None
            return False
        if self._hold_since is None:
            log.debug("hold: %d being scored, %d queued", self.scoring, len(self.queue))
            self._hold_since = now_mono
            asyncio.get_running_loop().call_later(self.score_hold_s, self.dispatch)
        return now_mono - self._hold_since < self.score_hold_s

    def dispatch(self) -> int:
        """Hand queued requests to backends while one has room; returns how many."""
        queue = self.queue
        if not queue:
            return 0
        now_mono = self._clock()
        if self._holding(now_mono):
            return 0
        queue.refresh(now_mono - self._t0)
        n = 0
        skipped: list[Request] = []
        trace = log.isEnabledFor(logging.DEBUG)
        while queue:
            req = queue.peek()
            assert req is not None
            fut, exclude = self._waiters[req]
            candidates = self._candidates(now_mono, exclude)
            if not candidates:
                if not exclude or len(skipped) >= LOOK_PAST or not self._candidates(now_mono, frozenset()):
                    break  # nobody has room: the head waits (head-of-line by policy order)
                # the head may not use the free backend (it failed there, or does not serve its
                # model): look further
                skipped.append(queue.pop())
                continue
            queue.pop()
            self._forget(req)
            backend = self._start(req, candidates, now_mono)
            if trace:
                now = now_mono - self._t0
                log.debug("dispatch %s at %.3f s (waited %.3f s, score %s, %d queued) to %s", req.request_id, now,
                          now - req.arrival_time, req.score, len(queue), backend.url)  # fmt: skip
            if not fut.done():
                fut.set_result(backend)
            n += 1
        for req in skipped:
            queue.add(req, now_mono - self._t0)
        self._arm_wakeup(now_mono)
        return n

    def _start(self, req: Request, candidates: list[int], now_mono: float) -> Backend:
        """Route ``req`` to one of ``candidates`` and count it there (it runs from now)."""
        backend = self._route(req, candidates)
        backend.in_flight += 1
        backend.dispatched_since_poll += 1
        req.transition(RequestState.RUNNING)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now_mono - self._t0
        if self._on_dispatch is not None:
            self._on_dispatch(req, backend)
        return backend

    def free_slots(self, now_mono: float | None = None) -> float:
        """Requests the backends would all take right now, whichever comes first: per backend with
        room, its free concurrency (unbounded without ``max_concurrency``), but at most 1 when it is
        gated by polled ``/metrics`` (its room then depends on gauges that one dispatch changes)."""
        now_mono = self._clock() if now_mono is None else now_mono
        total = 0.0
        for b in self.backends:
            if not b.has_room(now_mono):
                continue
            limit = b.config.max_concurrency
            slots = float(limit - b.in_flight) if limit else math.inf
            total += min(slots, 1.0) if b.config.metrics_poll_s > 0 else slots
        return total

    def dispatch_unscored(self, request: Request) -> Backend | None:
        """The fast path: dispatch ``request``, just arrived and not scored yet, at once when no
        order of the requests known to the gateway could put another one first; else None (it is
        then scored and queued as usual).

        That is when nothing is queued and the backends have more free slots
        (:meth:`free_slots`) than there are other requests that will compete for them: those
        being scored before they are queued (:attr:`scoring`) and those admitted that have not
        chosen yet (:attr:`arriving`: the gateway counts a request there from its admission to
        this call, and yields to the event loop once in between, so that requests that arrived
        together see each other). Every one of them then gets a slot whatever the policy's
        order, so the policy's order decides nothing. Not with a router that reads the policy's
        length estimate (it may need the score).

        The request gets a sequence number but the policy is not told of its arrival: the
        caller does that (``policy.on_arrival``) once the score is known, before it is queued
        again (a retry), and before telling the policy of its progress or finish."""
        if self.queue or self.router.uses_estimate or self.not_serving(request.extra.get("model")):
            return None  # (a model some backends do not serve: the free slots may not be its)
        now_mono = self._clock()
        if self.free_slots(now_mono) <= self.scoring + self.arriving:
            return None
        candidates = self._candidates(now_mono, frozenset())
        if not candidates:  # pragma: no cover - free_slots > 0 means some backend has room
            return None
        if request.seq < 0:
            request.seq = self.next_seq()
        return self._start(request, candidates, now_mono)

    def _arm_wakeup(self, now_mono: float) -> None:
        """If work waits only on a backend marked down, retry when it comes back."""
        if not self.queue or self._wakeup_handle is not None:
            return
        downs = [t for b in self.backends for t in (b.down_until, b.full_until) if t > now_mono]
        if not downs:
            return

        def wake() -> None:
            self._wakeup_handle = None
            self.dispatch()

        self._wakeup_handle = asyncio.get_running_loop().call_later(min(downs) - now_mono + 1e-3, wake)

    def sync_keys(self) -> None:
        """Called after the policy learned something (a finish): the in-memory queue re-keys
        itself when the policy bumps ``key_epoch``, so there is nothing to do here."""

    def release(self, backend: Backend, request: Request | None = None) -> None:
        """``request``, dispatched to ``backend``, ended (any way): free its slot."""
        if request is not None and self.tracker is not None:
            self.tracker.release(request)
        backend.in_flight -= 1
        backend.note_released(request)
        self.dispatch()

    def mark_down(self, backend: Backend, seconds: float) -> None:
        backend.down_until = self._clock() + seconds

    def mark_unreachable(self, backend: Backend, seconds: float) -> None:
        """A connection to ``backend`` failed (a request's or a ``/metrics`` poll's): unreachable
        until a connection succeeds again, and skipped for ``seconds`` (``backend_down_s``)."""
        self.mark_down(backend, seconds)
        backend.reachable = False

    def mark_full(self, backend: Backend, seconds: float) -> None:
        """``backend`` turned a request away as full: no room there until another request of ours
        ends on it (:meth:`Backend.note_released`), or for ``seconds`` at most."""
        backend.full_until = self._clock() + seconds

    def any_reachable(self, exclude: frozenset[int] = frozenset()) -> bool:
        """Whether some backend not in ``exclude`` can be sent requests: its last connection attempt
        (a request's or a ``/metrics`` poll's) did not fail (``Backend.reachable``), and its
        ``/metrics``, if polled, are not unreadable (``Backend.usable``)."""
        return any(b.usable for b in self.backends if b.index not in exclude)

    def all_backends_excluded(self, exclude: frozenset[int]) -> bool:
        return all(b.index in exclude for b in self.backends)

    def fail_all(self, exc: BaseException) -> None:
        """Shutdown: fail every waiter."""
        for req in list(self._waiters):
            fut, _ = self._waiters[req]
            self.queue.remove(req)
            self._forget(req)
            if not fut.done():
                fut.set_exception(exc)
