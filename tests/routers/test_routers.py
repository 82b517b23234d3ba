"""Routers: registry, the load tracker, and each router's rule."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import make_request
from headway.core import Policy, PolicyKey, Request
from headway.routers import (
    LengthAwareRouter,
    LoadTracker,
    Router,
    UnknownRouterError,
    available_routers,
    default_estimate,
    get_router_class,
    length_class,
    make_router,
    policy_estimator,
)

ALL = [
    "cache-aware",
    "least-outstanding",
    "least-tokens",
    "length-aware",
    "power-of-two",
    "prefix-aware",
    "random",
    "round-robin",
]


def _reqs(n: int, prompt: int = 100, **kw: object) -> list[Request]:
    return [make_request(f"r{i}", prompt=prompt, max_tokens=4096, seq=i, **kw) for i in range(n)]


def test_registry_lists_every_router() -> None:
    assert available_routers() == ALL
    assert [n for n in ALL if get_router_class(n).randomized] == ["power-of-two", "random"]


def test_unknown_router_lists_valid_names() -> None:
    with pytest.raises(UnknownRouterError) as info:
        make_router("least-outstandng")
    msg = str(info.value)
    assert "Did you mean 'least-outstanding'?" in msg
    for name in ALL:
        assert name in msg


def test_bad_settings_are_value_errors() -> None:
    with pytest.raises(ValueError, match="router 'round-robin' has no setting 'seed'; its settings: estimate_fn"):
        make_router("round-robin", seed=1)
    with pytest.raises(ValueError, match="seed"):
        make_router("random", seed=-1)
    for bad_seed in (1.0, True, "3", np.int64(-2)):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            make_router("random", seed=bad_seed)
    with pytest.raises(ValueError, match="separation"):
        make_router("length-aware", separation=-0.5)


@pytest.mark.parametrize("name", ALL)
@given(n_targets=st.integers(1, 6), n=st.integers(0, 60), seed=st.integers(0, 3),
       releases=st.lists(st.integers(0, 59), max_size=30))
def test_every_request_is_routed_exactly_once(
    name: str, n_targets: int, n: int, seed: int, releases: list[int]
) -> None:
    kw = {"seed": seed} if name in ("random", "power-of-two") else {}
    router = make_router(name, **kw)
    tracker = LoadTracker(n_targets)
    reqs = _reqs(n)
    released: set[int] = set()
    for i, req in enumerate(reqs):
        k = router.route(req, tracker)
        assert 0 <= k < n_targets
        assert tracker.target_of(req) == k
        with pytest.raises(ValueError, match="already assigned"):
            tracker.assign(req, k, tokens=1.0)
        for j in releases:
            if j <= i and j not in released:
                tracker.release(reqs[j])
                released.add(j)
    assert tracker.num_open == n - len(released)
    assert sum(t.outstanding_requests for t in tracker.targets) == tracker.num_open
    for req in reqs:
        tracker.release(req)
        tracker.release(req)  # a second release is a no-op
    for t in tracker.targets:
        assert t.outstanding_requests == 0
        assert t.outstanding_tokens == 0.0
        assert not any(t.class_requests) and not any(t.class_tokens)
        assert not any(t.longer_requests) and not any(t.longer_tokens)


@pytest.mark.parametrize("name", ALL)
def test_candidates_are_respected(name: str) -> None:
    router = make_router(name)
    tracker = LoadTracker(speeds=[1.0, 0.5, 1.0, 0.25, 1.0])
    allowed = [1, 3, 4]
    picks = Counter(router.route(r, tracker, candidates=allowed) for r in _reqs(200))
    assert set(picks) <= set(allowed)
    with pytest.raises(ValueError, match="empty candidate"):
        router.choose(make_request("x"), tracker.targets, candidates=[])


@pytest.mark.parametrize("name", ALL)
def test_bad_candidates_are_value_errors_naming_router_and_index(name: str) -> None:
    # an index out of range looped forever in round-robin and was an IndexError elsewhere
    for bad, index in (([5], "5"), ([0, 3], "3"), ([-1], "-1"), ([1, 1, 2], "1"), ([2, 0, 2], "2")):
        router = make_router(name)
        tracker = LoadTracker(3)
        with pytest.raises(ValueError, match=f"^{name}: candidate {index} is "):
            router.route(make_request("x"), tracker, candidates=bad)
        assert tracker.num_open == 0  # nothing was recorded
        with pytest.raises(ValueError, match=f"^{name}: candidate {index} is "):
            router.choose(make_request("x"), tracker.targets, candidates=bad)


def test_round_robin_with_every_target_but_one_skips_it() -> None:
    # [1, 2, 0] is every target; [1, 2] with 3 targets is not: target 0 must never be picked
    router = make_router("round-robin")
    targets = LoadTracker(3).targets
    assert [router.choose(r, targets, candidates=[1, 2]) for r in _reqs(4)] == [1, 2, 1, 2]
    router.reset()
    assert [router.choose(r, targets, candidates=[1, 2, 0]) for r in _reqs(4)] == [0, 1, 2, 0]
    # three candidates with 3 targets are not all of them when one repeats (choose() rejects that first)
    router.reset()
    assert {router._choose(r, 0.0, targets, [1, 1, 2], True) for r in _reqs(4)} == {1, 2}


def test_least_outstanding_balances_a_uniform_stream() -> None:
    router = make_router("least-outstanding")
    tracker = LoadTracker(4)
    live: list[Request] = []
    counts = Counter()
    for req in _reqs(1000):
        counts[router.route(req, tracker)] += 1
        loads = [t.outstanding_requests for t in tracker.targets]
        assert max(loads) - min(loads) <= 1  # FIFO releases keep it level
        live.append(req)
        if len(live) >= 12:  # a steady state: the oldest request finishes per arrival
            tracker.release(live.pop(0))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_least_outstanding_weighs_speed() -> None:
    router = make_router("least-outstanding")
    tracker = LoadTracker(speeds=[1.0, 0.25])
    counts = Counter(router.route(r, tracker) for r in _reqs(100))
    assert counts[0] == 80 and counts[1] == 20


def test_round_robin_cycles_and_weights() -> None:
    router = make_router("round-robin")
    tracker = LoadTracker(3)
    assert [router.route(r, tracker) for r in _reqs(7)] == [0, 1, 2, 0, 1, 2, 0]
    router.reset()
    assert router.choose(make_request("x"), tracker.targets) == 0
    weighted = make_router("round-robin")
    tracker = LoadTracker(speeds=[1.0, 0.5, 0.5])
    seq = [weighted.route(r, tracker) for r in _reqs(8)]
    assert Counter(seq) == {0: 4, 1: 2, 2: 2}
    assert seq[:4] == [0, 1, 2, 0]  # smooth: the fast target does not get bursts


@pytest.mark.parametrize("name", ["random", "power-of-two"])
def test_seeded_routers_are_reproducible(name: str) -> None:
    def run(seed: int) -> list[int]:
        router = make_router(name, seed=seed)
        tracker = LoadTracker(5)
        out = []
        for i, r in enumerate(_reqs(300)):
            out.append(router.route(r, tracker))
            if i % 3 == 0:
                tracker.release(r)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)
    numpy_seeded = make_router(name, seed=np.int64(7))  # numpy integers are integers too
    assert numpy_seeded.seed == 7 and type(numpy_seeded.seed) is int
    int_seeded = make_router(name, seed=7)
    targets = LoadTracker(5).targets
    picks = [numpy_seeded.choose(r, targets) for r in _reqs(20)]
    assert picks == [int_seeded.choose(r, targets) for r in _reqs(20)]
    router = make_router(name, seed=3)
    first = [router.choose(r, LoadTracker(5).targets) for r in _reqs(20)]
    router.reset()
    assert [router.choose(r, LoadTracker(5).targets) for r in _reqs(20)] == first


def test_random_spreads_by_speed() -> None:
    router = make_router("random", seed=0)
    tracker = LoadTracker(speeds=[1.0, 1.0, 0.5, 0.5])
    counts = Counter(router.choose(r, tracker.targets) for r in _reqs(6000))
    for k, share in enumerate([1 / 3, 1 / 3, 1 / 6, 1 / 6]):
        assert counts[k] / 6000 == pytest.approx(share, abs=0.03)


def test_power_of_two_picks_the_less_loaded_of_two() -> None:
    router = make_router("power-of-two", seed=1)
    tracker = LoadTracker(2)
    busy = _reqs(5)
    for r in busy:
        tracker.assign(r, 0, tokens=1.0)
    # with two targets both are always drawn: the idle one wins every time
    assert all(router.choose(r, tracker.targets) == 1 for r in _reqs(20))


def test_least_tokens_uses_prompt_plus_expected_output() -> None:
    router = make_router(
        "least-tokens", estimate_fn=lambda r: 1000.0 if r.request_id.startswith("long") else 10.0
    )
    tracker = LoadTracker(2)
    assert router.route(make_request("long-0", prompt=10), tracker) == 0
    # target 0 holds 1,010 tokens: ten short requests (20 tokens each) all fit on 1 first
    picks = [router.route(make_request(f"short-{i}", prompt=10), tracker) for i in range(10)]
    assert picks == [1] * 10
    assert tracker.targets[0].outstanding_tokens == 1010.0
    assert tracker.targets[1].outstanding_tokens == 200.0


def test_default_estimate_uses_score_then_prompt() -> None:
    assert default_estimate(make_request(prompt=300, max_tokens=100)) == 100.0
    assert default_estimate(make_request(prompt=30, max_tokens=100)) == 30.0
    scored = make_request(prompt=30, max_tokens=1000, score=math.log(200.0))
    assert default_estimate(scored) == pytest.approx(200.0)
    assert default_estimate(make_request(prompt=30, max_tokens=100, score=20.0)) == 100.0


def test_policy_estimator_reads_scores_or_a_direct_hook() -> None:
    class Plain(Policy):
        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    class Direct(Plain):
        def expected_output_tokens(self, request: Request) -> float | None:
            return 42.0 if request.max_tokens > 10 else None

    class Scored(Plain):
        def score_of(self, request: Request) -> float | None:
            return math.log(50.0) if request.max_tokens > 10 else None

    req, unknown = make_request(max_tokens=1000), make_request(prompt=7, max_tokens=10)
    direct, scored = policy_estimator(Direct()), policy_estimator(Scored())
    assert direct is not None and direct(req) == 42.0 and direct(unknown) == default_estimate(unknown) == 7.0
    assert scored is not None and scored(req) == pytest.approx(50.0) and scored(unknown) == 7.0
    assert policy_estimator(Plain()) is None
    assert Plain().expected_output_tokens(req) is None and Plain().score_of(req) is None


def test_estimate_precedence_router_then_engine_then_default() -> None:
    req = make_request(prompt=30, max_tokens=1000)
    own = make_router("least-tokens", estimate_fn=lambda r: 7.0)
    plain = make_router("least-tokens")
    assert own.expected_output(req, lambda r: 9.0) == 7.0
    assert plain.expected_output(req, lambda r: 9.0) == 9.0
    assert plain.expected_output(req) == 30.0
    with pytest.raises(ValueError, match="estimate"):
        make_router("least-tokens", estimate_fn=lambda r: math.nan).expected_output(req)


def test_length_classes() -> None:
    assert [length_class(x) for x in (0.0, 0.5, 1.0, 31.9, 32.0, 63.9, 64.0, 1000.0)] == [0, 0, 0, 0, 1, 1, 2, 5]
    assert length_class(32767.0) == 10 and length_class(32768.0) == 11 and length_class(1e30) == 11


def _brute_cost(router: LengthAwareRouter, size: float, others: list[float]) -> float:
    return sum(min(size, o) + router.separation * abs(size - o) for o in others)


@given(size=st.floats(1.0, 5000.0), others=st.lists(st.floats(1.0, 5000.0), max_size=20),
       separation=st.floats(0.0, 2.0), releases=st.integers(0, 20))
def test_length_aware_cost_matches_pairwise_sum_across_classes(
    size: float, others: list[float], separation: float, releases: int
) -> None:
    router = LengthAwareRouter(separation=separation)
    tracker = LoadTracker(1)
    reqs = [make_request(f"o{i}") for i in range(len(others) + releases)]
    for i, req in enumerate(reqs):  # extra requests come and go: the sums must follow
        tracker.assign(req, 0, tokens=others[i] if i < len(others) else 100.0 + i)
    for req in reqs[len(others):]:
        tracker.release(req)
    got = router.cost(size, tracker.targets[0])
    want = _brute_cost(router, size, others)
    c = length_class(size)
    if all(length_class(o) != c for o in others):  # exact unless some share its class
        assert got == pytest.approx(want, rel=1e-9, abs=1e-6)
    else:  # within a class, min/max of the class totals: off by at most the class spread
        same = [o for o in others if length_class(o) == c]
        assert abs(got - want) <= (1 + 2 * separation) * len(same) * size + 1e-6


def test_length_aware_picks_the_cheapest_target() -> None:
    router = make_router("length-aware", estimate_fn=lambda r: 0.0)
    tracker = LoadTracker(3)
    for i, (k, size) in enumerate([(0, 20.0), (0, 20.0), (1, 3000.0), (2, 20.0), (2, 3000.0)]):
        tracker.assign(make_request(f"x{i}"), k, tokens=size)
    costs = [router.cost(3000.0, t) for t in tracker.targets]  # type: ignore[attr-defined]
    assert router.route(make_request("long", prompt=3000), tracker) == costs.index(min(costs)) == 1
    costs = [router.cost(20.0, t) for t in tracker.targets]  # type: ignore[attr-defined]
    assert router.route(make_request("short", prompt=20), tracker) == costs.index(min(costs)) == 0


def _mixing(router: Router) -> float:
    """Mean number of other-kind requests on the target each request is sent to."""
    rng = random.Random(0)
    tracker = LoadTracker(4)
    kinds: dict[Request, tuple[str, int]] = {}
    live: list[Request] = []
    mixed = 0
    for i in range(400):
        kind = "l" if rng.random() < 0.25 else "s"  # a quarter long, three quarters short
        req = make_request(f"{kind}{i}", prompt=50, seq=i)
        k = router.route(req, tracker)
        mixed += sum(1 for r in live if kinds[r] == ("s" if kind == "l" else "l", k))
        kinds[req] = (kind, k)
        live.append(req)
        if len(live) > 40:
            tracker.release(live.pop(0))
    return mixed / 400


def test_length_aware_keeps_short_and_long_apart() -> None:
    lengths = {"s": 20.0, "l": 2000.0}  # expected outputs; sizes add the 50-token prompt

    def est(r: Request) -> float:
        return lengths[r.request_id[0]]

    apart = _mixing(make_router("length-aware", estimate_fn=est))
    for other in (make_router("least-outstanding"), make_router("least-tokens", estimate_fn=est),
                  make_router("round-robin")):
        assert apart < 0.2 * _mixing(other), other
    assert _mixing(make_router("length-aware", estimate_fn=est, separation=0.0)) > apart


def test_router_base_is_abstract_and_describes_itself() -> None:
    with pytest.raises(TypeError):
        Router()  # type: ignore[abstract]
    assert repr(make_router("random", seed=5)) == "RandomRouter(seed=5)"
    assert repr(make_router("length-aware")) == "LengthAwareRouter(separation=0.5)"
    with pytest.raises(ValueError, match="speed"):
        LoadTracker(speeds=[1.0, 0.0])
    with pytest.raises(ValueError, match="num_targets or speeds"):
        LoadTracker()


def test_the_routing_names_stay_importable_from_core() -> None:
    import headway.core
    import headway.routers

    for name in headway.routers.__all__:
        if name in headway.core.__all__:
            assert getattr(headway.core, name) is getattr(headway.routers, name)
    assert {"Router", "LoadTracker", "make_router", "policy_estimator"} <= set(headway.core.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = headway.core.no_such_name  # type: ignore[attr-defined]
