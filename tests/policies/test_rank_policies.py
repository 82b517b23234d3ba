"""PARS, sjf-score, LTR and TRAIL keys, checked by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import make_workload, unit_cost
from headway.core import PolicyQueue, Request, RequestState, make_policy
from headway.policies.ltr import LTRPolicy
from headway.policies.trail import lognormal_residual_mean
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import default_workload

from .conftest import make_request, run


def test_pars_orders_by_score_then_promotes_after_threshold():
    pol = make_policy("pars")
    old = make_request(arrival=0.0, score=9.0)
    new = make_request(arrival=50.0, score=1.0)
    for r in (old, new):
        pol.on_arrival(r, r.arrival_time)
    assert pol.key(new, 100.0) < pol.key(old, 100.0)  # both unpromoted: score order
    assert pol.rekey_at_time(old) == 120.0
    assert pol.key(old, 119.999) == (1, 9.0)
    assert pol.key(old, 120.0) == (0, 0.0)  # waited 120 s: ahead of every unpromoted request
    assert pol.key(old, 120.0) < pol.key(new, 120.0)


def test_pars_promoted_requests_are_fcfs_and_threshold_is_configurable():
    pol = make_policy("pars", starvation_threshold=10.0)
    a = make_request(arrival=1.0, score=5.0)
    b = make_request(arrival=2.0, score=0.5)
    assert pol.key(a, 20.0) < pol.key(b, 20.0)  # both promoted: arrival order
    with pytest.raises(ValueError, match="starvation_threshold must be a finite number > 0, got -1"):
        make_policy("pars", starvation_threshold=-1)


def test_pars_promotion_reaches_the_queue_via_rekey_timer():
    pol = make_policy("pars", starvation_threshold=5.0)
    q = PolicyQueue(pol)
    long_wait = make_request(arrival=0.0, score=10.0)
    fresh = make_request(arrival=4.0, score=1.0)
    q.add(long_wait, 0.0)
    q.add(fresh, 4.0)
    assert q.peek() is fresh
    q.rekey(long_wait, pol.rekey_at_time(long_wait))  # what an engine's timer does
    assert q.peek() is long_wait


def test_sjf_score_key():
    pol = make_policy("sjf-score")
    r = make_request(score=-3.0)
    assert pol.key(r, 0.0) == (-3.0,)


def test_ltr_promotes_after_200_steps_for_a_10_step_quantum():
    pol = make_policy("ltr", initial_step_time=0.05)
    r = make_request(arrival=0.0, score=4.0)
    pol.on_arrival(r, 0.0)
    assert pol.rekey_at_time(r) == pytest.approx(200 * 0.05)
    assert pol.key(r, 9.9) == (1, 4.0)
    assert pol.key(r, 10.0) == (0, 4.0)  # promoted: ahead of every unpromoted request, by its score
    run(r)
    r.num_output_tokens = 1
    pol.on_progress(r, 10.05, 1)  # scheduled while starving: a quantum of 10 steps, this one the first
    assert pol.rekey_after_tokens(r) == 9
    r.num_output_tokens = 9
    assert pol.key(r, 11.0)[0] == 0
    r.num_output_tokens = 10
    assert pol.key(r, 11.5) == (1, 4.0)  # quantum spent (10 scheduled steps): back to its score


def test_ltr_prefill_chunks_spend_the_quantum_as_scheduled_steps():
    # vllm-ltr counts runs down at every scheduled step, a prefill chunk's too (its opt schedule chunks)
    pol = make_policy("ltr", initial_step_time=0.05)
    r = make_request(arrival=0.0, score=4.0, prompt_tokens=3000)
    pol.on_arrival(r, 0.0)
    run(r)
    for t in (10.05, 10.10, 10.15):  # three chunks of the prompt, no token yet: 3 of the 10 steps
        r.num_computed_tokens += 900
        pol.on_progress(r, t, 900)
        assert pol.key(r, t) == (0, 4.0)
    assert pol.rekey_after_tokens(r) == 7
    r.num_computed_tokens = 3000
    r.num_output_tokens = 1  # the last chunk yields the first token: the 4th step
    pol.on_progress(r, 10.20, 300)
    assert pol.rekey_after_tokens(r) == 6
    r.num_output_tokens = 6
    assert pol.key(r, 10.5) == (0, 4.0)
    r.num_output_tokens = 7
    assert pol.key(r, 10.6) == (1, 4.0)  # 3 chunks + 7 tokens = 10 steps


def test_ltr_ranks_the_promoted_by_score_as_vllm_ltr_does():
    # vllm-ltr sorts by (pri, -score): promoted requests among themselves by score, not by wait
    pol = make_policy("ltr", initial_step_time=0.05)
    early, late, fresh = (make_request(arrival=t, score=s) for t, s in ((0.0, 9.0), (1.0, 2.0), (5.0, 1.0)))
    for r in (early, late, fresh):
        pol.on_arrival(r, r.arrival_time)
    now = 12.0  # early promoted at 10 s, late at 11 s; fresh (15 s) not yet
    assert pol.key(late, now) < pol.key(early, now) < pol.key(fresh, now)


def test_ltr_promotion_outlives_a_preemption_within_its_quantum():
    # vllm-ltr keeps a swapped request's pri and runs: promoted until it has run its quantum's steps
    pol = make_policy("ltr", initial_step_time=0.05)
    r = make_request(arrival=0.0, score=4.0)
    pol.on_arrival(r, 0.0)
    run(r)
    r.num_output_tokens = 1
    pol.on_progress(r, 10.05, 1)  # promoted at 10 s: a quantum of 10 steps, to token 10
    r.num_output_tokens = 4
    r.transition(RequestState.PREEMPTED)
    r.num_preemptions += 1
    assert pol.key(r, 10.5) == (0, 4.0)  # still promoted, for the 6 steps it has left
    assert pol.rekey_at_time(r) == 10.5  # promoted from the preemption on: no timer ahead
    r.transition(RequestState.RUNNING)
    pol.on_progress(r, 11.0, 512)  # a chunk of its recompute (no token): one of the 6
    assert pol.rekey_after_tokens(r) == 5
    r.num_output_tokens = 5  # the recompute's last chunk yields token 5: 4 steps left
    pol.on_progress(r, 11.05, 20)
    assert pol.rekey_after_tokens(r) == 4
    r.num_output_tokens = 8
    assert pol.key(r, 11.4)[0] == 0
    r.num_output_tokens = 9  # 4 steps, then a chunk and 5 tokens: 10
    assert pol.key(r, 11.5) == (1, 4.0)  # quantum spent
    r.transition(RequestState.PREEMPTED)
    r.num_preemptions += 1
    assert pol.key(r, 12.0) == (1, 4.0)  # preempted after its quantum: it waits 200 steps again
    assert pol.rekey_at_time(r) == pytest.approx(12.0 + 200 * pol.step_time)


def test_ltr_learns_step_time_and_resets_idle_clock_on_preemption():
    pol = make_policy("ltr", initial_step_time=0.02, step_time_ema=1.0)
    r = make_request(arrival=0.0, score=1.0)
    pol.on_arrival(r, 0.0)
    run(r)
    r.num_output_tokens = 1
    pol.on_progress(r, 0.1, 1)
    r.num_output_tokens = 11
    pol.on_progress(r, 0.6, 10)  # 10 tokens in 0.5 s -> 50 ms steps
    assert pol.step_time == pytest.approx(0.05)
    r.transition(RequestState.PREEMPTED)
    r.num_preemptions += 1
    assert pol.key(r, 3.0) == (1, 1.0)
    assert pol.rekey_at_time(r) == pytest.approx(3.0 + 200 * 0.05)
    with pytest.raises(ValueError, match="starvation_steps"):
        make_policy("ltr", starvation_steps=0)


def test_ltr_step_time_ema_counts_every_token():
    """A report of k tokens moves the estimate as k one-token reports do (the simulator's
    fast-forward reports several tokens at once, its exact mode one at a time)."""
    one, many = (make_policy("ltr", initial_step_time=0.02, step_time_ema=0.05) for _ in range(2))
    a, b = make_request(score=1.0), make_request(score=1.0)
    for pol, r in ((one, a), (many, b)):
        pol.on_arrival(r, 0.0)
        run(r)
        r.num_output_tokens = 1
        pol.on_progress(r, 1.0, 1)
    for i in range(1, 31):  # 30 steps of 50 ms, one token each
        a.num_output_tokens = 1 + i
        one.on_progress(a, 1.0 + 0.05 * i, 1)
    b.num_output_tokens = 31
    many.on_progress(b, 2.5, 30)
    expected = 0.05 + 0.95**30 * (0.02 - 0.05)
    assert one.step_time == pytest.approx(expected, rel=1e-12)
    assert many.step_time == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("seed", "max_num_seqs", "blocks"), [(0, 4, None), (1, 16, 1500)])
def test_ltr_fast_forward_matches_exact_mode(seed: int, max_num_seqs: int, blocks: int | None) -> None:
    """The learned step time sets when a waiting request starves; before it counted each report
    as one sample, so fast-forward (long reports) and exact mode learned different step times and
    preempted differently. All requests arrive at 0: a request arriving mid-stretch reads a step
    time the fast-forward has not brought up to date (the simulator reports progress lazily)."""
    rows = [(0.0, s.num_prompt_tokens, s.num_output_tokens) for s in default_workload(60, seed)]
    wl = make_workload(rows)
    kw = {"scorer": "noisy-oracle", "tau": 0.7}
    cache = CacheConfig(num_gpu_blocks=blocks)
    fast = simulate(wl, "ltr", policy_kwargs=kw, cache=cache, scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
    exact = simulate(wl, "ltr", policy_kwargs=kw, cache=cache,
                     scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_steps_per_event=1))
    assert sum(r.num_preemptions for r in exact.requests) > 50  # starvation promotions preempt
    assert fast.num_steps == exact.num_steps
    for a, b in zip(fast.requests, exact.requests, strict=True):
        assert a.request_id == b.request_id and a.num_preemptions == b.num_preemptions
        assert a.finish_time == pytest.approx(b.finish_time, rel=1e-9)
        assert a.first_token_time == pytest.approx(b.first_token_time, rel=1e-9)


class _RecordingLTR(LTRPolicy):
    """LTR that logs what it is told and the step time it holds at each arrival."""

    def __init__(self) -> None:
        super().__init__(scorer="noisy-oracle", tau=0.7)
        self.log: list[tuple[str, str, float, int, float]] = []

    def on_arrival(self, request: Request, now: float) -> None:
        super().on_arrival(request, now)
        self.log.append(("arrival", request.request_id, now, 0, self.step_time))

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        super().on_progress(request, now, num_new_tokens)
        self.log.append(("progress", request.request_id, now, num_new_tokens, self.step_time))


@pytest.mark.parametrize(("num_requests", "seed", "blocks"), [(100, 3, 800), (120, 1, 800)])
def test_ltr_fast_forward_matches_exact_mode_with_staggered_arrivals(num_requests: int, seed: int, blocks: int) -> None:
    """Requests arriving in the middle of a fast-forwarded decode stretch: step by step, the running
    requests' progress was reported at every step boundary before the arrival (the displacement
    check syncs them while requests wait), so the simulator reports those steps before on_arrival
    reads the step time. Before, on_arrival saw the step time of the stretch's start: finish times
    differed by up to 51 % and total preemptions by 2.1x (236 vs 505). Step time grows within a
    stretch (KV tokens), so the reports must be the same calls, one token per step, not one k-token
    average: the log of what the policy is told must match too."""
    wl = default_workload(num_requests, seed)  # Poisson arrivals at 6/s
    cache = CacheConfig(num_gpu_blocks=blocks)
    fast_pol, exact_pol = _RecordingLTR(), _RecordingLTR()
    fast = simulate(wl, fast_pol, cache=cache)
    exact = simulate(wl, exact_pol, cache=cache, scheduler=SchedulerConfig(max_steps_per_event=1))
    assert fast.num_events < exact.num_events / 2  # the fast-forward ran stretches
    assert sum(r.num_preemptions for r in exact.requests) > 250
    assert fast.num_steps == exact.num_steps
    for a, b in zip(fast.requests, exact.requests, strict=True):
        assert a.request_id == b.request_id and a.num_preemptions == b.num_preemptions
        assert a.finish_time == pytest.approx(b.finish_time, rel=1e-9)
        assert a.first_token_time == pytest.approx(b.first_token_time, rel=1e-9)
    assert len(fast_pol.log) == len(exact_pol.log)
    for x, y in zip(fast_pol.log, exact_pol.log, strict=True):
        assert x[:2] == y[:2] and x[3] == y[3]
        assert x[2] == pytest.approx(y[2], rel=1e-9) and x[4] == pytest.approx(y[4], rel=1e-9)


@pytest.mark.parametrize("mode", ["none", "pause"])
@pytest.mark.parametrize("exact", [True, False])
def test_ltr_arrival_reads_every_ended_steps_progress(mode: str, exact: bool) -> None:
    """r0 decodes (1 s steps; prefill ends at 1, a token at each of 2, 3, ...); r1 (one token: no
    decode step) arrives at 5.0, as a step ends, and r2 at 7.5, mid-step. vLLM processes a step's
    output before it adds the requests that came during it, and the plugin announces them as the
    next ``schedule()`` starts (the plugin reports every step), so ``on_arrival`` reads a step time
    learnt from every decode step ended by the next plan: 4 samples of 1 s for r1, 7 for r2 (the
    step it came in, ending at 8, included; 6, the steps ended by its arrival, until the simulator
    announced arrivals at the plan). Before, with displacement ``none`` or nobody waiting, the simulator
    reported the decoders' progress lazily (at a finish or a preemption) and both read the
    initial 20 ms: r1 would starve at 9.0, where the plugin's r1 starves at 45.4 (34 of 100 of
    ``tests/integrations/test_displacement_vs_vllm.py``'s scenarios differed)."""
    wl = make_workload([(0.0, 16, 40), (5.0, 16, 1), (7.5, 16, 3)])
    pol = _RecordingLTR()
    pol.displacement = mode
    simulate(wl, pol, preset=unit_cost(), scheduler=SchedulerConfig(max_steps_per_event=1 if exact else 1 << 30))
    seen = {rid: t for what, rid, _, _, t in pol.log if what == "arrival"}
    assert seen["r0"] == 0.02
    assert seen["r1"] == pytest.approx(1.0 + 0.95**4 * (0.02 - 1.0), rel=1e-12)
    assert seen["r2"] == pytest.approx(1.0 + 0.95**7 * (0.02 - 1.0), rel=1e-12)


