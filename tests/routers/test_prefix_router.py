"""The prefix-aware router: longest cached prefix against load."""

from __future__ import annotations

import random

import pytest

from factories import make_request
from headway.core import Request
from headway.routers import LoadTracker, make_router
from headway.sim import simulate
from headway.workload import BurstArrivals, session_workload


def _req(i: int, hashes: tuple[int, ...], prompt: int = 160, out: int = 10) -> Request:
    r = make_request(f"r{i}", prompt=prompt, max_tokens=out, seq=i)
    r.block_hashes = hashes
    return r


def test_a_shared_prefix_draws_a_request_unless_its_target_is_loaded_by_more() -> None:
    router = make_router("prefix-aware")
    tracker = LoadTracker(num_targets=2)
    est = {"estimate": lambda r: 10.0}
    assert router.route(make_request("x", prompt=100, max_tokens=10, seq=9), tracker, **est) == 0  # 110 tokens
    assert router.route(_req(0, tuple(range(10))), tracker, **est) == 1  # 170 tokens
    # B shares 9 blocks (144 tokens) with what target 1 holds: 170 + 170 - 144 = 196 < 110 + 170
    b = _req(1, (*range(9), 99))
    assert router.hit_tokens(b, 1) == 144 and router.hit_tokens(b, 0) == 0
    assert router.route(b, tracker, **est) == 1
    # now 340 tokens there: 340 + 170 - 144 > 280, the saving no longer outweighs the load
    assert router.route(_req(2, (*range(9), 77)), tracker, **est) == 0
    # a hit is at most the prompt less one token
    d = _req(3, tuple(range(10)), prompt=160)
    assert router.hit_tokens(d, 1) == 159
    router.reset()
    assert router.hit_tokens(d, 1) == 0


@pytest.mark.parametrize(("name", "same_as"), [("prefix-aware", "least-tokens"), ("cache-aware", "least-outstanding")])
def test_without_hashes_it_decides_as_its_load_rule(name: str, same_as: str) -> None:
    rng = random.Random(0)
    reqs = [make_request(f"r{i}", prompt=rng.randint(1, 500), max_tokens=4096, seq=i) for i in range(200)]
    picks = {}
    for router_name in (name, same_as):
        router, tracker = make_router(router_name), LoadTracker(num_targets=3)
        out = []
        for i, r in enumerate(reqs):
            out.append(router.route(r, tracker))
            if i % 3 == 2:
                tracker.release(reqs[i - 2])
        picks[router_name] = out
    assert picks[name] == picks[same_as]


def test_cache_tokens_bound_the_index() -> None:
    router = make_router("prefix-aware", cache_tokens=64)  # four 16-token hashes per target
    tracker = LoadTracker(num_targets=1)
    router.route(_req(0, tuple(range(10))), tracker)
    assert router.hit_tokens(_req(1, tuple(range(10))), 0) == 0  # hashes 0..5 were evicted
    with pytest.raises(ValueError, match="cache_tokens must be an int >= 1, got 0"):
        make_router("prefix-aware", cache_tokens=0)


def test_sessions_hit_more_behind_the_prefix_aware_router() -> None:
    wl = session_workload([[(200, 50)] * 4 for _ in range(24)], BurstArrivals(), think_time=0.5)
    rates = {}
    for name in ("prefix-aware", "least-outstanding"):
        res = simulate(wl, "fcfs", num_replicas=4, router=name)
        q = sum(r.prefix_cache_queries for r in res.replicas)
        rates[name] = sum(r.prefix_cache_hits for r in res.replicas) / q
    assert rates["prefix-aware"] > rates["least-outstanding"] + 0.1


# ------------------------------------------------------------------ cache-aware (SGLang's rule)
def _loaded(tracker: LoadTracker, target: int, n: int) -> None:
    """``n`` outstanding requests without hashes on ``target``."""
    for k in range(n):
        tracker.assign(make_request(f"load{target}-{k}-{tracker.num_open}", prompt=10), target, 10.0)


