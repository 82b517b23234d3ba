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


def test_without_hashes_it_decides_as_least_tokens() -> None:
    rng = random.Random(0)
    reqs = [make_request(f"r{i}", prompt=rng.randint(1, 500), max_tokens=4096, seq=i) for i in range(200)]
    picks = {}
    for name in ("prefix-aware", "least-tokens"):
        router, tracker = make_router(name), LoadTracker(num_targets=3)
        out = []
        for i, r in enumerate(reqs):
            out.append(router.route(r, tracker))
            if i % 3 == 2:
                tracker.release(reqs[i - 2])
        picks[name] = out
    assert picks["prefix-aware"] == picks["least-tokens"]


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
