"""UniBoost stages, gamma-Ada and rank-boost, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core import RequestState, make_policy
from headway.policies import GammaAda, b_gamma, b_gamma_from_log_mgf
from headway.policies._boost import GAMMA_FLOOR
from headway.policies.uniboost import memguard_level

from .conftest import make_request, run


def test_b_gamma_hand_values():
    # gamma = 1, w = ln 2: 1 - e^{-w} = 1/2, so b = ln 2
    assert b_gamma(math.log(2.0), 1.0) == pytest.approx(math.log(2.0))
    # gamma = 0.1, w = 4 s: 10 * ln(1 / (1 - e^{-0.4})) = 11.10 s (the docstring's example)
    assert b_gamma(4.0, 0.1) == pytest.approx(10 * math.log(1 / (1 - math.exp(-0.4))))
    assert b_gamma(4.0, 0.1) == pytest.approx(11.10, abs=0.01)
    assert b_gamma(0.0, 1.0) == math.inf
    assert b_gamma(1e6, 1.0) == 0.0
    # decreasing in w
    assert b_gamma(1.0, 0.5) > b_gamma(2.0, 0.5) > b_gamma(3.0, 0.5)


def test_partial_information_boost_reduces_to_boost_for_known_sizes():
    # E[e^{gamma S}] = e^{gamma s} for a point mass: b = (1/g) log(M/(M-1)) = b_gamma(s)
    for s, g in [(0.3, 2.0), (5.0, 0.1), (40.0, 0.05)]:
        assert b_gamma_from_log_mgf(g * s, g) == pytest.approx(b_gamma(s, g))


def test_memguard_thresholds_are_geometric():
    assert [memguard_level(t, 32) for t in (0, 31, 32, 63, 64, 127, 128, 255, 256)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
    ]


def test_distboost_key_and_no_preemption():
    pol = make_policy("distboost", gamma=0.1, seconds_per_token=0.02)
    r = make_request(arrival=10.0, prompt_tokens=200)
    assert pol.key(r, 10.0) == (pytest.approx(10.0 - b_gamma(4.0, 0.1)),)
    assert not pol.preemptive


def test_uniboost_base_key_unifies_phases_with_hysteresis_and_linear_hints():
    pol = make_policy("uniboost-base", gamma=0.1, seconds_per_token=0.02, hysteresis=1.0, rekey_tokens=64)
    r = make_request(arrival=0.0, prompt_tokens=100)
    waiting_key = pol.key(r, 0.0)[0]
    assert waiting_key == pytest.approx(-b_gamma(2.0, 0.1))  # w~ = prompt (100 tokens = 2 s)
    run(r)
    assert pol.key(r, 0.0)[0] == pytest.approx(waiting_key - 1.0)  # incumbency bonus h
    assert pol.rekey_after_tokens(r) == 128  # grid points 64 and 128 lie below the prompt floor of 100
    r.num_output_tokens = 130
    assert pol.key(r, 0.0)[0] == pytest.approx(-b_gamma(128 * 0.02, 0.1) - 1.0)
    assert pol.rekey_after_tokens(r) == 192 - 130


def test_memguard_blocks_eviction_until_next_threshold():
    pol = make_policy("uniboost-memguard", memguard_base=32)
    a = make_request(prompt_tokens=10)
    a.num_output_tokens = 40  # (re)scheduled in band 1 ([32, 64)): the run starts there
    a = run(a)
    assert a.run_start_output_tokens == 40
    assert not pol.can_preempt(a, 0.0)
    assert pol.rekey_after_tokens(a) == 64 - 40
    a.num_output_tokens = 64
    assert pol.can_preempt(a, 0.0)
    # memory eviction prefers an evictable request even if its key is better
    b = run(make_request(prompt_tokens=10, arrival=100.0))
    b.num_output_tokens = 1
    assert pol.key(b, 0.0) > pol.key(a, 0.0)
    assert pol.choose_victim([a, b], 0.0) is a
    # a preemption starts a new run with a fresh guard
    a.transition(RequestState.PREEMPTED)
    a.num_preemptions += 1
    a.transition(RequestState.RUNNING)
    assert not pol.can_preempt(a, 0.0)


def test_memguard_bands_count_the_prompt_as_attained_work():
    """The key's work is max(generated, pw * prompt); MemGuard's bands are of the same work, so a
    request holding a 4000-token prompt is not evictable at 32 generated tokens (dropping 4032
    tokens of KV) but only once it generates past 4096, the next threshold above 4000."""
    pol = make_policy("uniboost-memguard", memguard_base=32)
    r = run(make_request(prompt_tokens=4000))
    for g in (0, 32, 2048, 4000, 4095):
        r.num_output_tokens = g
        assert not pol.can_preempt(r, 0.0), g
    r.num_output_tokens = 4096
    assert pol.can_preempt(r, 0.0)
    # the key changes at the same point, and that is the one hint (none below the prompt floor)
    r.num_output_tokens = 0
    assert pol.rekey_after_tokens(r) == 4096
    key = pol.key(r, 0.0)
    r.num_output_tokens = 4095
    assert pol.key(r, 0.0) == key
    r.num_output_tokens = 4096
    assert pol.key(r, 0.0) > key
    # memory eviction takes a short-prompt request past its threshold first
    short = run(make_request(prompt_tokens=10))
    short.num_output_tokens = 32
    r.num_output_tokens = 32
    assert pol.choose_victim([r, short], 0.0) is short
    # prefill_weight scales the prompt's work: at pw = 0 only generated tokens count
    pw0 = make_policy("uniboost-memguard", memguard_base=32, prefill_weight=0.0)
    assert pw0.can_preempt(r, 0.0)
    half = make_policy("uniboost-memguard", memguard_base=32, prefill_weight=0.5)  # w = 2000 until g > 2000
    r.num_output_tokens = 2047
    assert not half.can_preempt(r, 0.0)
    r.num_output_tokens = 2048
    assert half.can_preempt(r, 0.0)


def test_distboost_takes_no_hysteresis():
    """distboost never preempts, so an incumbency bonus could not change anything: it is refused."""
    with pytest.raises(ValueError, match="hysteresis"):
        make_policy("distboost", hysteresis=50.0)
    assert make_policy("uniboost-base", hysteresis=50.0).hysteresis == 50.0


def test_gamma_ada_ignores_non_finite_response_times():
    for bad in (math.inf, math.nan):
        ada = GammaAda(0.1, window=200, refit_every=100, min_samples=200)
        changed = [ada.observe(t) for t in [1.0] * 199 + [bad]]
        assert not changed[-1] and ada.gamma == 0.1 and len(ada._times) == 199
        assert all(math.isfinite(g) for g in ada.history)
    # the estimator itself: no finite positive spread, no estimate
    assert GammaAda.estimate(np.array([np.inf] * 10 + [1.0] * 290)) is None
    assert GammaAda.estimate(np.r_[np.ones(290), np.full(10, np.nan)]) is None
    assert GammaAda.estimate(np.full(300, 5.0)) is None


def test_b_gamma_for_tiny_work_and_tiny_gamma():
    # gamma w underflows to 0: b is (1/gamma) log(1/(gamma w)), not a math domain error
    assert b_gamma(0.02, 5e-324) == math.inf  # finite in theory, beyond a float
    assert b_gamma(5e-324, 0.1) == pytest.approx(-(math.log(0.1) + math.log(5e-324)) / 0.1)
    assert b_gamma(1e-300, 1e-20) == pytest.approx(-(math.log(1e-20) + math.log(1e-300)) / 1e-20)
    # and continuous across the switch to that form (at gamma w = 1e-300)
    assert b_gamma(0.999e-300, 1.0) == pytest.approx(b_gamma(1.001e-300, 1.0), rel=1e-5)
    # at the floor the boost is finite and still decreasing in w
    assert math.isfinite(b_gamma(0.02, GAMMA_FLOOR)) and b_gamma(0.02, GAMMA_FLOOR) > b_gamma(0.04, GAMMA_FLOOR)


@pytest.mark.parametrize("name", ["distboost", "uniboost-base", "uniboost-memguard", "uniboost"])
def test_gamma_below_the_floor_is_refused(name):
    for gamma in (5e-324, 1e-307, GAMMA_FLOOR / 2, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=f"{name}: gamma must"):
            make_policy(name, gamma=gamma)
    r = make_request(prompt_tokens=100)
    lowest = {"gamma_min": GAMMA_FLOOR} if name == "uniboost" else {}
    assert math.isfinite(make_policy(name, gamma=GAMMA_FLOOR, **lowest).key(r, 0.0)[0])


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        (
            "uniboost-memguard",
            {"memguard_base": True},
            "uniboost-memguard: memguard_base must be an int >= 1, got True",
        ),
        ("uniboost", {"memguard_base": True}, "uniboost: memguard_base must be an int >= 1, got True"),
        ("uniboost-base", {"rekey_tokens": True}, "uniboost-base: rekey_tokens must be an int >= 1, got True"),
        ("uniboost", {"window": True}, "uniboost: window must be an int >= 1, got True"),
        ("uniboost", {"refit_every": True}, "uniboost: refit_every must be an int >= 1, got True"),
        ("uniboost", {"min_samples": False}, "uniboost: min_samples must be an int >= 1, got False"),
        ("uniboost", {"gamma_min": "abc"}, "uniboost: gamma_min must be a number, got 'abc'"),
        ("uniboost", {"gamma_max": "abc"}, "uniboost: gamma_max must be a number, got 'abc'"),
        ("uniboost", {"gamma_max": math.inf}, "uniboost: gamma_max must be finite .*got inf"),
        ("uniboost", {"gamma_min": 1e-12}, "uniboost: gamma_min must be finite and >= 1e-09 .*got 1e-12"),
        ("uniboost", {"gamma_min": 1.0}, "uniboost: gamma-Ada needs gamma_min <= gamma <= gamma_max.*gamma_min=1.0"),
        ("uniboost", {"gamma": 6.0}, "uniboost: gamma-Ada needs .*gamma=6.0"),
        ("uniboost", {"gamma": True}, "uniboost: gamma must be a number, got True"),
    ],
)
def test_uniboost_rejects_bad_settings_naming_policy_argument_and_value(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_policy(name, **kwargs)


def test_gamma_ada_estimator_on_exponential_tail():
    rng = np.random.default_rng(0)
    times = rng.exponential(1 / 0.5, 200_000)  # decay rate 0.5 /s
    assert GammaAda.estimate(times) == pytest.approx(0.5, rel=0.05)
    ada = GammaAda(0.1, window=1000, refit_every=100, min_samples=200)
    changed = [ada.observe(float(t)) for t in times[:1000]]
    assert changed.index(True) == 199  # first refit once 200 samples are in
    assert ada.gamma == pytest.approx(0.5, rel=0.3)
    with pytest.raises(ValueError, match="gamma_min"):
        GammaAda(10.0, gamma_max=5.0)


def test_gamma_ada_clamps():
    ada = GammaAda(0.1, window=300, refit_every=100, min_samples=200, gamma_min=0.01, gamma_max=2.0)
    for t in np.linspace(0.0, 0.001, 300):  # tiny spread -> huge theta -> clamped
        ada.observe(float(t))
    assert ada.gamma == 2.0


def test_uniboost_bumps_key_epoch_when_gamma_changes():
    pol = make_policy("uniboost", refit_every=100, min_samples=100, window=500)
    rng = np.random.default_rng(1)
    epoch = pol.key_epoch
    for i, t in enumerate(rng.exponential(1.0, 100)):
        r = make_request(arrival=0.0)
        pol.on_finish(r, float(t))
        if i < 99:
            assert pol.key_epoch == epoch
    assert pol.key_epoch == epoch + 1 and pol.gamma != 0.1


def test_boost_memo_follows_gamma_and_theta():
    pol = make_policy("uniboost")
    assert pol.boost(50.0) == b_gamma(50.0 * 0.02, 0.1)
    pol.gamma = 0.7  # as gamma-Ada does
    assert pol.boost(50.0) == b_gamma(50.0 * 0.02, 0.7)
    pol.seconds_per_token = 0.05
    assert pol.boost(50.0) == b_gamma(50.0 * 0.05, 0.7)
    assert pol.boost(0.0) == b_gamma(1.0 * 0.05, 0.7)  # floored at one token


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["uniboost-base", "uniboost-memguard", "uniboost"]),
    st.integers(min_value=1, max_value=3000),
    st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=40),
)
def test_uniboost_running_keys_constant_between_hints(name, prompt, steps):
    pol = make_policy(name)
    r = run(make_request(prompt_tokens=prompt))
    key = pol.key(r, 0.0)
    budget = pol.rekey_after_tokens(r)
    assert budget is not None and budget >= 1
    for n in steps:
        n = min(n, budget)
        r.num_output_tokens += n
        pol.on_progress(r, 0.0, n)
        budget -= n
        new = pol.key(r, 0.0)
        if budget > 0:
            assert new == key
        else:
            assert new >= key  # attained work only lowers priority
            budget = pol.rekey_after_tokens(r)
            assert budget is not None and budget >= 1
        key = new


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["uniboost-base", "uniboost-memguard"]),
    st.sampled_from([0.0, 0.5, 1.0, 1.7, 3.0]),
    st.integers(min_value=1, max_value=3000),
    st.integers(min_value=0, max_value=6000),
    st.sampled_from([1, 7, 32, 64]),
)
def test_uniboost_hint_is_where_the_work_first_changes(name, pw, prompt, generated, grid):
    """The hint lands on the first output count whose ``w~`` differs (``w~`` never falls as
    tokens come, so equal at both ends means constant between), whether the prompt floor lies
    on a grid point, between two, or above many."""
    arg = {"uniboost-base": "rekey_tokens", "uniboost-memguard": "memguard_base"}[name]
    pol = make_policy(name, prefill_weight=pw, **{arg: grid})
    r = run(make_request(prompt_tokens=prompt))
    r.num_output_tokens = generated
    work = pol.work(r)
    hint = pol.rekey_after_tokens(r)
    assert hint is not None and hint >= 1
    r.num_output_tokens = generated + hint - 1
    assert pol.work(r) == work
    r.num_output_tokens = generated + hint
    assert pol.work(r) > work


def test_rank_boost_learns_bucket_boosts_and_orders_like_sjf():
    pol = make_policy(
        "rank-boost",
        num_buckets=2,
        warmup=2,
        refit_every=10,
        adaptive=False,
        gamma=0.5,
        seconds_per_token=0.01,
        prefill_weight=0.0,
        prior_weight=0.0,
    )
    short0, long0 = make_request(score=0.0), make_request(score=10.0)
    pol.on_arrival(short0, 0.0)
    pol.on_arrival(long0, 0.0)
    assert pol.edges == [5.0]
    epoch = pol.key_epoch
    for i in range(20):  # low scores finish with 10 tokens, high scores with 1000
        r = make_request(score=float(i % 2) * 10.0)
        pol.on_arrival(r, 0.0)
        r.num_output_tokens = 10 if i % 2 == 0 else 1000
        pol.on_finish(r, 1.0)
    assert pol.key_epoch > epoch
    a = make_request(arrival=5.0, score=1.0)
    b = make_request(arrival=4.0, score=9.0)
    for r in (a, b):
        pol.on_arrival(r, r.arrival_time)
    assert pol.key(a, 5.0) < pol.key(b, 5.0)  # later but predicted short: boosted ahead
    # each bucket holds a point mass: its boost is gamma-Boost of that size
    assert pol.boost_of(a) == pytest.approx(b_gamma(0.1, 0.5))
    assert pol.boost_of(b) == pytest.approx(b_gamma(10.0, 0.5))
    with pytest.raises(ValueError, match="warmup"):
        make_policy("rank-boost", num_buckets=8, warmup=4)
    # its gamma settings are checked like uniboost's, naming rank-boost
    for kw, msg in (({"gamma": 1e-12}, "rank-boost: gamma must be finite and >= 1e-09"),
                    ({"gamma_min": "x"}, "rank-boost: gamma_min must be a number")):
        with pytest.raises(ValueError, match=msg):
            make_policy("rank-boost", scorer="oracle", **kw)


def test_rank_boost_learns_no_size_from_an_unknown_output_length():
    pol = make_policy("rank-boost", num_buckets=2, warmup=2, refit_every=10, adaptive=False, prior_weight=0.0)
    for score in (0.0, 10.0):
        pol.on_arrival(make_request(score=score), 0.0)
    r = make_request(score=0.0)
    pol.on_arrival(r, 0.0)
    r.output_tokens_known = False  # e.g. the gateway got no usage: 0 tokens is no observation
    pol.on_finish(r, 1.0)
    assert all(len(sizes) == 0 for sizes in pol._sizes)
    r.output_tokens_known = True
    r.num_output_tokens = 7
    pol.on_finish(r, 1.0)
    assert sum(len(sizes) for sizes in pol._sizes) == 2  # its bucket and the pooled one


def test_trail_imports_its_refinement_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRAIL's refinement needs scipy: imported when the policy is built, not at its first refinement
    in the middle of a simulation (where the import counted in the run's CPU time, 0.15-0.25 s of a
    0.6 s run), so a missing scipy fails at construction."""
    import sys

    from headway._optional import MissingExtraError
    from headway.policies import trail

    trail._log_ndtr.cache_clear()
    monkeypatch.setitem(sys.modules, "scipy.special", None)
    try:
        with pytest.raises(MissingExtraError, match="TRAIL's length refinement"):
            make_policy("trail")
    finally:
        trail._log_ndtr.cache_clear()
