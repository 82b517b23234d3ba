"""LTR: learning-to-rank scheduling with step-counted starvation control (Fu et al., vllm-ltr)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headway.core import PolicyKey, Request, register_policy
from headway.policies._base import ScoredPolicy, check_positive
from headway.policies._boost import check_count
from headway.policies._scoring import SCORE_KEY

__all__ = ["LTRPolicy"]

_NS = "ltr"


class _State:
    """Per-request starvation bookkeeping for one waiting period (see :class:`LTRPolicy`)."""

    __slots__ = (
        "last_out", "last_time", "left", "period", "promote_at", "promoted", "quantum_end", "ran", "start_out",
        "unpromoted",
    )  # fmt: skip

    def __init__(self, period: int, promote_at: float, start_out: int, rank: float, left: int | None = None) -> None:
        self.period = period  # num_preemptions when this waiting period began
        # its two keys, made once (the score is computed once and cached): key() runs at every
        # queue insertion, running-key push and displacement check
        self.promoted = (0, rank)
        self.unpromoted = (1, rank)
        self.promote_at = promote_at
        self.start_out = start_out  # the output-token count when it began
        self.left = left  # a promotion kept through a preemption: the quantum it has left
        self.ran = False  # has reported progress in this period (was scheduled)
        # the output-token count where top priority ends if every step left in the quantum yields a
        # token (a step that yields none, a prefill chunk, brings it one closer)
        self.quantum_end: int | None = None
        self.last_time = 0.0  # the period's last progress report: its time and output-token count
        self.last_out = 0  # (0: none yet, or none with tokens: no step-time sample from it)


@register_policy("ltr")
class LTRPolicy(ScoredPolicy):
    """Waiting *and running* requests ranked by score every step; preemptive.

    Key: ``(1, score)``; a starving request gets ``(0, score)``: top priority, ranked by its
    score among the starving, as vllm-ltr sorts every request by ``(pri, -score)`` with
    ``pri`` -1 while promoted. vllm-ltr's rule: a request idle for ``starvation_steps`` (200)
    engine steps gets top priority for ``quantum_steps`` (10) scheduled steps.

    **Steps without a step API.** Engines give policies no global step counter, and
    the simulator reports decode progress lazily (several tokens per call), so counting
    calls would be wrong. The policy instead *measures* the step time: each
    ``on_progress`` of a request that stayed running gives ``dt / tokens`` (one decode
    token per step), smoothed by an EMA (``step_time_ema``, initial guess
    ``initial_step_time`` = 20 ms, an 8B model's decode step on an A100). The EMA is per
    token: a report of ``k`` tokens is ``k`` one-step updates toward its mean step time,
    so batching reports (the simulator's fast-forward) does not change the estimate when
    the step time is constant over a report; consecutive reports with the same sample (a batch's
    decoders at one step) are folded at once, in closed form. Idle steps are
    then ``idle time / step time``: a waiting period that starts at ``t0`` (arrival, or
    the preemption) promotes at ``t0 + starvation_steps * step_time``, frozen when the
    period begins so the key is time-invariant apart from that instant
    (:meth:`rekey_at_time`). The quantum is counted in the request's own scheduled steps, as
    vllm-ltr counts ``runs`` down: the step that starts it, then one per output token and one
    per reported prefill chunk that yields no token (engines report every chunk: a chunked
    prefill, or a recompute after a preemption, spends the quantum as it does in vllm-ltr,
    whose ``opt`` schedule chunks). When it ends the key worsens: :meth:`rekey_after_tokens`
    announces the end in tokens, and a chunk's report, which moves it closer, is a key point
    (the Policy contract). A step of several tokens (speculative decoding, in the plugin)
    counts as that many steps.

    **Under KV-cache pressure, preempt by swap to compare with vllm-ltr.** vllm-ltr
    (``vllm/core/scheduler.py``, its ``opt`` schedule) preempts every victim by *swap*
    (``reserve_free_blocks``: ``PreemptionMode.SWAP``); headway's engines recompute by default,
    as vLLM's V1 engine can only do. Under sustained memory pressure nearly every waiting request
    gets promoted, and the rule turns into round robin with a 10-step quantum; each turn then
    costs a full recompute (``--preemption-mode swap`` to compare, ``--policy-arg
    ltr.starvation_steps=100000000`` for no starvation prevention, as vllm-ltr's headline runs;
    measured in ``benchmarks/results/engine_fidelity.md``). The ordering, promotion and demotion
    otherwise follow vllm-ltr's (an audit against its source). A request preempted or paused
    within its quantum stays promoted for the rest of it, as vllm-ltr keeps a swapped or
    unscheduled request's ``pri`` and ``runs``; any other preemption starts a new waiting period
    (vllm-ltr's idle count restarts whenever a request is scheduled).
    """

    preemptive = True
    displacement = "pause"
    displacement_source = (
        "vllm-ltr (Fu et al., NeurIPS'24): every step the running and waiting requests are ranked "
        "together and the lower-ranked running ones are left out of the batch with their KV kept"
    )
    # a running key is fixed but for a promotion (better) and the quantum's end (announced by the
    # hint, or reached at a prefill chunk's report, a key point too); the step-time estimate needs
    # every step's progress, so progress is not declared deferrable (the simulator reports the
    # decoders' progress in runs: on_decode_progress)
    running_keys = "bounded"

    def __init__(
        self,
        *,
        starvation_steps: int = 200,
        quantum_steps: int = 10,
        initial_step_time: float = 0.02,
        step_time_ema: float = 0.05,
        **scoring: Any,
    ) -> None:
        super().__init__(**scoring)  # scorer and the noisy oracle's settings (see ScoredPolicy)
        self.starvation_steps = check_count("starvation_steps", starvation_steps, "ltr")
        self.quantum_steps = check_count("quantum_steps", quantum_steps, "ltr")
        self._base_step_time = check_positive("initial_step_time", initial_step_time, "ltr")
        if check_positive("step_time_ema", step_time_ema, "ltr") > 1.0:
            raise ValueError(f"ltr: step_time_ema must be in (0, 1], got {step_time_ema!r}")
        self.step_time_ema = float(step_time_ema)
        self._keep = 1.0 - self.step_time_ema
        # the open group of reports: `_group_reports` reports of `_group_tokens` tokens each, all with the
        # step-time sample `_group_sample`, not yet folded into `_base_step_time` (none while 0)
        self._group_sample = 0.0
        self._group_tokens = 0
        self._group_reports = 0

    @property
    def step_time(self) -> float:
        """The step-time estimate: the folded estimate moved by the open group of equal samples, in
        closed form (``n`` reports of ``k`` tokens toward one sample are ``n * k`` one-step updates).
        Reading it changes nothing, so when it is read does not change the value later."""
        n = self._group_reports
        if not n:
            return self._base_step_time
        sample = self._group_sample
        return sample + self._keep ** (self._group_tokens * n) * (self._base_step_time - sample)

    def _observe(self, sample: float, tokens: int, reports: int) -> None:
        """``reports`` reports of ``tokens`` decode tokens each, whose mean step time is ``sample``.
        Consecutive reports with the same sample and tokens form one group, folded at once when a
        different one comes: the groups are the same however the reports are batched into calls
        (one per decoder, or the simulator's runs), so both give the same floats."""
        if sample == self._group_sample and tokens == self._group_tokens:
            self._group_reports += reports
            return
        if self._group_reports:
            self._base_step_time = self.step_time
        self._group_sample, self._group_tokens, self._group_reports = sample, tokens, reports

    # ------------------------------------------------------------ bookkeeping
    def _state(self, request: Request, now: float) -> _State:
        st = request.extra.get(_NS)
        if isinstance(st, _State) and st.period == request.num_preemptions:
            return st
        start = request.arrival_time if request.num_preemptions == 0 else now
        left = 0
        if isinstance(st, _State) and st.quantum_end is not None:  # preempted (or paused) in its quantum
            left = st.quantum_end - request.num_output_tokens
        score = request.extra.get(SCORE_KEY)  # score_of's cache (always a float)
        rank = score if isinstance(score, float) else self.score_of(request)
        if left > 0:  # still promoted for the rest of it, as vllm-ltr keeps pri and runs through a swap
            st = _State(request.num_preemptions, start, request.num_output_tokens, rank, left)
        else:
            promote_at = start + self.starvation_steps * self.step_time
            st = _State(request.num_preemptions, promote_at, request.num_output_tokens, rank)
        request.extra[_NS] = st
        return st

    def on_arrival(self, request: Request, now: float) -> None:
        super().on_arrival(request, now)
        self._state(request, now)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        st = request.extra.get(_NS)  # _state's common case inlined: called per running request per step
        if not (isinstance(st, _State) and st.period == request.num_preemptions):
            st = self._state(request, now)
        out = request.num_output_tokens
        if not st.ran:
            st.ran = True
            prev = st.start_out
            if now >= st.promote_at:  # scheduled while starving: its quantum (or the rest of it) counts
                st.quantum_end = prev + (st.left or self.quantum_steps)  # from this step on
        else:
            prev = st.last_out
        if out == prev and st.quantum_end is not None and out < st.quantum_end:
            st.quantum_end -= 1  # a scheduled step that yielded no token (a prefill chunk) spends one
        if out > st.last_out > 0:  # a sample only from reports within one running period
            k = out - st.last_out
            sample = (now - st.last_time) / k
            if sample > 0.0:
                # k tokens = k decode steps: k one-step EMA updates toward the mean step time, in
                # closed form, so a report of k tokens at once (the simulator's fast-forward) moves
                # the estimate as much as k reports of one token (step by step) would
                self._observe(sample, k, 1)
        st.last_time = now
        st.last_out = out

    def on_decode_progress(self, now: float, runs: Sequence[tuple[int, int, float]]) -> None:
        """The decoders' reports of :meth:`on_progress`, in runs: a decoding request started its
        period's reports with its prefill (``ran`` set, ``last_out`` at least 1) and leaves
        decoding by finishing or by a preemption (a new period), so its reports only move the
        step-time estimate, ``k`` one-step updates toward ``(now - since) / k`` each: the same
        reports as one call per decoder gives, so the same groups (:meth:`_observe`), bit for bit."""
        for count, tokens, since in runs:
            sample = (now - since) / tokens
            if sample > 0.0:
                self._observe(sample, tokens, count)

    # -------------------------------------------------------------------- key
    def key(self, request: Request, now: float) -> PolicyKey:
        st = request.extra.get(_NS)  # _promoted and _state's common case inlined: queues and the
        if not (isinstance(st, _State) and st.period == request.num_preemptions):  # heap key often
            st = self._state(request, now)
        if st.ran:
            end = st.quantum_end
            if end is not None and request.num_output_tokens < end:
                return st.promoted
        elif now >= st.promote_at:
            return st.promoted
        return st.unpromoted

    def rekey_at_time(self, request: Request) -> float | None:
        st = request.extra.get(_NS)
        if isinstance(st, _State) and not st.ran:
            return st.promote_at
        return None

    def rekey_after_tokens(self, request: Request) -> int | None:
        st = request.extra.get(_NS)
        if isinstance(st, _State) and st.quantum_end is not None:
            left = st.quantum_end - request.num_output_tokens
            if left > 0:
                return left
        return None
