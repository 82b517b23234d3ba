"""The engine-free part of the plugin: :class:`PolicyAdapter` drives a headway policy for an
engine's request objects (no vLLM import; tested with a fake engine)."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from headway.core import STALL_EVICTIONS, Policy, PolicyKey, PolicyQueue, Request, RequestState, Tier
from headway.integrations.vllm._background import BackgroundScorer
from headway.integrations.vllm._queue import HeadwayRequestQueue
from headway.integrations.vllm._scorers import TextScoreFn
from headway.integrations.vllm._scoring import PromptScoring
from headway.integrations.vllm._settings import REQUEST_HINTS, _check_oracle, _declared, plugin_displacement

__all__ = ["EngineRequest", "PolicyAdapter"]

logger = logging.getLogger("headway.integrations.vllm")


class EngineRequest(Protocol):
    """What the adapter reads from an engine's request (vLLM's ``vllm.v1.request.Request``)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    priority: int
    num_computed_tokens: int

    @property
    def num_output_tokens(self) -> int: ...


def _xargs(engine_req: Any, hints: frozenset[str]) -> Mapping[str, Any]:
    """The request's ``vllm_xargs`` that the plugin reads: ``headway_<hint>`` for ``hints`` (the
    ``request_hints`` setting), and ``headway_request_id`` (copied to the step log only)."""
    params = getattr(engine_req, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not isinstance(extra, Mapping):
        return {}
    return {k: v for k, v in extra.items() if k == "headway_request_id" or (k[8:] in hints and k[:8] == "headway_")}


class PolicyAdapter(PromptScoring):
    """Drives a headway :class:`~headway.core.Policy` for an engine's request objects.

    Engine-agnostic (no vLLM import): it keeps a headway :class:`~headway.core.Request`
    per engine request, makes :class:`HeadwayRequestQueue` objects, and turns engine
    events (enqueue, admit, progress, preempt, finish) into policy calls. Times given to
    the policy are seconds since the adapter was made (``clock() - epoch``); engine
    arrival times on the same clock (vLLM: ``time.time()``) are shifted alike.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        oracle: str = "none",
        max_model_len: int | None = None,
        score_batch: TextScoreFn | None = None,
        decode: Callable[[list[Any]], list[str]] | None = None,
        missing_score: float | None = None,
        observe: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.time,
        epoch: float | None = None,
        request_hints: Collection[str] = REQUEST_HINTS,
        background: bool = False,
    ) -> None:
        """``observe(prompt, output_tokens)`` is told of every request that finished (not aborted)
        with a prompt text: an online learner's ``observe``, which must not block. ``request_hints``:
        the ``vllm_xargs`` a request's own word is taken for (:data:`._settings.REQUEST_HINTS`).
        ``background``: ``score_batch`` runs on a thread of its own (:class:`BackgroundScorer`; the
        plugin's ``scoring`` setting), and a request waits outside the queues until its score is in;
        else each step's arrivals are scored on the engine's thread as the step starts."""
        self._clock = clock
        self.epoch = clock() if epoch is None else epoch
        self.max_model_len = max_model_len
        self.score_batch = score_batch
        self.decode = decode
        self.missing_score = missing_score
        self.observe = observe
        self.request_hints = frozenset(request_hints)
        self.oracle_mode = oracle
        self.reqs: dict[str, Request] = {}
        self.engine: dict[Request, Any] = {}
        self.queues: list[HeadwayRequestQueue] = []
        self._pending: dict[Request, HeadwayRequestQueue] = {}
        # background scoring: the pending requests whose scores the thread has not given back yet
        self.background = background
        self._scorer: BackgroundScorer | None = None  # started at the first request it scores
        self._scoring: dict[Request, HeadwayRequestQueue] = {}
        self._popped: list[Request] = []
        self._timers: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        self._warned: set[str] = set()
        # statistics
        self.policy_time = 0.0
        """Seconds spent in headway code (policy calls, queue operations), cumulative."""
        self.score_time = 0.0
        self.num_scored = 0
        self.num_arrivals = 0
        self.num_displaced = 0
        self.num_missing_scores = 0
        self.num_score_failures = 0
        """Prompts the scorer failed on (they took the missing-score path)."""
        self._awaiting_first: dict[Request, None] = {}
        # per request evicted: the most tokens it had computed at an eviction, and the evictions in a
        # row since that found it with no more (_count_stall)
        self._stalls: dict[Request, tuple[int, int]] = {}
        # the step whose output vLLM is processing (update_from_output): its tokens per request id,
        # for the progress of the requests that finish in it (finish(), before progress())
        self.step_tokens: Mapping[str, int] = {}
        self._running_version = 0
        self._no_victim: tuple[Any, ...] | None = None
        self._score_sum = 0.0
        self._score_n = 0
        self.policy = policy
        self.set_policy(policy, oracle)

    # ----------------------------------------------------------- policy
    def set_policy(self, policy: Policy, oracle: str | None = None) -> None:
        """Use ``policy`` from now on (only while no request is queued or running)."""
        if self.reqs:
            raise RuntimeError("the policy can only be replaced while the engine holds no requests")
        if oracle is not None:
            self.oracle_mode = oracle
        _check_oracle(policy, self.oracle_mode)
        if policy.oracle:
            policy.bind_oracle(self._true_length)
        self.policy = policy
        hooks = type(policy).hooks()
        self._arrival_hook = hooks.on_arrival
        self._progress_hook = hooks.on_progress
        self._finish_hook = hooks.on_finish
        self._timer_hook = hooks.rekey_at_time
        self.custom_victim = hooks.choose_victim
        self.preemptive = bool(policy.preemptive)
        self.displacement = _displacement_mode(policy)
        # a failed displacement check stays failed until the queue head, the running set, the key
        # epoch or a running request's rekey point changes (stable_displacement); the rekey points
        # are tracked in output tokens: the check records how many tokens the nearest one is away
        # (its slack) and progress() counts the most tokens one request may have gained since
        self._skip_failed = hooks.stable_displacement
        self._hinted = hooks.rekey_after_tokens
        self._no_victim = None
        self._no_victim_slack = 0.0
        self._gained = 0
        # per running request id: (valid below this output count, preemptions, key epoch,
        # can_preempt, (key, seq), next rekey point or inf, request); keys hold between rekey
        # hints (the Policy contract) unless the policy watches progress itself; can_preempt is
        # cached only where it changes at hints alone
        self._victim_cache: dict[str, tuple[int, int, int, bool, tuple[PolicyKey, int], float, Request]] = {}
        self._cache_victims = not self._progress_hook
        self._fresh_can_preempt = hooks.can_preempt and not policy.preempt_changes_at_hints
        # vLLM's FCFS queue is a deque: a request put back goes to its front, whatever its arrival
        self.arrival_deque = bool(policy.arrival_deque)
        for q in self.queues:
            q._pq = PolicyQueue(policy)
            q._front.clear()
        self._timers.clear()

    def _true_length(self, req: Request) -> int:
        n = req.max_tokens
        if self.max_model_len is not None:
            n = min(n, max(self.max_model_len - req.num_prompt_tokens, 1))
        e = self.engine.get(req)
        params = getattr(e, "sampling_params", None)
        if params is not None and not getattr(params, "ignore_eos", True) and "ignore_eos" not in self._warned:
            self._warned.add("ignore_eos")
            logger.warning(
                "headway: oracle policy %r reads max_tokens as the true length, but request %s does "
                "not set ignore_eos (benchmark-only mode; its true length may be shorter)",
                self.policy.name,
                req.request_id,
            )
        return n

    # ------------------------------------------------------------ clock
    def now(self) -> float:
        return self._clock() - self.epoch

    # ------------------------------------------------------------ queues
    def make_queue(self) -> HeadwayRequestQueue:
        q = HeadwayRequestQueue(self)
        self.queues.append(q)
        return q

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message + " (warned once)", *args)

    def _request_tier(self, e: Any, value: Any) -> Tier:
        """A client's ``headway_tier`` (premium, standard, batch), else standard."""
        if value is None:
            return Tier.STANDARD
        try:
            return Tier.parse(value)
        except (ValueError, TypeError, AttributeError):
            self._warn_once(
                "bad_tier", "headway: request %s: headway_tier %r is not a tier; standard used", e.request_id, value
            )
            return Tier.STANDARD

    def _new_request(self, e: Any) -> Request:
        xa = _xargs(e, self.request_hints)
        arrival = max(0.0, float(getattr(e, "arrival_time", self._clock())) - self.epoch)
        h = Request(
            request_id=str(e.request_id),
            arrival_time=arrival,
            num_prompt_tokens=max(int(e.num_prompt_tokens), 1),
            max_tokens=max(int(e.max_tokens or 1), 1),
            tenant_id=str(xa.get("headway_tenant", "default")),
            tier=self._request_tier(e, xa.get("headway_tier")),
            priority=int(getattr(e, "priority", 0) or 0),
            category=str(xa["headway_category"]) if "headway_category" in xa else None,
            score=self._request_score(e, xa.get("headway_score")),
            seq=next(self._seq),
        )
        h.queued_time = self.now()
        if "headway_request_id" in xa:
            h.extra["headway.client_id"] = str(xa["headway_request_id"])
        self.reqs[h.request_id] = h
        self.engine[h] = e
        self.num_arrivals += 1
        return h

    def enqueue(self, e: Any, queue: HeadwayRequestQueue, front: bool = False) -> None:
        """An engine request entered ``queue`` (new, preempted, or skipped and put back). ``front``:
        put back at its front (vLLM's ``prepend_request``), which only a policy with
        :attr:`~headway.core.Policy.arrival_deque` (``fcfs``) follows: every other policy puts it
        where its key says."""
        t0 = time.perf_counter()
        h = self.reqs.get(e.request_id)
        if h is None:
            h = self._new_request(e)
            queue._npending += 1
            if self.background and self.score_batch is not None and h.score is None:
                self._score_later(h, queue)
            else:
                self._pending[h] = queue
        else:
            now = self.now()
            self._sync(h, e, now)
            if h.state is RequestState.RUNNING:  # preempted without our hook (e.g. a resumed session)
                self._mark_preempted(h)
            if front and self.arrival_deque:
                queue._front.appendleft(h)
            else:
                queue._pq.add(h, now)
                self._arm_timer(h, now)
        self.policy_time += time.perf_counter() - t0

    def flush(self) -> None:
        """Score and announce the requests that arrived since the last call (one batch); with
        background scoring, those whose scores are in (the others stay pending)."""
        t0 = time.perf_counter()
        if self._scoring:
            self._take_scores()
        if not self._pending:
            self.policy_time += time.perf_counter() - t0
            return
        pending, self._pending = self._pending, {}
        if self.score_batch is not None and not self.background:
            self._score_inline(pending)
        now = self.now()
        policy = self.policy
        for h, q in pending.items():
            q._npending -= 1
            if self._arrival_hook:
                try:
                    policy.on_arrival(h, now)
                except ValueError:
                    if h.score is not None:
                        raise
                    fallback = self.missing_score
                    if fallback is None:
                        fallback = self._score_sum / self._score_n if self._score_n else 0.0
                    h.score = fallback
                    self.num_missing_scores += 1
                    self._warn_once(
                        "missing_score",
                        "headway: request %s has no score for policy %r; using %s (send vllm_xargs "
                        "headway_score or set the scorer setting)",
                        h.request_id,
                        policy.name,
                        fallback,
                    )
                    policy.on_arrival(h, now)
            if h.score is not None:
                self._score_sum += h.score
                self._score_n += 1
            q._pq.add(h, now)
            self._arm_timer(h, now)
        self.policy_time += time.perf_counter() - t0

    def _arm_timer(self, h: Request, now: float) -> None:
        """Remember a queued request's next rekey time (only one still ahead of ``now``)."""
        if self._timer_hook:
            at = self.policy.rekey_at_time(h)
            if at is not None and at > now:
                heapq.heappush(self._timers, (at, h.seq, h))

    def step_start(self) -> None:
        """Before an engine step: arrivals, due rekey timers, key-epoch changes."""
        if self._pending or self._scoring:
            self.flush()
        t0 = time.perf_counter()
        now = self.now()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, h = heapq.heappop(timers)
            if h.is_finished or h.state is RequestState.RUNNING:
                continue
            for q in self.queues:
                if h in q._pq:
                    q._pq.rekey(h, now)
            self._arm_timer(h, now)
        for q in self.queues:
            q._pq.refresh(now)
        self.policy_time += time.perf_counter() - t0

    # --------------------------------------------------------- lifecycle
    def take_popped(self) -> list[Request]:
        popped, self._popped = self._popped, []
        return popped

    def mark_running(self, h: Request, e: Any) -> None:
        """vLLM scheduled ``e`` (``h``'s engine request) from its waiting queue. A request preempted
        with a token in flight (async scheduling) got that token while it waited: its run starts
        with it (``Request.run_start_output_tokens``, which MemGuard reads)."""
        if h.state is not RequestState.RUNNING and not h.is_finished:
            h.num_output_tokens = int(e.num_output_tokens)
            h.transition(RequestState.RUNNING)
            self._running_version += 1
            if h.first_scheduled_time is None:
                h.first_scheduled_time = self.now()
            if h.first_token_time is None and not self._progress_hook:
                self._awaiting_first[h] = None

    def _mark_preempted(self, h: Request) -> None:
        h.num_recomputed_tokens += h.num_computed_tokens
        h.num_computed_tokens = 0
        h.num_preemptions += 1
        h.transition(RequestState.PREEMPTED)

    def preempt(self, e: Any) -> None:
        """The engine is about to evict running request ``e`` (it then re-enters a queue)."""
        t0 = time.perf_counter()
        h = self.reqs.get(e.request_id)
        if h is not None and h.state is RequestState.RUNNING:
            self._sync(h, e, self.now())
            self._count_stall(h)
            self._mark_preempted(h)
            self._running_version += 1
        self.policy_time += time.perf_counter() - t0

    def _count_stall(self, h: Request) -> None:
        """Warn once a request has been evicted :data:`STALL_EVICTIONS` times in a row without having
        computed more than at an earlier eviction: each turn it gets is lost before it gets further
        (a displacement policy's rotation under too small a KV cache), so it may never finish."""
        peak, stalls = self._stalls.get(h, (0, 0))
        if h.num_computed_tokens > peak:
            self._stalls[h] = (h.num_computed_tokens, 0)
            return
        self._stalls[h] = (peak, stalls + 1)
        if stalls + 1 == STALL_EVICTIONS:
            logger.warning(
                "headway: request %s was evicted %d times in a row without computing more than %d tokens "
                "(policy %r): each turn it gets is lost before it gets further, so it may never finish; "
                "a larger KV cache or a policy that displaces less ends it",
                h.request_id, STALL_EVICTIONS, peak, self.policy.name,
            )  # fmt: skip

    def _sync(self, h: Request, e: Any, now: float) -> None:
        out = int(e.num_output_tokens)
        if out != h.num_output_tokens:
            if h.first_token_time is None and out > 0:
                h.first_token_time = now
            h.last_token_time = now
            h.num_output_tokens = out
        if h.state is RequestState.RUNNING:
            h.num_computed_tokens = int(e.num_computed_tokens)

    def progress(self, num_scheduled: Mapping[str, int], max_new_tokens: int | None = None) -> None:
        """After a step: the tokens each request computed.

        Policies that override ``on_progress`` get one call per scheduled request per step
        (with the step's tokens). For the others nothing is done per request: counters are
        synced lazily, before the policy reads a key, at preemption and at finish; only
        requests still waiting for their first token are checked (for its timestamp).

        ``max_new_tokens``: the most output tokens one request can have gained in the step
        (vLLM: 1 plus its speculative tokens); default the largest ``num_scheduled`` count,
        an upper bound since a request gains at most one output token per computed token.
        """
        t0 = time.perf_counter()
        if max_new_tokens is None:
            max_new_tokens = max(num_scheduled.values(), default=0)
        self._gained += max_new_tokens
        now = self.now()
        reqs, engine = self.reqs, self.engine
        if self._progress_hook:
            hook = self.policy.on_progress
            for rid, n in num_scheduled.items():
                h = reqs.get(rid)
                if h is None or h.state is not RequestState.RUNNING:
                    continue
                self._sync(h, engine[h], now)
                if n > 0:
                    hook(h, now, n)
            self._awaiting_first.clear()
        elif self._awaiting_first:
            for h in list(self._awaiting_first):
                e = engine.get(h)
                if e is None or e.num_output_tokens > 0:
                    del self._awaiting_first[h]
                    if e is not None:
                        self._sync(h, e, now)
        self.policy_time += time.perf_counter() - t0

    def finish(self, e: Any, aborted: bool) -> Request | None:
        """``e`` left the engine: finished (``on_finish``) or aborted. Returns its headway request."""
        t0 = time.perf_counter()
        h = self.reqs.pop(e.request_id, None)
        if h is None:
            return None
        self.engine.pop(h, None)
        self._awaiting_first.pop(h, None)
        self._stalls.pop(h, None)
        self._victim_cache.pop(h.request_id, None)
        self._running_version += 1
        self.forget_pending(h)
        for queue in self.queues:
            queue._drop(h)
        now = self.now()
        if h.state is RequestState.RUNNING:
            self._sync(h, e, now)
            # a request that finishes in a step computed its tokens too: its on_progress (progress()
            # runs after vLLM freed it), as for every other request scheduled in the step
            if not aborted and self._progress_hook and (n := self.step_tokens.get(e.request_id, 0)) > 0:
                self.policy.on_progress(h, now, n)
        else:
            h.num_output_tokens = int(e.num_output_tokens)
        if aborted:
            if not h.is_finished:
                h.transition(RequestState.ABORTED)
            h.finish_time = now
        else:
            if h.state is not RequestState.RUNNING:  # stopped while preempted (stale async output)
                h.state = RequestState.RUNNING
            h.transition(RequestState.FINISHED)
            h.finish_time = now
            if self.observe is not None and h.prompt and h.num_output_tokens > 0:
                self.observe(h.prompt, h.num_output_tokens)
            if self._finish_hook:
                self.policy.on_finish(h, now)
        self.policy_time += time.perf_counter() - t0
        return h

    # ------------------------------------------------------- decisions
    def _key(self, e: Any, now: float) -> tuple[PolicyKey, int] | None:
        h = self.reqs.get(e.request_id)
        if h is None:
            return None
        self._sync(h, e, now)
        return (self.policy.key(h, now), h.seq)

    def eviction_order(self, running: Sequence[Any], max_custom: int = 16) -> list[Any]:
        """``running`` reordered so that the policy's victims come last.

        Sorted by key (best first); when the policy overrides ``choose_victim``, its first
        ``max_custom`` choices are moved to the end in reverse order of choice (the
        first victim last), so popping from the end follows ``choose_victim``. For a policy with
        :attr:`~headway.core.Policy.arrival_deque` (``fcfs``), ``running`` as it is: vLLM's FCFS
        evicts the last request of its running list, which need not be the latest to arrive (one
        admitted late, after it waited for its grammar).
        """
        if self.arrival_deque:
            return list(running)
        t0 = time.perf_counter()
        now = self.now()
        known: list[tuple[tuple[PolicyKey, int], Any]] = []
        unknown: list[Any] = []
        for e in running:
            k = self._key(e, now)
            if k is None:
                unknown.append(e)
            else:
                known.append((k, e))
        known.sort(key=lambda t: t[0])
        order = [e for _, e in known]
        if self.custom_victim and len(order) > 1:
            hmap = {id(e): self.reqs[e.request_id] for e in order}
            rest = [hmap[id(e)] for e in order]
            tail: list[Request] = []
            for _ in range(min(max_custom, len(rest) - 1)):
                v = self.policy.choose_victim(rest, now)
                rest.remove(v)
                tail.append(v)
            order = [self.engine[h] for h in rest] + [self.engine[h] for h in reversed(tail)]
        self.policy_time += time.perf_counter() - t0
        return unknown + order

    def _cached_victim(self, bound: tuple[PolicyKey, int], running: Sequence[Any], now: float) -> Any:
        """:meth:`displacement_victim` from cached keys: each running request's key and
        ``can_preempt`` are recomputed only once it reaches its next rekey point (or is
        preempted, or the key epoch moves). Between those points a key may only improve, so a
        cached key is never better than the true one: no cached candidate means no victim, and
        a candidate whose fresh key equals its cached one is the true worst. Anything else:
        ``_RESCAN`` (the caller scans with fresh keys). With no victim it records the slack:
        the fewest output tokens any running request is from its next rekey point.
        ``can_preempt`` is cached only when the policy says it changes at hints alone."""
        policy, reqs, cache = self.policy, self.reqs, self._victim_cache
        epoch, fresh, running_state = policy.key_epoch, self._fresh_can_preempt, RequestState.RUNNING
        cand: Any = None
        cand_h: Request | None = None
        cand_key: tuple[PolicyKey, int] | None = None
        slack = math.inf
        for e in running:
            rid = e.request_id
            out = e.num_output_tokens
            c = cache.get(rid)
            if c is None or out >= c[0] or c[2] != epoch or c[1] != c[6].num_preemptions:
                h = reqs.get(rid)
                if h is None or h.state is not running_state:
                    continue
                self._sync(h, e, now)
                hint = policy.rekey_after_tokens(h)
                # without a hint the key only improves: refresh it each token, but it never
                # turns a failed check into a success (no limit on the slack)
                until = out + max(int(hint), 1) if hint is not None else out + 1
                limit = until if hint is not None else math.inf
                key = (policy.key(h, now), h.seq)
                c = (until, h.num_preemptions, epoch, policy.can_preempt(h, now), key, limit, h)
                cache[rid] = c
            elif c[6].state is not running_state:
                continue
            if c[5] - out < slack:
                slack = c[5] - out
            if (
                c[4] > bound
                and (c[3] or (fresh and policy.can_preempt(c[6], now)))
                and (cand_key is None or c[4] > cand_key)
            ):
                cand, cand_h, cand_key = e, c[6], c[4]
        if cand is None or cand_h is None:
            self._no_victim_slack = slack
            return None
        self._sync(cand_h, cand, now)
        if policy.can_preempt(cand_h, now) and (policy.key(cand_h, now), cand_h.seq) == cand_key:
            return cand
        return _RESCAN

    def displacement_victim(
        self, queue: HeadwayRequestQueue, running: Sequence[Any], candidate: tuple[Request, PolicyKey] | None = None
    ) -> Any | None:
        """For preemptive policies: the running request that ``queue``'s head (or ``candidate``, a
        waiting request further back and its key, from :meth:`waiting_in_order`) should displace.

        The worst-keyed running request that ``can_preempt`` allows, if its key is larger
        than the head's; None otherwise.
        """
        t0 = time.perf_counter()
        try:
            head, head_key = candidate if candidate is not None else (queue._pq.peek(), queue._pq.peek_key())
            if head is None or head_key is None:
                return None
            sig = (head.seq, head_key, self._running_version, self.policy.key_epoch, len(running))
            if sig == self._no_victim and self._gained < self._no_victim_slack:
                return None
            bound = (head_key, head.seq)
            now = self.now()
            self._gained = 0
            if self._cache_victims:
                found = self._cached_victim(bound, running, now)
                if found is not _RESCAN:
                    self._no_victim = sig if found is None and self._skip_failed else None
                    return found
            worst: Any = None
            worst_key: tuple[PolicyKey, int] | None = None
            policy = self.policy
            for e in running:
                h = self.reqs.get(e.request_id)
                if h is None or h.state is not RequestState.RUNNING:
                    continue
                self._sync(h, e, now)
                if not policy.can_preempt(h, now):
                    continue
                k = (policy.key(h, now), h.seq)
                if k > bound and (worst_key is None or k > worst_key):
                    worst, worst_key = e, k
            # a fresh scan records no rekey points: only a hintless policy may skip the next check
            self._no_victim_slack = 0.0 if self._hinted else math.inf
            self._no_victim = sig if worst is None and self._skip_failed else None
            return worst
        finally:
            self.policy_time += time.perf_counter() - t0

    def waiting_in_order(self, queue: HeadwayRequestQueue) -> Iterator[tuple[Any, tuple[Request, PolicyKey] | None]]:
        """``queue``'s requests in the order vLLM will take them (those put back at its front
        first), each engine request with its headway request and key (None for one at the front:
        vLLM's FCFS deque, whose policy displaces nobody)."""
        engine = self.engine
        for h in queue._front:
            yield engine[h], None
        for h, key in queue._pq.keyed():
            yield engine[h], (h, key)


def _displacement_mode(policy: Policy) -> str:
    """:func:`plugin_displacement`, saying once per policy when a declared ``pause`` runs as ``none``."""
    mode = plugin_displacement(policy)
    if mode != _declared(policy):
        logger.warning(
            "headway: policy %r displaces in 'pause' mode, which vLLM's model runner cannot hold; "
            "the plugin runs it without displacement (vLLM's decisions). Set policy_args "
            "displacement='evict' for SGLang-style displacement",
            policy.name,
        )
    return mode


_RESCAN: Any = object()
"""Returned by ``PolicyAdapter._cached_victim`` when the cache cannot decide."""