def test_ltr_rejects_bad_settings_naming_them():
    for kwargs, match in [
        ({"step_time_ema": "abc"}, "ltr: step_time_ema must be a number, got 'abc'"),
        ({"step_time_ema": 1.5}, r"ltr: step_time_ema must be in \(0, 1\], got 1.5"),
        ({"step_time_ema": 0.0}, "ltr: step_time_ema"),
        ({"starvation_steps": True}, "ltr: starvation_steps must be an int >= 1, got True"),
        ({"quantum_steps": True}, "ltr: quantum_steps must be an int >= 1, got True"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_policy("ltr", **kwargs)


def test_trail_clamps_a_huge_score_before_exp():
    pol = make_policy("trail")
    r = make_request(score=800.0, max_tokens=100)  # exp(800) overflows a float
    pol.on_arrival(r, 0.0)
    assert pol.key(r, 0.0) == (100.0,)  # capped at max_tokens, as any score above log(100) is
    assert pol.key(make_request(score=math.log(100.0) + 0.5, max_tokens=100), 0.0) == (100.0,)
    low = make_request(score=-800.0)
    assert pol.key(low, 0.0) == (1.0,)


def test_lognormal_residual_mean_hand_values():
    # g -> 0: the plain lognormal mean exp(mu + s^2/2)
    assert lognormal_residual_mean(5.0, 1.0, 1e-9) == pytest.approx(math.exp(5.5), rel=1e-6)
    # deep in the tail the residual life of a lognormal grows with g
    assert lognormal_residual_mean(5.0, 1.0, 2000.0) > 2000.0
    assert lognormal_residual_mean(5.0, 1.0, 2000.0) - 2000 > lognormal_residual_mean(5.0, 1.0, 500.0) - 500


def test_trail_limited_preemption_at_c_times_initial_prediction():
    pol = make_policy("trail")
    r = make_request(score=math.log(100.0))
    pol.on_arrival(r, 0.0)
    assert pol.key(r, 0.0) == (pytest.approx(100.0),)
    run(r)
    r.num_output_tokens = 80
    assert pol.can_preempt(r, 1.0)  # 80 <= 0.8 * 100
    r.num_output_tokens = 81
    assert not pol.can_preempt(r, 1.0)
    assert pol.key(r, 1.0) == (pytest.approx(19.0),)


def test_trail_refines_once_the_prediction_is_exceeded():
    pol = make_policy("trail", prediction_sigma=1.0)
    r = make_request(score=math.log(50.0))
    pol.on_arrival(r, 0.0)
    run(r)
    assert pol.rekey_after_tokens(r) == 50
    r.num_output_tokens = 50
    pol.on_progress(r, 1.0, 50)
    expected = lognormal_residual_mean(math.log(50.0), 1.0, 50.0)
    assert pol.key(r, 1.0) == (pytest.approx(expected - 50.0),)
    assert pol.key(r, 1.0)[0] > 0


def test_trail_oracle_exact_and_noisy():
    pol = make_policy("trail-oracle")
    r = make_request()
    pol.bind_oracle(lambda req: 100)
    assert pol.key(r, 0.0) == (100,)
    r.num_output_tokens = 80
    assert pol.can_preempt(r, 0.0) and pol.key(r, 0.0) == (20,)
    r.num_output_tokens = 81
    assert not pol.can_preempt(r, 0.0)
    noisy = make_policy("trail-oracle", noise=0.5, seed=1)
    noisy.bind_oracle(lambda req: 100)
    r2 = make_request(rid="fixed")
    k = noisy.key(r2, 0.0)[0]
    assert k != 100 and k > 0 and noisy.key(r2, 5.0)[0] == k
    with pytest.raises(ValueError, match="noise must be a finite number >= 0"):
        make_policy("trail-oracle", noise=-0.1)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
    st.floats(min_value=0.0, max_value=8.0),
)
def test_trail_running_key_never_worsens_between_hints(steps, log_pred):
    """Engine contract: between rekey hints a running request's key may only improve."""
    pol = make_policy("trail")
    r = make_request(score=log_pred)
    pol.on_arrival(r, 0.0)
    run(r)
    key = pol.key(r, 0.0)
    budget = pol.rekey_after_tokens(r)
    for n in steps:
        assert budget is not None
        n = min(n, budget)  # engines report progress at least at every hint
        r.num_output_tokens += n
        budget -= n
        if budget > 0:
            pol.on_progress(r, 0.0, n)
            new = pol.key(r, 0.0)
            assert new <= key
        else:
            pol.on_progress(r, 0.0, n)
            new = pol.key(r, 0.0)
            budget = pol.rekey_after_tokens(r)
        key = new


class _DictLTR(LTRPolicy):
    """LTR's step-time bookkeeping as first written: each request's last report in a dict keyed
    by the request, tagged with its preemption count (the reference for the per-period state)."""

    def __init__(self) -> None:
        super().__init__(starvation_steps=3, quantum_steps=2, step_time_ema=0.3)
        self._last: dict[Request, tuple[float, int, int]] = {}

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        state = self._state(request, now)
        last = self._last.get(request)
        out = request.num_output_tokens
        fresh = last is None or last[2] != request.num_preemptions
        prev = state.start_out if fresh else last[1]
        if not state.ran:
            state.ran = True
            if now >= state.promote_at:
                state.quantum_end = prev + (state.left or self.quantum_steps)
        if out == prev and state.quantum_end is not None and out < state.quantum_end:
            state.quantum_end -= 1
        if last is not None and last[2] == request.num_preemptions and out > last[1] > 0:
            k = out - last[1]
            sample = (now - last[0]) / k
            if sample > 0.0:
                self._observe(sample, k, 1)  # the estimate's arithmetic, as LTRPolicy's
        self._last[request] = (now, out, request.num_preemptions)


_LTR_OPS = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["progress", "preempt", "key"]), st.integers(0, 4),
              st.floats(0.0, 0.2)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_LTR_OPS)
