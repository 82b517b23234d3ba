"""One simulated engine replica: vLLM V1-style continuous batching over a paged KV cache.

Each engine step (vLLM ``schedule()`` + model run) proceeds as V1's scheduler does:

1. running requests first: every decoding request gets one token, partially prefilled
   requests get a prompt chunk; KV blocks are allocated, and when they run out the
   policy's ``choose_victim`` is evicted (recompute or swap) until the rest fit; a step
   that evicted admits nobody;
2. otherwise, preemptive policies whose ``displacement`` mode is not ``"none"`` let a
   better-keyed waiting request that cannot be admitted displace running ones: ``pause``
   (vllm-ltr) takes the slot of the worst-keyed one, which keeps its KV blocks while it
   waits; ``pause`` and ``evict`` (SGLang's retract) evict the worst-keyed block holder
   when KV blocks are short. Nobody is displaced for the token budget alone;
3. waiting requests are admitted in policy order while the token budget,
   ``max_num_seqs`` and free blocks allow (head-of-line: the first that does not fit
   stops admission, as V1); with ``scheduler_reserve_full_isl`` (vLLM 0.32's default)
   the free blocks must hold the request's whole sequence, not only its first chunk.

Step duration comes from the :class:`~headway.sim.CostModel`.

**Prefix caching** (``CacheConfig.enable_prefix_caching``, as vLLM V1's): a request with
nothing computed looks up its block keys in :class:`~headway.sim._prefix.PrefixCache` and
starts after its cached whole blocks (at most ``num_tokens - 1`` tokens); its hashed prompt
blocks are entered when a step is planned that computes them, as vLLM caches a block when it
allocates it, so a request admitted later in the same step hits them (running requests'
chunks are entered after the step's evictions and displacements, before admission); those
filled by decoding are entered when it leaves the batch; freed blocks keep their keys in
the free queue until an allocation reuses them, and blocks freed without one go to its head.
Requests that finish in one step leave in vLLM's running-list order (decoders, then prefills,
each in the order they joined the batch), which orders their blocks in the free queue.

**Differences from vLLM 0.32's decisions** (the differential harness in
``tests/integrations/test_sim_vs_vllm.py`` compares both step by step; every other decision
there is vLLM's):

* a request's workload-keyed blocks filled by decoding enter the prefix cache when it leaves
  the batch, where vLLM caches each as it fills, so a request sharing the text of an answer
  still being generated hits it there, not here
  (``test_blocks_filled_by_decoding_are_cached_when_the_request_leaves``);
* a full block computed again while another block had its key (a hit stops a token short of
  the prompt) holds its place in the free queue but serves no hit once the first is evicted;
  vLLM keeps both under the hash (``test_a_duplicate_block_serves_no_hit_once_the_first_is_evicted``);
* the victim of a KV shortage is the policy's ``choose_victim`` (FCFS: the latest arrival)
  where vLLM's FCFS evicts the last of its running list, and decoders take the token budget
  before partial prefills where vLLM goes in running-list order. Under vLLM's FCFS and
  priority scheduling these decide alike: its running list is in admission order, and a
  prefill gets less than its rest only when the budget runs out, so partial prefills are its
  tail (the harness's hypothesis tests under KV pressure). vLLM's
  ``long_prefill_token_threshold`` and ``watermark`` (0 by default) are not modelled.

**Fast-forward.** A step with no prefill work is a *decode-only* step, and the next
decision cannot differ until something happens: a request finishes, the KV cache
runs out, a policy's rekey hint fires, or a request arrives. So decode-only stretches
are planned as ``n`` steps at once: per-request counters are lazy (a decoding request
stores the global decode-step count at which it joined), block needs come from a
histogram of block-boundary phases, and the stretch's duration is a closed-form sum
(step time is linear in the KV tokens, which grow by the batch size each step). An
arrival in the middle truncates the stretch to the first step boundary after it.
A boundary within a rounding tie before the arrival (``_events.tie_floor``) counts as at
it, as the event loop orders an arrival and a step end: step by step, the boundary is a
sum of step times, in a stretch a closed form, and the two differ by a few ulps.
``SchedulerConfig.max_steps_per_event = 1`` turns this off (the exact reference mode).

**Progress reports in a stretch.** Step by step, a preemptive policy with an
``on_progress`` hook and a non-empty queue has every running request's progress
reported at each step boundary (the displacement check syncs them): one token per
decoder, at that step's end time. Such a stretch reports the same calls: before an
arrival's ``on_arrival`` (or a timer's re-key) in its middle, the steps that have
ended by then, and the rest when it ends. One report of ``k`` tokens would not do:
step time grows with the KV tokens, so an estimator of recent step times (LTR's EMA)
learns a different value from one ``k``-step average than from the ``k`` steps. With
an empty queue, or for other policies, step-by-step mode reports nothing mid-stretch
either, and the stretch reports lazily (at its end, a finish, a preemption or a hint).
A policy that declares ``progress_at_hints`` (its ``on_progress`` acts only at rekey hints)
is reported lazily throughout, and its displacement checks sync no one but the candidates.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Hashable

from headway.core import Policy, PolicyKey, PolicyQueue, Request, RequestState
from headway.sim import _running_keys
from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import CostModel
from headway.sim._events import STEP_END, TIMER, EventLoop, tie_floor
from headway.sim._prefix import PrefixCache, block_keys
from headway.sim._running_keys import RunningKeys
from headway.sim._steps import StepRecord

__all__ = ["Replica"]

# what keeps a waiting request out of the batch (Replica._admission)
_SLOT, _BUDGET, _BLOCKS = 1, 2, 3


class _Seq:
    """Simulator-side state of one request (never shown to policies)."""

    __slots__ = (
        "blocks", "chunk", "fin_g", "gen", "held", "hit", "join", "keys", "lost", "order", "own_end", "phase", "reg",
        "rekey_g", "req", "true_len",
    )  # fmt: skip

    def __init__(self, req: Request, true_len: int, keys: list[Hashable]) -> None:
        self.req = req
        self.true_len = true_len
        # prefix caching (see _prefix.py): the request's block keys, the cached blocks it uses,
        # how many leading blocks are keyed or looked at, the end of its own keyed blocks left
        # behind by an eviction, and the hit found by the last admission check
        self.keys = keys
        self.held: list[Hashable] = []
        self.reg = 0
        self.own_end = 0
        self.hit: list[Hashable] = []
        self.lost = 0  # tokens its last eviction dropped (a cache hit on resume is not recomputed)
        self.blocks = 0  # KV blocks held (prefilling / waiting-after-swap); decoders: derived
        self.chunk = 0  # tokens scheduled in the current step (prefilling only)
        self.join = 0  # global decode-step count when counters were last synced
        self.phase = 0  # (computed - join) mod block_size, for decoders
        self.fin_g = 0  # global decode-step count at which it finishes
        self.rekey_g = -1  # global decode-step count of its next rekey hint (-1: none)
        self.gen = 0  # bumps whenever it leaves the decode set (invalidates heap entries)
        self.order = 0  # when it (re)joined the batch: its place in vLLM's running list


class Replica:
    """A simulated engine with its own queue, batch and KV cache."""

    def __init__(
        self,
        loop: EventLoop,
        policy: Policy,
        cost: CostModel,
        scheduler: SchedulerConfig,
        cache: CacheConfig,
        *,
        name: str = "replica-0",
        on_done: Callable[[Request], None] | None = None,
        truth: dict[Request, int] | None = None,
        record_timeline: bool = False,
        record_steps: bool = False,
    ) -> None:
        self.loop = loop
        self.policy = policy
        self.cost = cost
        self.cfg = scheduler
        self.name = name
        self.bs = cache.block_size
        self.num_blocks = cache.num_gpu_blocks or cost.num_gpu_blocks(cache.gpu_memory_utilization, cache.block_size)
        self.free = self.num_blocks
        self.cache = PrefixCache(self.num_blocks) if cache.enable_prefix_caching else None
        self._dup_ids = itertools.count()  # names of runs of hashed blocks no lookup finds (_free_blocks)
        self._join_ids = itertools.count()  # _Seq.order
        cap = self.num_blocks * self.bs
        if not scheduler.enable_chunked_prefill:
            cap = min(cap, scheduler.max_num_batched_tokens)
        self.max_model_len = cap
        self.waiting = PolicyQueue(policy)
        hooks = policy.hooks()
        # hooks the policy leaves at their defaults are skipped on the hot path
        self._progress_hook = hooks.on_progress
        self._timer_hook = hooks.rekey_at_time
        self._rekey_hook = hooks.rekey_after_tokens
        self._arrival_hook = hooks.on_arrival
        self._finish_hook = hooks.on_finish
        exact = _running_keys.EXACT_SCAN
        # progress between rekey hints may be reported late (Policy.progress_at_hints)
        late_progress = policy.progress_at_hints and not exact
        # stretches report progress step by step when step-by-step mode would (module docstring)
        self._catch_up_hook = self._progress_hook and policy.preemptive and not late_progress
        # displacement modes other than "none" (see headway.core.Policy) check the queue head
        self._displacing = policy.preemptive and policy.displacement != "none"
        self.paused: dict[_Seq, None] = {}  # pause mode: waiting requests that keep their KV blocks
        # the worst-keyed running request, kept lazily (_running_keys.py); a full scan for policies
        # with a progress hook that do not declare how their running keys evolve
        lazy = self._displacing and not exact and (not self._progress_hook or bool(policy.running_keys))
        self._rkeys: RunningKeys[_Seq] | None = RunningKeys(policy) if lazy else None
        # and the worst-keyed paused request (pause mode), in a heap of the same kind
        self._pkeys: RunningKeys[_Seq] | None = (
            RunningKeys(policy, preemptible=False) if lazy and policy.displacement == "pause" else None
        )
        # a check syncs every running request, as step-by-step mode reports progress, unless late is fine
        self._sync_all = lazy and self._progress_hook and not late_progress
        self._admission_held = False  # the step being planned preempted, so it admitted nobody
        # displacement checks are skipped while nothing they read changed (see _start_step);
        # a rekey point bumps _run_version
        self._run_version = 0
        # and likewise for policies whose progress may be reported late and whose running keys and
        # can_preempt only improve or lapse between key points (Policy.running_keys)
        self._static_preemption = hooks.stable_displacement or (late_progress and bool(policy.running_keys))
        self._displace_sig: tuple[object, ...] | None = None
        self.seqs: dict[Request, _Seq] = {}
        self.decoders: dict[_Seq, None] = {}  # insertion-ordered set
        self.prefilling: list[_Seq] = []
        self.g = 0  # decode steps run so far (the lazy counters' clock)
        self.hist = [0] * self.bs  # decoders per block-boundary phase
        self.s_off = 0  # sum over decoders of (computed - join)
        self.fin_heap: list[tuple[int, int, int, _Seq]] = []
        self.rekey_heap: list[tuple[int, int, int, _Seq]] = []
        self.on_done = on_done
        self.truth: dict[Request, int] = {} if truth is None else truth
        self.swap_cost = 0.0
        # the step in flight
        self.busy = False
        self.version = 0
        self.plan_start = 0.0
        self.plan_n = 0
        self.plan_base = 0.0
        self.plan_slope = 0.0
        self.plan_extra = 0.0  # frontend time added to the step in flight by arrivals (per_arrival)
        self.plan_reported = -1  # steps of the stretch in flight reported (-1: reports are lazy)
        self.unseen: list[Request] = []  # arrived since the last step started (queued_time unset)
        # statistics
        self.num_steps = 0
        self.num_step_events = 0
        self.num_preemptions = 0  # evictions (KV freed)
        self.num_pauses = 0  # pause mode: requests taken out of the batch with their KV kept
        self.max_step_tokens = 0  # largest token count of one step (budget check)
        self.timeline: list[tuple[float, int, int, int]] | None = [] if record_timeline else None
        # each step's decisions (StepRecord), when recorded
        self.steps: list[StepRecord] | None = [] if record_steps else None
        self._step_preempted: list[str] = []
        self._step_cached: list[tuple[str, int]] = []

    # ------------------------------------------------------------ arrivals
    @property
    def num_running(self) -> int:
        return len(self.decoders) + len(self.prefilling)

    def outstanding(self) -> int:
        """Requests queued or running here (for routers)."""
        return len(self.waiting) + self.num_running

    def submit(self, req: Request, true_len: int) -> None:
        """A request arrives now (called from the simulator's arrival event)."""
        now = self.loop.now
        if req.num_prompt_tokens >= self.max_model_len:
            req.transition(RequestState.ABORTED)
            req.finish_time = now
            # one reason per engine, not per prompt length: summaries count requests by reason
            req.extra["abort_reason"] = f"prompt does not fit max_model_len {self.max_model_len}"
            if self.on_done is not None:
                self.on_done(req)
            return
        true_len = min(true_len, req.max_tokens, self.max_model_len - req.num_prompt_tokens)
        self.truth[req] = true_len
        keys: list[Hashable] = []
        if self.cache is not None and req.block_hashes:
            keys = block_keys(req.block_hashes, req.hash_block_size, req.num_prompt_tokens, self.bs)
        s = _Seq(req, true_len, keys)
        self.seqs[req] = s
        # a step ending at or after tie_floor(now) is still in flight: a rounding tie goes to the
        # arrival, as in the event loop, whichever way each mode rounded that step's end
        if self.plan_reported >= 0:
            self._catch_up(tie_floor(now))
        if self._arrival_hook:
            self.policy.on_arrival(req, now)
        self.waiting.add(req, now)
        self._arm_timer(req)
        self.unseen.append(req)
        self._poke(now, True)
        if self.plan_n and self.cost.per_arrival:
            # the server's frontend takes the engine's CPU to receive it: the step in flight
            # (the plan was just cut to it) ends later; an idle engine loses nothing
            self.plan_extra += self.cost.per_arrival
            self.version += 1
            end = self.plan_start + self._span(self.plan_n) + self.plan_extra
            self.loop.schedule(end if end > now else now, STEP_END, self._on_step_end, self.version)

    def _arm_timer(self, req: Request) -> None:
        if not self._timer_hook:
            return
        at = self.policy.rekey_at_time(req)
        if at is not None and at > self.loop.now:
            self.loop.schedule(at, TIMER, self._on_timer, req)

    def _on_timer(self, req: Request) -> None:
        if req in self.waiting:
            now = self.loop.now
            if self.plan_reported >= 0:
                self._catch_up(now)
            self.waiting.rekey(req, now)
            if self._pkeys is not None and self.seqs[req] in self.paused:
                self._pkeys.push(self.seqs[req], req, now)
            self._arm_timer(req)
            self._poke(now)

    def _poke(self, now: float, arrival: bool = False) -> None:
        """Something changed the queue: start a step, or cut a decode stretch short (to the step
        in flight at ``now``, or for an arrival at its ``tie_floor``)."""
        if not self.busy:
            # start after every event at this instant (simultaneous arrivals share a step)
            self.busy = True
            self.plan_n = 0
            self.version += 1
            self.loop.schedule(now, STEP_END, self._on_kick, self.version)
        elif self.plan_n > 1:
            self._truncate(tie_floor(now) if arrival else now)

    def _on_kick(self, version: int) -> None:
        if version == self.version:
            self._start_step(self.loop.now)

    # ---------------------------------------------------------- durations
    def _span(self, n: int) -> float:
        """Duration of the first ``n`` steps of the current plan (closed form)."""
        return n * self.plan_base + self.plan_slope * (n * (n - 1) // 2)

    def _step_at(self, t: float) -> int:
        """The plan's step in flight at ``t`` (1-based): the smallest ``m`` with
        ``start + span(m) >= t``, or the last step when the plan ends by ``t``."""
        start, n = self.plan_start, self.plan_n
        if start + self._span(n) <= t:
            return n
        d = t - start
        a, b = self.plan_slope / 2.0, self.plan_base - self.plan_slope / 2.0
        m = math.ceil(d / b) if a == 0.0 else math.ceil((-b + math.sqrt(b * b + 4.0 * a * d)) / (2.0 * a))
        m = min(max(m, 1), n)
        while m > 1 and start + self._span(m - 1) >= t:
            m -= 1
        while m < n and start + self._span(m) < t:
            m += 1
        return m

    def _truncate(self, t: float) -> None:
        start, n = self.plan_start, self.plan_n
        m = self._step_at(t)
        if m >= n:
            return
        self.free += self._cum_blocks(n) - self._cum_blocks(m)
        self.plan_n = m
        if self.steps:
            self.steps[-1] = dataclasses.replace(self.steps[-1], num_steps=m)
        self.version += 1
        end, now = start + self._span(m), self.loop.now
        # a step that ended within a rounding tie before now ends now (as its stale event would)
        self.loop.schedule(end if end > now else now, STEP_END, self._on_step_end, self.version)

    # -------------------------------------------------------- lazy decode
    def _sync(self, s: _Seq, now: float) -> None:
        """Bring a decoder's visible counters up to date and report the progress."""
        delta = self.g - s.join
        if delta:
            req = s.req
            req.num_output_tokens += delta
            req.num_computed_tokens += delta
            req.last_token_time = now
            s.join = self.g
            if self._progress_hook:
                self.policy.on_progress(req, now, delta)

    def _catch_up(self, now: float) -> None:
        """Before a hook in the middle of a stretch: report the steps that ended before ``now``."""
        self._report_steps(self._step_at(now) - 1)

    def _report_steps(self, upto: int) -> None:
        """Report the decoders' progress in steps ``plan_reported + 1 .. upto`` of the stretch in
        flight as step-by-step mode's displacement checks do: at each step's end time, one token
        per decoder, in decoder order. Their ``join`` then runs ahead of ``g`` until the stretch
        ends."""
        first = self.plan_reported + 1
        if upto < first:
            return
        self.plan_reported = upto
        policy, start, g = self.policy, self.plan_start, self.g
        for j in range(first, upto + 1):
            at = start + self._span(j)
            target = g + j
            for s in self.decoders:
                delta = target - s.join
                if delta:
                    req = s.req
                    req.num_output_tokens += delta
                    req.num_computed_tokens += delta
                    req.last_token_time = at
                    s.join = target
                    policy.on_progress(req, at, delta)

    def _add_decoder(self, s: _Seq) -> None:
        req = s.req
        s.join = self.g
        off = req.num_computed_tokens - self.g
        s.phase = off % self.bs
        self.hist[s.phase] += 1
        self.s_off += off
        self.decoders[s] = None
        s.fin_g = self.g + s.true_len - req.num_output_tokens
        # requests finishing in one step leave in running-list order, as vLLM frees their blocks
        heapq.heappush(self.fin_heap, (s.fin_g, s.order, s.gen, s))
        self._arm_rekey(s)
        if self._rkeys is not None:  # a countdown key counts down from here (Policy.running_keys)
            self._rkeys.decoding(s, req, self.loop.now, self.g)

    def _arm_rekey(self, s: _Seq) -> None:
        if not self._rekey_hook:
            return
        hint = self.policy.rekey_after_tokens(s.req)
        if hint is not None:
            s.rekey_g = self.g + max(int(hint), 1)
            heapq.heappush(self.rekey_heap, (s.rekey_g, s.req.seq, s.gen, s))
        else:
            s.rekey_g = -1

    def _remove_decoder(self, s: _Seq) -> None:
        del self.decoders[s]
        self.hist[s.phase] -= 1
        self.s_off -= s.req.num_computed_tokens - s.join
        s.gen += 1
        s.blocks = -(-s.req.num_computed_tokens // self.bs)

    # ------------------------------------------------------------- leaving
    def _free_blocks(self, s: _Seq, evicted: bool) -> None:
        """Give back all of ``s``'s blocks. With prefix caching its full blocks keep their keys in
        the free queue: its workload-keyed ones (those filled by decoding are keyed now), and its
        other computed full blocks too, under keys only it has (vLLM hashes every full block):
        an evicted request finds them again when it resumes, and a finished one's hold their
        place in the queue. A full block computed again while another block had its key (vLLM
        keeps both under the hash) holds its place under a key nothing looks up. The rest (its
        partial last block) goes to the head of the queue."""
        cache = self.cache
        if cache is not None:
            cache.settle(self.free)
            req = s.req
            full = req.num_computed_tokens // self.bs
            keys, held = s.keys, s.held
            for i in range(s.reg, min(full, len(keys))):
                if cache.insert(keys[i]):
                    held.append(keys[i])
            own: list[Hashable] = []
            if evicted and full > len(keys):
                seq = req.seq
                for i in range(max(s.reg, len(keys)), full):
                    key = (seq, i, -1)
                    if not cache.cached(key):
                        own.append(key)
                s.own_end = full
            own.reverse()
            held.reverse()
            # its other full blocks: a finished request's own, duplicates (hashed in vLLM, found by nobody here)
            full = min(full, s.blocks)
            hidden = max(full - len(held) - len(own), 0)
            # blocks shared with running requests stay in use
            unhashed = s.blocks - len(held) - len(own) - hidden
            self.free += cache.release(unhashed, own, hidden, held, next(self._dup_ids))
            s.held = []
            s.reg = 0
        else:
            self.free += s.blocks
        s.blocks = 0

    def _finish(self, s: _Seq, now: float) -> None:
        req = s.req
        if self._rkeys is not None:
            self._rkeys.drop(s)
        self._free_blocks(s, False)
        req.finish_time = now
        req.transition(RequestState.FINISHED)
        self._run_version += 1
        del self.seqs[req]
        if self._finish_hook:
            self.policy.on_finish(req, now)
        if self.on_done is not None:
            self.on_done(req)

    def _leave_batch(self, s: _Seq, now: float) -> Request:
        """Take a running request out of the batch (evicted or paused): its counters synced, its
        step chunk dropped (its step reservations must already be returned)."""
        if self.steps is not None:
            self._step_preempted.append(s.req.request_id)
        if self._rkeys is not None:
            self._rkeys.drop(s)
        if s in self.decoders:
            self._sync(s, now)
            self._remove_decoder(s)
        else:
            self.prefilling.remove(s)
            s.chunk = 0
        return s.req

    def _evict_kv(self, s: _Seq) -> None:
        """Free an evicted request's KV blocks: swapped out (charged at the swap cost) or dropped,
        its computed tokens to be recomputed on resume."""
        req = s.req
        self._free_blocks(s, self.cfg.preemption_mode == "recompute")
        if self.cfg.preemption_mode == "swap":
            self.swap_cost += self.cost.swap_per_token * req.num_computed_tokens
        else:
            req.num_recomputed_tokens += req.num_computed_tokens
            s.lost = req.num_computed_tokens
            req.num_computed_tokens = 0
        self.num_preemptions += 1

    def _requeue(self, req: Request, now: float) -> None:
        """A request taken out of the batch waits again (a preemption of it)."""
        req.num_preemptions += 1
        self._run_version += 1
        req.transition(RequestState.PREEMPTED)
        self.waiting.add(req, now)
        self._arm_timer(req)

    def _preempt(self, s: _Seq, now: float) -> None:
        """Evict a running request (its step reservations must already be returned)."""
        req = self._leave_batch(s, now)
        self._evict_kv(s)
        self._requeue(req, now)

    def _pause(self, s: _Seq, now: float) -> None:
        """Pause mode: take a running request out of the batch; it keeps its KV blocks and waits
        (its step reservations must already be returned). Counts as a preemption of the request."""
        req = self._leave_batch(s, now)
        self.paused[s] = None
        req.num_pauses += 1
        self.num_pauses += 1
        self._requeue(req, now)
        if self._pkeys is not None:  # keyed as the queue keys it, after the preemption
            self._pkeys.push(s, req, now)

    def _drop_paused(self, s: _Seq) -> None:
        """A KV shortage evicts a paused request: its blocks are freed, it recomputes on resume."""
        if self.steps is not None:
            self._step_preempted.append(s.req.request_id)
        del self.paused[s]
        if self._pkeys is not None:
            self._pkeys.drop(s)
        self._evict_kv(s)
        self._run_version += 1

    def _sync_now(self, s: _Seq) -> None:
        if s in self.decoders:
            self._sync(s, self.loop.now)

    def _running_items(self) -> list[tuple[_Seq, Request, int | None]]:
        """Running requests for RunningKeys.push: decoders with the decode clock, then prefills."""
        return [(s, s.req, self.g) for s in self.decoders] + [(s, s.req, None) for s in self.prefilling]

    def _paused_items(self) -> list[tuple[_Seq, Request, int | None]]:
        return [(s, s.req, None) for s in self.paused]

    def _running(self, now: float) -> list[Request]:
        for s in self.decoders:
            self._sync(s, now)
        return [s.req for s in self.decoders] + [s.req for s in self.prefilling]

    # ------------------------------------------------------------ planning
    def _blocks_for(self, s: _Seq, chunk: int) -> int:
        return -(-(s.req.num_computed_tokens + chunk) // self.bs) - s.blocks

    def _start_step(self, now: float) -> None:
        if self.unseen:
            for req in self.unseen:
                req.queued_time = now
            self.unseen.clear()
        self.waiting.refresh(now)
        budget = self.cfg.max_num_batched_tokens - len(self.decoders)
        need = self.hist[-self.g % self.bs]
        self.free -= need
        budget = self._plan_running_prefills(budget)
        if self.free < 0:
            # vLLM: a running request short of KV blocks preempts the policy's victim, and a step
            # that preempted admits nobody (so the next step may: a decode-only plan stops after one)
            self._evict_for_memory(now, budget)
            self._admission_held = True
            self._register_prefills()
        else:
            if self._displacing and self.waiting:
                # Running keys only improve between rekey hints (the Policy contract; a hint bumps
                # _run_version), so with the same queue head, running set and key epoch as after the
                # last check nobody can be displaced now. Policies with a progress hook, or a
                # can_preempt that may change between hints, are checked at every step.
                sig = (self.waiting.peek(), self.waiting.peek_key(), self._run_version, self.policy.key_epoch)
                if not self._static_preemption or sig != self._displace_sig:
                    budget = self._displace(now, budget)
                    # a check cut short by an exhausted token budget proves nothing for later steps
                    self._displace_sig = (
                        (self.waiting.peek(), self.waiting.peek_key(), self._run_version, self.policy.key_epoch)
                        if budget > 0
                        else None
                    )
            self._register_prefills()
            self._admit(now, budget)
        self._launch(now)

    def _plan_running_prefills(self, budget: int) -> int:
        for s in self.prefilling:
            req = s.req
            chunk = min(req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens, budget)
            s.chunk = chunk
            blocks = self._blocks_for(s, chunk)
            s.blocks += blocks
            self.free -= blocks
            budget -= chunk
        return budget

    def _release_step(self, s: _Seq) -> int:
        """Return what ``s`` reserved for the step being planned; gives back its budget."""
        if s in self.decoders:
            if s.phase == -self.g % self.bs:
                self.free += 1
            return 1
        blocks = self._blocks_for(s, 0)  # negative: the chunk's reservation
        s.blocks += blocks
        self.free -= blocks
        return s.chunk

    def _evict_for_memory(self, now: float, budget: int) -> int:
        """Evict the policy's victims until the running requests' blocks fit. In pause mode the
        paused requests hold blocks too and are candidates (they rank below the running ones)."""
        while self.free < 0 and (self.num_running or self.paused):
            pool = self._running(now)
            if self.paused:
                pool += [s.req for s in self.paused]
            s = self.seqs[self.policy.choose_victim(pool, now)]
            if s in self.paused:
                self._drop_paused(s)
            else:
                budget += self._release_step(s)
                self._preempt(s, now)
        return budget

    def _displace(self, now: float, budget: int) -> int:
        """Preemptive policies: a better-keyed waiting request that cannot be admitted displaces the
        worst-keyed running one, in the policy's ``displacement`` mode: ``pause`` takes a slot or
        token budget from it (it keeps its KV), and evicts the worst-keyed block holder for KV
        blocks; ``evict`` evicts for KV blocks only. Nobody is displaced for the token budget
        alone when chunked prefill is on (any budget admits a chunk)."""
        policy = self.policy
        pause = policy.displacement == "pause"
        rkeys = self._rkeys
        keys = None if rkeys is not None else {r: (policy.key(r, now), r.seq) for r in self._running(now)}
        if self._sync_all:
            self._running(now)
        while self.waiting and budget > 0:  # an exhausted token budget is no reason to evict
            cand = self.waiting.peek()
            assert cand is not None
            chunk, short = self._admission(self.seqs[cand], budget)
            if chunk:
                self.waiting.pop()
                # its blocks are entered after the displacement check (which may evict it again)
                self._start_running(self.seqs[cand], chunk, now, register=False)
                budget -= chunk
                if keys is not None:
                    keys[cand] = (policy.key(cand, now), cand.seq)
                continue
            ckey = (self.waiting.peek_key(), cand.seq)
            if short != _BLOCKS and not pause:
                break  # evict mode: a full batch or budget displaces nobody
            pool: dict[Request, tuple[PolicyKey, int]]
            if keys is not None:
                pool = {r: k for r, k in keys.items() if k > ckey and policy.can_preempt(r, now)}
            else:
                assert rkeys is not None
                head_key = self.waiting.peek_key()
                assert head_key is not None
                found = rkeys.worst((head_key, cand.seq), now, self._sync_now, self._running_items, self.g)
                pool = {} if found is None else {found[0].req: found[1]}
            if short == _BLOCKS and self.paused:
                if self._pkeys is not None:
                    head = self.waiting.peek_key()
                    assert head is not None
                    held = self._pkeys.worst((head, cand.seq), now, self._sync_now, self._paused_items, skip=cand)
                    if held is not None:
                        pool[held[0].req] = held[1]
                else:
                    for p in self.paused:
                        if p.req is not cand:
                            pool[p.req] = (policy.key(p.req, now), p.req.seq)
                    pool = {r: k for r, k in pool.items() if k > ckey}
            if not pool:
                break
            worst = max(pool, key=pool.__getitem__)
            s = self.seqs[worst]
            if s in self.paused:
                self._drop_paused(s)
                continue
            if keys is not None:
                del keys[worst]
            budget += self._release_step(s)
            if short == _BLOCKS:
                self._preempt(s, now)
            else:
                self._pause(s, now)
        return budget

    def _admission(self, s: _Seq, budget: int) -> tuple[int, int]:
        """Tokens ``s`` would be scheduled now and 0, or 0 and what it lacks (_SLOT, _BUDGET,
        _BLOCKS), checked in vLLM's order."""
        if self.num_running >= self.cfg.max_num_seqs:
            return 0, _SLOT
        if budget <= 0:
            return 0, _BUDGET
        req = s.req
        computed = req.num_computed_tokens
        total = req.num_prompt_tokens + req.num_output_tokens
        touched = 0
        if self.cache is not None and not computed and (s.keys or s.own_end):
            # vLLM looks up the prefix cache for a request with nothing computed; a hit is whole
            # blocks, at most num_tokens - 1 tokens (the last one is computed for its logits)
            keys = s.keys
            if s.own_end > len(keys):
                keys = keys + [(req.seq, i, -1) for i in range(len(keys), s.own_end)]
            self.cache.settle(self.free)
            h, touched = self.cache.hit_length(keys, (total - 1) // self.bs)
            s.hit = keys[:h]
            computed = h * self.bs
        num_new = total - computed
        if num_new > budget:
            if not self.cfg.enable_chunked_prefill:
                return 0, _BUDGET
            num_new = budget
        # vLLM's allocate_slots: new blocks (a hit's blocks in the free queue count too) for the
        # whole sequence (scheduler_reserve_full_isl), then for the tokens of this step
        end = min(total, self.max_model_len) if self.cfg.scheduler_reserve_full_isl else computed + num_new
        if -(-end // self.bs) - s.blocks - len(s.hit) + touched > self.free:
            return 0, _BLOCKS
        return num_new, 0

    def _register(self, s: _Seq) -> None:
        """Enter ``s``'s keyed blocks that its scheduled chunk fills into the prefix cache: vLLM
        caches a block when it allocates it for a step, so a request admitted later in the same
        step already hits it."""
        keys = s.keys
        full = min((s.req.num_computed_tokens + s.chunk) // self.bs, len(keys))
        if full <= s.reg:
            return
        cache = self.cache
        assert cache is not None
        cache.settle(self.free)
        for i in range(s.reg, full):
            if cache.insert(keys[i]):
                s.held.append(keys[i])
        s.reg = full

    def _register_prefills(self) -> None:
        if self.cache is not None:
            for s in self.prefilling:
                if s.keys:
                    self._register(s)

    def _start_running(self, s: _Seq, chunk: int, now: float, *, register: bool = True) -> None:
        req = s.req
        if s in self.paused:
            del self.paused[s]
            if self._pkeys is not None:
                self._pkeys.drop(s)
        elif req.num_computed_tokens and self.cfg.preemption_mode == "swap":
            self.swap_cost += self.cost.swap_per_token * req.num_computed_tokens
        cache = self.cache
        if cache is not None and not req.num_computed_tokens:
            hit = s.hit
            if hit:  # take the cached blocks (admission just looked them up, the cache settled)
                for key in hit:
                    if cache.acquire(key):
                        self.free -= 1
                s.held.extend(hit)
                s.blocks += len(hit)
                s.reg = len(hit)
                req.num_computed_tokens = len(hit) * self.bs
                req.num_recomputed_tokens -= min(req.num_computed_tokens, s.lost)
                s.hit = []
            # vLLM's PrefixCacheStats: new requests, and apart the resumed ones
            if self.steps is not None:
                self._step_cached.append((req.request_id, req.num_computed_tokens))
            if req.first_scheduled_time is None:
                cache.queries += req.num_prompt_tokens
                cache.hits += req.num_computed_tokens
                req.num_cached_tokens = req.num_computed_tokens
            else:
                cache.preempted_queries += req.num_prompt_tokens + req.num_output_tokens
                cache.preempted_hits += req.num_computed_tokens
            s.lost = 0
        blocks = self._blocks_for(s, chunk)
        s.blocks += blocks
        self.free -= blocks
        s.chunk = chunk
        if register and cache is not None and s.keys:
            self._register(s)
        req.transition(RequestState.RUNNING)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        s.order = next(self._join_ids)
        self.prefilling.append(s)
        self._run_version += 1
        if self._rkeys is not None:
            self._rkeys.push(s, req, now)

    def _admit(self, now: float, budget: int) -> None:
        waiting, seqs = self.waiting, self.seqs
        while waiting:
            req = waiting.peek()
            assert req is not None
            s = seqs[req]
            chunk, _ = self._admission(s, budget)
            if not chunk:
                break
            waiting.pop()
            self._start_running(s, chunk, now)
            budget -= chunk

    def _launch(self, now: float) -> None:
        num_dec = len(self.decoders)
        kv0 = self.s_off + num_dec * (self.g + 1)
        cost = self.cost
        if self.prefilling or self.swap_cost:
            tokens = num_dec
            kv = kv0
            for s in self.prefilling:
                tokens += s.chunk
                kv += s.req.num_computed_tokens + s.chunk
            if tokens > self.max_step_tokens:
                self.max_step_tokens = tokens
            self.plan_base = cost.step_time(tokens, num_dec + len(self.prefilling), kv) + self.swap_cost
            self.swap_cost = 0.0
            self.plan_slope = 0.0
            n = 1
        elif num_dec:
            if num_dec > self.max_step_tokens:
                self.max_step_tokens = num_dec
            self.plan_base = cost.step_time(num_dec, num_dec, kv0)
            self.plan_slope = cost.per_kv_token * num_dec
            n = self._decode_horizon()
        else:
            self._admission_held = False
            self.busy = False
            return
        self._admission_held = False
        self.busy = True
        self.plan_start = now
        self.plan_n = n
        if self.steps is not None:
            self._record_step(now, n)
        self.plan_extra = 0.0
        if self._catch_up_hook and n > 1 and self.waiting:
            self.plan_reported = 0  # step by step, each boundary reports progress (_report_steps)
        self.version += 1
        self.loop.schedule(now + self._span(n), STEP_END, self._on_step_end, self.version)

    def _record_step(self, now: float, n: int) -> None:
        scheduled = [(s.req.request_id, 1) for s in self.decoders]
        scheduled += [(s.req.request_id, s.chunk) for s in self.prefilling]
        assert self.steps is not None
        self.steps.append(StepRecord(now, tuple(scheduled), tuple(self._step_preempted), tuple(self._step_cached), n))
        self._step_preempted.clear()
        self._step_cached.clear()

    def _cum_blocks(self, k: int) -> int:
        """Blocks that decode steps ``0..k-1`` of a plan starting now need (O(block_size))."""
        g, bs, hist = self.g, self.bs, self.hist
        full, rem = divmod(k, bs)
        total = full * len(self.decoders)
        for j in range(rem):
            total += hist[-(g + j) % bs]
        return total

    def _decode_horizon(self) -> int:
        """How many decode-only steps can run before anything could change (>= 1).

        Step 0's blocks are already reserved; further steps are reserved here while
        they fit (binary search over the monotone cumulative block need).
        """
        g = self.g
        if self._admission_held and self.waiting:
            return 1  # the next step may admit what this one could not (it preempted)
        n = min(self.fin_heap[0][0] - g, self.cfg.max_steps_per_event)
        if self.rekey_heap:
            n = min(n, max(self.rekey_heap[0][0] - g, 1))
        if n > 1:
            first = self._cum_blocks(1)
            room = self.free + first
            if self._cum_blocks(n) > room:
                lo, hi = 1, n  # cum(lo) fits, cum(hi) does not
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._cum_blocks(mid) <= room:
                        lo = mid
                    else:
                        hi = mid
                n = lo
            self.free -= self._cum_blocks(n) - first
        return n

    # ------------------------------------------------------------ step end
    def _on_step_end(self, version: int) -> None:
        if version != self.version:
            return
        now = self.loop.now
        n = self.plan_n
        if self.plan_reported >= 0:
            self._report_steps(n - 1)  # the stretch's last step is reported as step by step below
            self.plan_reported = -1
        self.g += n
        self.num_steps += n
        self.num_step_events += 1
        # vLLM handles a step's requests in running-list order: decoders, then prefills
        self._complete_decodes(now)
        self._complete_prefills(now)
        if self.timeline is not None:
            self.timeline.append((now, len(self.waiting), self.num_running, self.num_blocks - self.free))
        self._start_step(now)

    def _complete_prefills(self, now: float) -> None:
        if not self.prefilling:
            return
        self._run_version += 1  # prefill progress moves keys and phases (no token hints for it)
        still: list[_Seq] = []
        done: list[_Seq] = []
        for s in self.prefilling:  # their blocks entered the prefix cache when the step was planned
            req = s.req
            req.num_computed_tokens += s.chunk
            if req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                still.append(s)
                if s.chunk and self._progress_hook:
                    self.policy.on_progress(req, now, s.chunk)
                continue
            req.num_output_tokens += 1
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            if self._progress_hook:
                self.policy.on_progress(req, now, s.chunk)
            done.append(s)
        self.prefilling = still
        for s in done:
            s.chunk = 0
            if s.req.num_output_tokens >= s.true_len:
                self._finish(s, now)
            else:
                self._add_decoder(s)

    def _complete_decodes(self, now: float) -> None:
        g, heap = self.g, self.fin_heap
        while heap and heap[0][0] <= g:
            _, _, gen, s = heapq.heappop(heap)
            if gen != s.gen:
                continue
            self._sync(s, now)
            self._remove_decoder(s)
            self._finish(s, now)
        heap = self.rekey_heap
        while heap and heap[0][0] <= g:
            _, _, gen, s = heapq.heappop(heap)
            if gen != s.gen or s.rekey_g > g:
                continue
            self._sync(s, now)
            self._arm_rekey(s)
            self._run_version += 1  # an announced key (or can_preempt) change of a running request
            if self._rkeys is not None:
                self._rkeys.push(s, s.req, now, g)