def test_cache_aware_sends_a_cached_prefix_to_its_target_while_the_fleet_is_balanced() -> None:
    router = make_router("cache-aware", balance_abs_threshold=4)
    tracker = LoadTracker(num_targets=2)
    assert router.route(_req(0, tuple(range(10))), tracker) == 0  # idle fleet: the first least loaded
    _loaded(tracker, 0, 3)  # target 0 now has 4 requests, target 1 none: within 4 of each other
    # 9 of 10 blocks cached on target 0 (144 of 160 tokens, 0.9 > 0.5): there, though it is busier
    assert router.route(_req(1, (*range(9), 99)), tracker) == 0
    # 5 more there: 10 against 0 is imbalanced (10 - 0 > 4 and 10 > 0 x 1.0001): the least loaded
    _loaded(tracker, 0, 5)
    assert router.route(_req(2, (*range(9), 77)), tracker) == 1
    # target 1 learned those blocks: the next copy follows them there, as long as it is balanced
    _loaded(tracker, 1, 5)  # 10 against 6
    assert router.hit_tokens(_req(3, (*range(9), 77)), 1) == 159
    assert router.route(_req(3, (*range(9), 77)), tracker) == 1


def test_cache_aware_routes_by_load_when_too_little_is_cached() -> None:
    router = make_router("cache-aware")
    tracker = LoadTracker(num_targets=2)
    assert router.route(_req(0, tuple(range(10))), tracker) == 0
    # 5 of 10 blocks: exactly half the prompt (80 of 160 tokens) is not more than the threshold 0.5
    half = _req(1, (*range(5), 50, 51, 52, 53, 54))
    assert router.hit_tokens(half, 0) == 80
    assert router.route(half, tracker) == 1
    # 6 of 10 blocks (96 of 160, 0.6): the cached target again
    assert router.route(_req(2, (*range(6), 60, 61, 62, 63)), tracker) == 0
    # a lower threshold takes the half
    low = make_router("cache-aware", cache_threshold=0.4)
    tracker = LoadTracker(num_targets=2)
    low.route(_req(0, tuple(range(10))), tracker)
    assert low.route(_req(1, (*range(5), 50, 51, 52, 53, 54)), tracker) == 0


def test_cache_aware_takes_the_least_loaded_of_the_targets_with_the_longest_prefix() -> None:
    router = make_router("cache-aware")
    tracker = LoadTracker(num_targets=3)
    shared = tuple(range(10))
    assert router.route(_req(0, shared), tracker) == 0
    assert router.route(_req(1, shared), tracker, candidates=[1]) == 1  # both hold the prefix now
    _loaded(tracker, 1, 2)  # 3 requests against 1; the scan starts at target 1 (after the last pick)
    assert router.route(_req(2, (*shared, 7)), tracker) == 0  # the longest prefix, less loaded
    # target 2 is idle but holds nothing, and 3 against 0 is balanced: the cache wins over it
    assert tracker.targets[2].outstanding_requests == 0


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("cache_threshold", 1.5, "cache_threshold must be a number in \\[0, 1\\], got 1.5"),
        ("cache_threshold", True, "cache_threshold must be a number in \\[0, 1\\], got True"),
        ("balance_abs_threshold", -1, "balance_abs_threshold must be an int >= 0, got -1"),
        ("balance_abs_threshold", 2.5, "balance_abs_threshold must be an int >= 0, got 2.5"),
        ("balance_rel_threshold", 0.5, "balance_rel_threshold must be a finite number >= 1, got 0.5"),
        ("balance_rel_threshold", float("inf"), "balance_rel_threshold must be a finite number >= 1, got inf"),
        ("cache_tokens", 0, "cache_tokens must be an int >= 1, got 0"),
    ],
)
def test_cache_aware_refuses_bad_settings(setting: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^cache-aware: {message}$"):
        make_router("cache-aware", **{setting: value})


def test_sessions_hit_more_behind_the_cache_aware_router() -> None:
    """Four replicas, conversations arriving together: the cache-aware rule keeps each conversation
    on the replica that holds it while the fleet stays balanced (SGLang's defaults); the token-priced
    rule moves turns to whichever replica has fewer outstanding tokens than the prefix saves."""
    wl = session_workload([[(400, 120)] * 6 for _ in range(40)], BurstArrivals(), think_time=0.5)
    rates = {}
    for name in ("cache-aware", "prefix-aware", "least-outstanding"):
        res = simulate(wl, "fcfs", num_replicas=4, router=name)
        q = sum(r.prefix_cache_queries for r in res.replicas)
        rates[name] = sum(r.prefix_cache_hits for r in res.replicas) / q
    one = simulate(wl, "fcfs")
    ceiling = one.replicas[0].prefix_cache_hits / one.replicas[0].prefix_cache_queries
    assert rates["cache-aware"] > rates["prefix-aware"] > rates["least-outstanding"]
    assert rates["cache-aware"] <= ceiling + 1e-12