def test_ltr_step_time_bookkeeping_matches_the_dict_of_last_reports(ops: list[tuple[int, str, int, float]]) -> None:
    """The last report kept on the request's per-period state learns the same step times, bit for
    bit, and gives the same keys as the dict of last reports tagged with the preemption count."""
    ours = LTRPolicy(starvation_steps=3, quantum_steps=2, step_time_ema=0.3)
    ref = _DictLTR()
    reqs = {pol: [make_request(arrival=0.0, score=float(i)) for i in range(3)] for pol in (ours, ref)}
    now = 0.0
    for pol in (ours, ref):
        for r in reqs[pol]:
            pol.on_arrival(r, 0.0)
    for i, op, tokens, dt in ops:
        now += dt
        for pol in (ours, ref):
            r = reqs[pol][i]
            if op == "progress":
                r.num_output_tokens += tokens
                pol.on_progress(r, now, tokens)
            elif op == "preempt":
                r.num_preemptions += 1
        assert ours.step_time == ref.step_time
        assert [ours.key(r, now) for r in reqs[ours]] == [ref.key(r, now) for r in reqs[ref]]
        assert [ours.rekey_after_tokens(r) for r in reqs[ours]] == [ref.rekey_after_tokens(r) for r in reqs[ref]]


@settings(max_examples=300, deadline=None)
@given(
    pred=st.one_of(st.floats(min_value=1.0, max_value=1e6), st.just(math.nan)),
    out=st.integers(min_value=0, max_value=10**6),
)
def test_trail_key_and_hint_are_the_max_formulas(pred: float, out: int) -> None:
    """TRAIL's key and rekey hint skip the max() call: the same values as max(P - g, 0.0) and
    max(ceil(P - g), 1), -0.0 and NaN included (values and types)."""
    pol = make_policy("trail")
    r = make_request(score=0.0)
    pol.on_arrival(r, 0.0)
    r.extra["trail"][1] = pred  # type: ignore[index]
    r.num_output_tokens = out
    (key,) = pol.key(r, 0.0)
    want = max(pred - out, 0.0)
    assert repr(key) == repr(want) and type(key) is type(want)
    if not math.isnan(pred):
        hint = pol.rekey_after_tokens(r)
        assert hint == max(math.ceil(pred - out), 1) and type(hint) is int


