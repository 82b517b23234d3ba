"""Decoding requests' lazy counters and decode-only stretches of a replica (fast-forward).

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
With async scheduling a plan sees a step's output a step late (``_async.py``): a stretch ends where
the synchronous one does (a finish, a rekey hint, KV blocks), and for a displacing policy the step
launched after an output that held such a change is one step, so that the plan after it, which sees
the change, is made (``_decode_horizon``).
``SchedulerConfig.max_steps_per_event = 1`` turns this off (the exact reference mode).

**Progress reports in a stretch.** A preemptive policy with an ``on_progress`` hook that does not
declare ``progress_at_hints`` (LTR: its step-time estimate learns from every step) has every
running request's progress reported at each step's end, in every mode and whoever waits, as the
vLLM plugin reports it after every step: one token per decoder, at that step's end time. A stretch
reports the same calls: at its end, and before an arrival's ``on_arrival`` in its middle (or a
timer's re-key), the steps that have ended by then, a step ending with the arrival (within a
rounding tie) included: vLLM processes a step's output before it adds the requests that came
during it. One report of ``k`` tokens would not do: step time grows with the KV tokens, so an
estimator of recent step times (LTR's EMA) learns a different value from one ``k``-step average
than from the ``k`` steps. Other policies' progress is reported lazily (at a stretch's end, a
finish, a preemption or a hint); so is that of a policy that declares ``progress_at_hints`` (its
``on_progress`` acts only at rekey hints), whose displacement checks sync no one but the candidates.

**Decode progress in runs.** A policy with ``on_decode_progress`` (LTR) gets the same reports of
its decoders, at the same times and in the same order, as runs ``(count, tokens, since)``
instead of one ``on_progress`` per decoder, and their counters stay lazy as for other policies.
A whole-batch report at decode clock ``rep_g`` (time ``rep_t``) is not written into each
decoder: a decoder whose ``join`` is below ``rep_g`` was in that batch and reported then; one
synced or started decoding since reported at its ``join``, at its ``since``. The tokens of a
report are the clock's advance from there (what ``join`` would have been, one call per decoder).
``PER_REQUEST_PROGRESS`` (tests) turns this off.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from headway.core import Policy, PolicyQueue, Request
from headway.sim._config import SchedulerConfig
from headway.sim._events import TIE_RTOL, EventLoop, tie_floor
from headway.sim._running_keys import RunningKeys
from headway.sim._seq import Seq

__all__ = ["PER_REQUEST_PROGRESS", "DecodeClock"]

PER_REQUEST_PROGRESS = False
"""True: policies with ``on_decode_progress`` get one ``on_progress`` per decoder as the others do
(read when a replica is built; tests compare both paths)."""


class DecodeClock:
    """The decoding requests of a :class:`~headway.sim.Replica`, counted lazily, and the
    duration and block needs of the step (or decode-only stretch) in flight. The replica
    sets every attribute below."""

    policy: Policy
    loop: EventLoop
    cfg: SchedulerConfig
    _rkeys: RunningKeys[Seq] | None  # the worst-keyed running request, kept lazily
    bs: int  # block size (tokens)
    free: int  # free KV blocks (reserved ones already taken off)
    waiting: PolicyQueue
    decoders: dict[Seq, None]  # insertion-ordered set
    g: int  # decode steps run so far (the lazy counters' clock)
    # the decode clock whose output the policy has seen: g, but g - 1 while an async plan is made
    # (vLLM's AsyncScheduler plans a step before the output of the one in flight is processed)
    seen_g: int
    _unseen: list[Seq]  # async: taken out of the decode set with their token of the step just ended unseen
    hist: list[int]  # decoders per block-boundary phase
    s_off: int  # sum over decoders of (computed - join)
    fin_heap: list[tuple[int, int, int, Seq]]
    rekey_heap: list[tuple[int, int, int, Seq]]
    _progress_hook: bool
    _decode_runs: bool  # decoders' progress goes to on_decode_progress in runs; counters stay lazy
    rep_g: int  # on_decode_progress: decode clock of the last whole-batch report (-1: none)
    rep_t: float  # and its time
    _fresh: dict[Seq, None]  # decoders that report as of their own join, not rep_g (_report_runs)
    _rekey_hook: bool
    _admission_held: bool  # the step being planned preempted, so it admitted nobody
    _async: bool  # async scheduling (SchedulerConfig.async_scheduling)
    _displacing: bool  # the policy displaces running requests (a preemptive policy, displacement not none)
    _news: bool  # async: the output just delivered holds a change its plan did not see (AsyncScheduling._deliver)
    # the step in flight: its start, number of steps, step time base and growth per step
    plan_start: float
    plan_n: int
    plan_base: float
    plan_slope: float
    plan_reported: int  # steps of the stretch in flight reported (-1: reports are lazy)

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

    # -------------------------------------------------------- lazy decode
    def _sync(self, s: Seq, now: float) -> None:
        """Bring a decoder's visible counters up to date (to the output the policy has seen,
        ``seen_g``) and report the progress."""
        seen = self.seen_g
        delta = seen - s.join
        if delta > 0:  # (async, while a plan is made: a decoder that joined at g has seen nothing new)
            req = s.req
            req.num_output_tokens += delta
            req.num_computed_tokens += delta
            req.last_token_time = now
            if self._decode_runs:  # report what no whole-batch report has (module docstring)
                last, since = (self.rep_g, self.rep_t) if s.join < self.rep_g else (s.join, s.since)
                if seen > last:
                    self.policy.on_decode_progress(now, ((1, seen - last, since),))
                    since = now
                s.since = since
                s.join = seen
                self._fresh[s] = None
            else:
                s.join = seen
                if self._progress_hook:
                    self.policy.on_progress(req, now, delta)

    def _sync_decoders(self, now: float) -> None:
        """:meth:`_sync` every decoder, in decoder order: a displacement check of a policy that
        learns from every step's progress (LTR) runs it over the whole batch at each step (with
        ``on_decode_progress``: the report only, counters stay lazy)."""
        if self._decode_runs:
            self._report_runs(self.seen_g, now)
        else:
            self._advance_decoders(self.seen_g, now, self.policy.on_progress if self._progress_hook else None)

    def _report_runs(self, target: int, at: float) -> None:
        """Report every decoder's progress up to the decode clock ``target`` at time ``at`` to
        ``on_decode_progress``, in decoder order, as runs of equal ``(tokens, since)``; no counter
        changes (see the module docstring). A decoder outside ``_fresh`` reports as of the last
        batch report (``rep_g``, ``rep_t``); when every fresh one reports the same or nothing (a
        new decoder, a rekey's sync at the last report's step), the batch is one run, found
        without a pass over the decoders."""
        rep_g, rep_t = self.rep_g, self.rep_t
        shared, decoders = target - rep_g, self.decoders
        count, kept, uniform = len(decoders), [], True
        for s in self._fresh:
            if s not in decoders:
                continue
            k, t = (shared, rep_t) if s.join < rep_g else (target - s.join, s.since)
            if k <= 0:  # nothing to report: it still reports as of its join at the next batch
                count -= 1
                kept.append(s)
            elif k != shared or t != rep_t:
                uniform = False
                break
        if uniform:
            if count and shared > 0:
                self.policy.on_decode_progress(at, ((count, shared, rep_t),))
            self._fresh = dict.fromkeys(kept)
        else:
            self._report_each(target, at)
        if target > rep_g:
            self.rep_g, self.rep_t = target, at

    def _report_each(self, target: int, at: float) -> None:
        """:meth:`_report_runs` by a pass over the decoders (some fresh decoder reports otherwise)."""
        rep_g, rep_t = self.rep_g, self.rep_t
        runs: list[tuple[int, int, float]] = []
        count, tokens, since = 0, 0, 0.0
        for s in self.decoders:
            if s.join < rep_g:
                k, t = target - rep_g, rep_t
            else:
                k, t = target - s.join, s.since
            if k > 0:
                if count and k == tokens and t == since:
                    count += 1
                else:
                    if count:
                        runs.append((count, tokens, since))
                    count, tokens, since = 1, k, t
        if count:
            runs.append((count, tokens, since))
            self.policy.on_decode_progress(at, runs)
        last = max(target, rep_g)  # the decoders that report as of their own join from here on
        self._fresh = {s: None for s in self.decoders if s.join >= last}

    def _materialize_decoders(self) -> None:
        """With ``on_decode_progress``, right after a whole-batch report at the decode clock: bring
        every decoder's counters to it (nothing left to report)."""
        g, rep_t = self.seen_g, self.rep_t
        for s in self.decoders:
            delta = g - s.join
            if delta > 0:
                req = s.req
                req.num_output_tokens += delta
                req.num_computed_tokens += delta
                req.last_token_time = rep_t
                s.join = g
                s.since = rep_t

    def _advance_decoders(
        self, target: int, at: float, on_progress: Callable[[Request, float, int], None] | None
    ) -> None:
        """Bring every decoder's counters to the decode clock ``target`` at time ``at``, in decoder
        order, reporting each one's progress to ``on_progress`` (the loop of :meth:`_sync`, inlined:
        it runs over the whole batch at each step)."""
        for s in self.decoders:
            delta = target - s.join
            if delta > 0:  # (a decoder that joined after target has nothing to report)
                req = s.req
                req.num_output_tokens += delta
                req.num_computed_tokens += delta
                req.last_token_time = at
                s.join = target
                if on_progress is not None:
                    on_progress(req, at, delta)

    def _catch_up(self, now: float) -> None:
        """Before a hook in the middle of a stretch: report the steps that ended before ``now``."""
        self._report_steps(self._step_at(now) - 1)

    def _catch_up_arrival(self, now: float) -> None:
        """Before an arrival's ``on_arrival`` in the middle of a stretch: report the steps that ended
        by ``now``, one ending within a rounding tie of it included (its output comes first)."""
        m = self._step_at(tie_floor(now))
        if self.plan_start + self._span(m) - now > TIE_RTOL * abs(now):
            m -= 1
        self._report_steps(m)

    def _report_steps(self, upto: int) -> None:
        """Report the decoders' progress in steps ``plan_reported + 1 .. upto`` of the stretch in
        flight as step-by-step mode's displacement checks do: at each step's end time, one token
        per decoder, in decoder order. Their ``join`` then runs ahead of ``g`` until the stretch
        ends."""
        first = self.plan_reported + 1
        if upto < first:
            return
        self.plan_reported = upto
        on_progress, start, g = self.policy.on_progress, self.plan_start, self.g
        for j in range(first, upto + 1):
            if self._decode_runs:
                self._report_runs(g + j, start + self._span(j))
            else:
                self._advance_decoders(g + j, start + self._span(j), on_progress)

    def _add_decoder(self, s: Seq, unseen: int = 0, key_time: float | None = None) -> None:
        """``s`` decodes from now on. ``unseen``: async scheduling: its prefill's token, computed in
        the step that just ended, that the policy has not seen (it is not in ``num_output_tokens``
        until the replica's ``_deliver``, which also arms its rekey hint). ``key_time``: when the
        plan that reads its key next reads it, if earlier than now (async scheduling: the plan made
        as the step that just ended started): a key only stays or improves as time goes on (LTR's
        promotion), so a key read later would be no bound of it in that plan's check."""
        req = s.req
        g = self.g
        now = self.loop.now
        s.join = g
        s.since = now  # its prefill's last chunk was reported now
        if self._decode_runs:
            self._fresh[s] = None
        off = req.num_computed_tokens - g
        phase = s.phase = off % self.bs
        self.hist[phase] += 1
        self.s_off += off
        self.decoders[s] = None
        fin_g = s.fin_g = g + s.true_len - req.num_output_tokens - unseen
        # requests finishing in one step leave in running-list order, as vLLM frees their blocks
        heapq.heappush(self.fin_heap, (fin_g, s.order, s.gen, s))
        if self._rekey_hook and not unseen:
            self._arm_rekey(s)
        if self._rkeys is not None:  # a countdown key counts down from here (Policy.running_keys)
            self._rkeys.decoding(s, req, now if key_time is None else key_time, g - unseen)

    @staticmethod
    def _hint_live(entry: tuple[int, int, int, Seq]) -> bool:
        """Whether a rekey-heap entry ``(g, seq, gen, s)`` stands: ``s`` has not left the decode set
        since it was armed (``gen``), and its hint is the one armed last (``rekey_g``)."""
        s = entry[3]
        return entry[2] == s.gen and s.rekey_g == entry[0]

    def _arm_rekey(self, s: Seq) -> None:
        """Arm ``s``'s next rekey hint (``Policy.rekey_after_tokens``), if the policy gives hints."""
        if not self._rekey_hook:
            return
        req = s.req
        hint = self.policy.rekey_after_tokens(req)
        if hint is not None:
            after = int(hint)
            rekey_g = s.rekey_g = self.g + (1 if after < 1 else after)  # max(after, 1) without the call
            heapq.heappush(self.rekey_heap, (rekey_g, req.seq, s.gen, s))
        else:
            s.rekey_g = -1

    def _remove_decoder(self, s: Seq) -> None:
        """Take a decoder (synced: :meth:`_sync`) out of the decode set."""
        del self.decoders[s]
        if self._decode_runs:
            self._fresh.pop(s, None)
        self.hist[s.phase] -= 1
        req = s.req
        self.s_off -= req.num_computed_tokens - s.join
        s.gen += 1
        if s.join != self.g:  # async: synced to seen_g; its token of the step just ended is computed, unseen
            req.num_computed_tokens += self.g - s.join
            req.last_token_time = self.loop.now
            s.join = self.g
            self._unseen.append(s)
        s.blocks = -(-req.num_computed_tokens // self.bs)

    # ------------------------------------------------------- fast-forward
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

        Async scheduling, a displacing policy: one step when the output just delivered (or the plan
        just made) holds a change that plan did not see and the next one does (``_news``: a rekey
        hint reached, a prefill's report, a finish, a request set aside) and someone waits: the next
        plan's displacement check may decide otherwise (a rekey hint reached at a stretch's end
        displaced a step later fast-forwarded than step by step:
        ``test_fast_forward_matches_exact_mode_async_preemptive``). Otherwise a stretch, as in the
        synchronous scheduler.
        """
        g = self.g
        if self._admission_held and self.waiting:
            return 1  # the next step may admit what this one could not (it preempted)
        if self._news and self._displacing and self.waiting:
            return 1  # async: the next plan sees a change this one did not (_async.py): it may displace
        # an entry of a decoder that left (or, a hint, re-armed since) is dead: it would cut the stretch short
        fin, rekey = self.fin_heap, self.rekey_heap
        while fin[0][2] != fin[0][3].gen:  # (every decoder has its live entry)
            heapq.heappop(fin)
        n = min(fin[0][0] - g, self.cfg.max_steps_per_event)
        while rekey and not self._hint_live(rekey[0]):
            heapq.heappop(rekey)
        if rekey:
            n = min(n, max(rekey[0][0] - g, 1))
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
