"""Async scheduling (``SchedulerConfig.async_scheduling``): what a replica's plan of a step does not see yet.

vLLM's ``AsyncScheduler`` plans a step as the step before it starts, so that plan is made before
that step's output is processed; the replica makes it when that step ends (see ``_replica.py``),
without what that step changed. Its finished requests still hold their slots and KV blocks, and the
requests that arrived while it ran wait, as do the rekey timers due since the plan's time
(``ASYNC_PLAN_DELAY`` after that step started): :meth:`AsyncScheduling._release_unseen` lets them
go after the plan. And the policy reads that plan as the plugin's policy reads vLLM's, at the
plan's time and without that step's output. A running request's ``num_output_tokens`` lacks the
token that step computed for it (vLLM counts it in ``num_computed_tokens`` as it schedules the
step, and in ``num_output_tokens`` as the output comes), and nothing of that step has been
reported: no progress (``on_progress``, LTR's step times, TRAIL's refinements at rekey hints), no
finish (``on_finish``; a request that finished in it still runs, in state RUNNING, and may be
evicted). The decoders' tokens are hidden by the decode clock the policy has seen (``seen_g``, one
step behind ``g`` while the plan is made); a prefill's token by counting it only when
:meth:`AsyncScheduling._deliver` processes the step's output, once the plan is made, as vLLM
processes it after scheduling the next step. There the requests evicted in that plan get their
token without a report (the plugin reports running requests only), as vLLM delivers a preempted
request's output in flight. An arrival at a step's end exactly (a rounding tie, which the event
loop gives to the arrival) comes after that step's plan and output here too, as after a
synchronous step's output (:meth:`AsyncScheduling._end_step_before_arrival`, for both).

**Fast-forward.** So a change that a step's output brings (a rekey hint reached, a prefill's report,
a finish) is first seen by the plan made a step after that output is delivered, and a decode-only
stretch launched right after it would skip that plan: for a displacing policy that launch is one
step (:meth:`AsyncScheduling._deliver` sets ``_news``; ``_decode_horizon``). Decode stretches
otherwise run as with the synchronous scheduler.
"""

from __future__ import annotations

from collections.abc import Callable

from headway.core import Request
from headway.sim._events import STEP_END, TIE_RTOL, tie_floor
from headway.sim._preempt import Preemption
from headway.sim._seq import Seq

__all__ = ["ASYNC_PLAN_DELAY", "DECODES", "FINISHES", "PARTIAL", "AsyncScheduling"]

ASYNC_PLAN_DELAY = 1e-6
"""Async scheduling: seconds after a step starts at which the next step is planned (vLLM's engine
core schedules it as soon as it has launched the step): the requests that arrive by then are in
that plan, later ones in the plan after; so are the rekey timers due by then."""

PARTIAL, DECODES, FINISHES = 0, 1, 2
"""What a prefill's chunk in the step just ended did (:attr:`AsyncScheduling._reports`): left more of its
prefill, or computed its token, after which it decodes, or finishes."""