@settings(max_examples=300, deadline=None)
@given(
    score=st.one_of(st.floats(min_value=-900.0, max_value=900.0), st.sampled_from([0.0, -0.0, math.log(7.0) + 1.0])),
    max_tokens=st.one_of(st.integers(min_value=1, max_value=10**7), st.sampled_from([1, 2, 7])),
    out=st.integers(min_value=0, max_value=10**6),
    pred=st.floats(min_value=1.0, max_value=1e6),
    sigma=st.one_of(st.floats(min_value=1e-4, max_value=3.0), st.just(1.0)),
)
def test_trail_prediction_and_refinement_are_the_min_max_formulas(
    score: float, max_tokens: int, out: int, pred: float, sigma: float
) -> None:
    """TRAIL's first prediction, refinement and residual mean skip the min() and max() calls: the
    same values and types as the formulas with them (a residual mean below g + 1, or rounded
    below g with a small sigma far in the tail, included)."""
    pol = make_policy("trail", prediction_sigma=sigma)
    r = make_request(score=score, max_tokens=max_tokens)
    pol.on_arrival(r, 0.0)
    p0 = min(max(math.exp(min(score, math.log(max(max_tokens, 1)) + 1.0)), 1.0), float(max_tokens))
    assert repr(r.extra["trail"]) == repr([p0, p0])  # type: ignore[index]

    mu = math.log(pred)
    r.extra["trail"] = [pred, pred]
    r.num_output_tokens = out
    pol.on_progress(r, 0.0, 1)
    want = pred
    if out >= pred:
        want = min(max(lognormal_residual_mean(mu, sigma, out), out + 1.0), float(max(max_tokens, out + 1)))
    got = r.extra["trail"][1]  # type: ignore[index]
    assert repr(got) == repr(want) and type(got) is type(want)
    if out > 0:  # the residual mean itself: max(E[L | L > g], g)
        log_ndtr = pytest.importorskip("scipy.special").log_ndtr
        lg = math.log(out)
        log_num = mu + sigma * sigma / 2.0 + float(log_ndtr((mu + sigma * sigma - lg) / sigma))
        formula = max(math.exp(log_num - float(log_ndtr((mu - lg) / sigma))), out)
        mean = lognormal_residual_mean(mu, sigma, out)
        assert repr(mean) == repr(formula) and type(mean) is type(formula)