class AsyncScheduling(Preemption):
    """The step's output that a :class:`~headway.sim.Replica`'s async plan does not see, delivered
    after it (the replica sets every attribute below)."""

    # prefills of the step just ended, their output unseen: (seq, chunk, PARTIAL / DECODES / FINISHES)
    _reports: list[tuple[Seq, int, int]]
    _done: list[Seq]  # decoders that finished in the step just ended, unseen by the policy
    _catch_up_hook: bool  # every step's progress is reported (_decode.py)
    _rekey_hook: bool
    _admission_held: bool
    _news: bool  # the next plan sees what the one just made did not: a stretch may not skip it (_deliver)
    _late: list[Request]  # waiting requests whose rekey timers came after the plan of the step after
    _step_began: float  # when the step that just ended started
    _aborts: list[tuple[float, int, Request]]  # clients' aborts to come
    _plan: Callable[[float], None]  # the replica's: plan the next step (the policy's time)
    _launch: Callable[..., None]  # the replica's: launch the planned step
    _apply_aborts: Callable[[float, float], None]
    _arm_timer: Callable[[Request, float], None]  # the replica's: a queued request's rekey timer
    _arrival_hook: bool  # the policy has an on_arrival hook
    _rekey: Callable[[Request, float], None]  # the replica's: a waiting request's rekey timer is due
    _finished: Callable[[Seq, float], None]  # the replica's: the policy hears that a request finished
    _rekey_due: Callable[[float], None]  # the replica's: the rekey hints reached by the decode clock
    _cut: Callable[[int], None]  # the replica's: end the stretch in flight after its first m steps
    _on_step_end: Callable[[int], None]  # the replica's: the step-end event (of a version)
    plan_extra: float
    version: int
    _launch_pending: bool  # the plan is made and the step's output delivered; the launch waits (_after_arrivals)
    busy: bool
    outstanding: Callable[[], int]  # the replica's: requests queued or running here

    def _end_step_before_arrival(self, now: float) -> None:
        """An arrival at the end of the step in flight (a rounding tie: the event loop takes the arrival
        first). vLLM adds a request after the output of the step it came in, and with async scheduling
        after the plan of the next step, made as that step started: that step ends first, up to its
        output (and that plan), so the policy hears the output before the arrival and the plan does
        not hear the arrival; the plan (async: the release, a plan made again if that one ran nothing,
        and the launch) comes after every arrival at this instant (:meth:`_after_arrivals`). vLLM's API
        server checks those arrivals before it learns that output (:meth:`ApiServerLimits.hold`).
        Not after a step that took no time (nothing came out of it; async: the next step is planned
        at the arrival's time, and the arrival is in it)."""
        start, n = self.plan_start, self.plan_n
        if n == 1:  # (the common case without _step_at's search: it runs at every arrival while busy)
            m, end = 1, start + self.plan_base + self.plan_extra
        else:
            m = self._step_at(tie_floor(now))
            end = start + self._span(m) + (self.plan_extra if m == n else 0.0)
        if end - now > TIE_RTOL * abs(now):
            return
        began = start + self._span(m - 1)
        if began + ASYNC_PLAN_DELAY >= now if self._async else began >= tie_floor(now):
            return
        if self.api is not None:
            self.api.hold(self.outstanding() - len(self._finishing))
        self._cut(m)
        self.version += 1
        self._launch_pending = True  # the step's end stops after its output (and async, its plan)
        self._on_step_end(self.version)

    def _plan_after_step(self, now: float) -> None:
        """Plan the step after the one that just ended, as vLLM planned it as that one started
        (``ASYNC_PLAN_DELAY`` after: the policy's time): without what that step changed (its
        finished requests, the arrivals and rekey timers since, its output), all of which is
        released once it is planned; then launch it. A plan that schedules nothing is made again at
        once with everything released (the engine waits for the step in flight and schedules
        again)."""
        made = min(now, self._step_began + ASYNC_PLAN_DELAY)
        if self._held:  # the plan sees those that arrived by then
            later = []
            for t, req in self._held:
                if t <= made:
                    self._enqueue(req, made)
                else:
                    later.append((t, req))
            self._held = later
        self._plan(made)
        self._deliver(now)  # that step's output, which vLLM processes after scheduling the next
        if self._launch_pending:  # the arrivals at this instant come first (_end_step_before_arrival)
            self._wait_for_arrivals(now)
            return
        self._release_and_launch(now)

    def _wait_for_arrivals(self, now: float) -> None:
        """The step that ended at an arrival's time (:meth:`_end_step_before_arrival`) has had its output:
        no step is in flight until :meth:`_after_arrivals`, after every arrival at this instant."""
        self.plan_n = 0
        self.loop.schedule(now, STEP_END, self._after_arrivals, self.version)

    def _after_arrivals(self, version: int) -> None:
        if version != self.version:
            return
        now = self.loop.now
        self._launch_pending = False
        if self.api is not None:
            self.api.release()
        if self._async:
            self._release_and_launch(now)
            return
        if self._aborts:  # those that came at this instant (vLLM takes them before it schedules)
            self._apply_aborts(now, now)
        if self._held:
            self._release_arrivals(now)
        self._plan(now)
        self._launch(now)

    def _release_and_launch(self, now: float) -> None:
        """After the plan made as the step that just ended started, and that step's output: release what
        the plan did not see and launch the step (the plan made again at once if it scheduled nothing)."""
        if not self.decoders and not any(s.chunk for s in (*self.prefilling, *self._finishing)):
            self._release_unseen(now)
            if self._aborts:  # (the engine waited for the step in flight: it takes those by now)
                self._apply_aborts(now, now)
            self._news = False  # (this plan sees that output)
            self._drained = True  # (no output in flight: a request it displaces has none to come)
            self._plan(now)
            self._drained = False
        elif self._finishing or self._held or self._late:
            self._launch(now, one_step=True)  # the next plan sees what is released now
            self._release_unseen(now)
            return
        self._launch(now)

    def _between_plan_and_launch(self, now: float) -> bool:
        """Whether something that comes now (an arrival, a rekey timer) comes after the plan of the next
        step: a step is in flight and that plan was made as it started, or that plan is made and the
        launch waits for this instant's arrivals (:meth:`_end_step_before_arrival`)."""
        return self._launch_pending or (self.busy and self.plan_n > 0 and now > self._planned_at(now))

    def _planned_at(self, t: float) -> float:
        """When the step after the one in flight at ``t`` was planned (``ASYNC_PLAN_DELAY`` after that one
        started)."""
        return self.plan_start + self._span(self._step_at(t) - 1) + ASYNC_PLAN_DELAY

    def _plan_after_stop(self, budget: int) -> int:
        """A request that stopped on its own (EOS), not at ``max_tokens`` or the model length, gets one
        more token in the step after (vLLM cannot tell it stopped before its output is processed;
        the token is dropped): it takes a decoder's token and KV blocks. (Its output count, its true
        length, counts its last token, in flight for vLLM and maybe unseen here.)"""
        for s in self._finishing:
            req = s.req
            out = s.true_len
            if out < req.max_tokens and req.num_prompt_tokens + out < self.max_model_len and budget > 0:
                self._reserve_chunk(s, 1)
                budget -= 1
        return budget

    def _deliver(self, now: float) -> None:
        """The output of the step that just ended, processed once the next step is planned, in the order
        the synchronous scheduler reports it: the decoders' tokens (every decoder's, for a policy
        that hears each step), those of the requests taken out of the batch, the finishes, the
        rekey hints reached, then the prefills' chunks and tokens. A request no longer in vLLM's
        batch (evicted or paused by the plan) gets its token unreported.

        Sets ``_news`` when that output holds more than the decoders' tokens (a finish, a rekey hint
        reached, a prefill's report, the token of a request taken out of the batch), as the plan
        does when it set requests aside (``_stale``): the plan just made did not see it and the next
        one does, so that one's displacement check may decide otherwise, and ``_decode_horizon``
        launches one step, not a stretch, for a displacing policy. A decode-only stretch skips the
        plans inside it because nothing they see changes but the decoders' tokens; the synchronous
        scheduler's plan sees a step's output at that step's end, where the stretch ends (a
        finish, a rekey hint), but the async one a step later
        (``test_fast_forward_matches_exact_mode_async_preemptive``)."""
        self.seen_g = self.g
        news = bool(self._unseen or self._done or self._reports)
        policy, hook = self.policy, self._progress_hook
        if self._catch_up_hook:
            self._sync_decoders(now)
        for s in self._unseen:  # finished in that step, or taken out of the batch by the plan
            s.req.num_output_tokens += 1
            if hook and self._in_batch(s):
                if self._decode_runs:
                    policy.on_decode_progress(now, ((1, 1, s.since),))
                    s.since = now
                else:
                    policy.on_progress(s.req, now, 1)
        self._unseen.clear()
        for s in self._done:
            self._finished(s, now)
        self._done.clear()
        if self._rekey_hook and self.rekey_heap:
            version = self._run_version
            self._rekey_due(now)
            news = news or self._run_version != version  # (a hint reached: a running key may move)
        rkeys = self._rkeys
        # a prefill's report is a key point (its token may reach a rekey hint's count before any hint
        # is armed): the next plan's displacement check runs, as after _complete_prefills's bump
        if self._reports:
            self._run_version += 1
        for s, chunk, kind in self._reports:
            req = s.req
            if kind != PARTIAL:
                req.num_output_tokens += 1
            if self._in_batch(s):
                if hook:
                    policy.on_progress(req, now, chunk)
                if kind == PARTIAL:
                    if rkeys is not None:  # a key point (the Policy contract)
                        rkeys.chunk_reported(s, req, now)
                elif s in self.decoders:  # a key point as it starts decoding (its report may move the key)
                    self._arm_rekey(s)
                    if rkeys is not None:
                        rkeys.decoding(s, req, now, self.g)
            if kind == FINISHES:
                self._finished(s, now)
        self._reports.clear()
        if news:
            self._news = True

    def _in_batch(self, s: Seq) -> bool:
        """Whether ``s`` is in vLLM's batch (its running list: running, sitting a step out, or finishing
        in the step just ended and not evicted since)."""
        return s in self.decoders or s in self._sitting or s in self._finishing or s in self.prefilling

    def _enqueue(self, req: Request, now: float) -> None:
        """A request the next plan sees joins the queue (the policy hears of its arrival now)."""
        if self._arrival_hook:
            self.policy.on_arrival(req, now)
        self.waiting.add(req, now)
        self._arm_timer(req, now)

    def _release_arrivals(self, now: float) -> None:
        """Every request held until a plan sees it joins the queue (:meth:`submit`): before a
        synchronous plan (or an async one of an idle engine), or once an async plan is made."""
        for _, req in self._held:
            self._enqueue(req, now)
        self._held.clear()

    def _release_unseen(self, now: float) -> None:
        """The requests that finished in the step that just ended give back their slots and blocks (in
        the order they finished), and those that arrived while it ran wait."""
        for s in self._finishing:
            self._leave(s)
        self._finishing.clear()
        self._release_arrivals(now)
        for req in self._late:
            if req in self.waiting:
                self._rekey(req, now)
        self._late.clear()
        self._run_version += 1
        self._admission_held = False