def test_ltr_step_time_folds_equal_reports_in_closed_form_however_they_are_batched() -> None:
    """Consecutive reports with one sample are one group: the same floats whether they come as one
    run, several runs or one call each, whether or not the estimate is read between them, and
    (to rounding) the one-step EMA updates they stand for."""
    now = 0.53
    reports = [(2, 0.5), (2, 0.5), (2, 0.5), (1, 0.52), (2, 0.5), (2, 0.5)]  # (tokens, since)

    def fresh() -> LTRPolicy:
        return LTRPolicy(initial_step_time=0.02, step_time_ema=0.05)

    one_run = fresh()
    one_run.on_decode_progress(now, [(3, 2, 0.5), (1, 1, 0.52), (2, 2, 0.5)])
    split = fresh()
    split.on_decode_progress(now, [(2, 2, 0.5)])
    split.on_decode_progress(now, [(1, 2, 0.5), (1, 1, 0.52), (1, 2, 0.5)])
    split.on_decode_progress(now, [(1, 2, 0.5)])
    each, seen = fresh(), []
    for tokens, since in reports:
        each.on_decode_progress(now, [(1, tokens, since)])
        seen.append(each.step_time)  # reading it changes nothing
    assert one_run.step_time == split.step_time == each.step_time == seen[-1]
    assert len(set(seen)) == len(seen)  # every report moved it

    step = 0.02
    for tokens, since in reports:  # the one-step updates: `tokens` per report
        sample = (now - since) / tokens
        for _ in range(tokens):
            step = sample + 0.95 * (step - sample)
    assert one_run.step_time == pytest.approx(step, rel=1e-12)
