"""Fleets: several replicas behind a router, heterogeneous presets, per-replica results."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import make_workload, unit_cost
from headway.core import Request, RequestState
from headway.core._policy import _POLICIES
from headway.policies import FCFSPolicy
from headway.routers import LengthAwareRouter, TargetLoad, available_routers, make_router
from headway.sim import CacheConfig, SchedulerConfig, SimResult, simulate
from headway.sim._fleet import (
    FLEET,
    describe_fleet,
    fleet_presets,
    fleet_summaries,
    relative_speeds,
    split_by_replica,
)
from headway.workload import Workload
from strategies import workloads

COST = unit_cost(0.01, 1e-4, 1e-6)
SMALL = (SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8), CacheConfig(num_gpu_blocks=48))


class _CountingFCFS(FCFSPolicy):
    """FCFS that counts hook calls across all its instances (registered only inside a test)."""

    arrived: ClassVar[Counter[str]] = Counter()
    finished: ClassVar[Counter[str]] = Counter()

    def on_arrival(self, request: Request, now: float) -> None:
        type(self).arrived[request.request_id] += 1

    def on_finish(self, request: Request, now: float) -> None:
        type(self).finished[request.request_id] += 1


@contextmanager
def _counting_policy() -> Iterator[str]:
    """Registers :class:`_CountingFCFS` for the duration (replicas build policies by name)."""
    name = "test-counting-fcfs"
    _POLICIES.register(name)(_CountingFCFS)
    _CountingFCFS.arrived.clear()
    _CountingFCFS.finished.clear()
    try:
        yield name
    finally:
        _POLICIES.unregister(name)


def _fingerprint(res: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.state, r.first_scheduled_time, r.first_token_time, r.finish_time,
         r.num_output_tokens, r.num_preemptions)
        for r in res.requests
    ]


@pytest.mark.parametrize("router", available_routers())
@given(wl=workloads(max_requests=30), n=st.integers(1, 4))
def test_every_router_sends_each_request_exactly_once(router: str, wl: Workload, n: int) -> None:
    sched, cache = SMALL
    with _counting_policy() as policy:
        res = simulate(wl, policy, preset=COST, scheduler=sched, cache=cache, num_replicas=n, router=router)
    assert len(res.assignment) == len(res.requests) == len(wl)
    assert all(0 <= k < n for k in res.assignment)
    assert sum(r.num_requests for r in res.replicas) == len(wl)
    assert [r.num_requests for r in res.replicas] == [res.assignment.count(k) for k in range(n)]
    # every request reached exactly one replica's policy and finished there once (a client's abort
    # is not a finish the policy observes)
    assert all(c == 1 for c in _CountingFCFS.arrived.values())
    assert all(c == 1 for c in _CountingFCFS.finished.values())
    assert set(_CountingFCFS.finished) == {r.request_id for r in res.requests if r.state is RequestState.FINISHED}
    assert all(r.is_finished for r in res.requests)
    assert res.router == router


def test_least_outstanding_balances_a_uniform_stream() -> None:
    # identical requests at a steady rate: every replica gets the same share
    wl = make_workload([(0.05 * i, 64, 32) for i in range(400)])
    res = simulate(wl, "fcfs", preset=COST, num_replicas=4, router="least-outstanding")
    counts = [r.num_requests for r in res.replicas]
    assert max(counts) - min(counts) <= 1, counts
    # a burst at t = 0 is spread evenly too
    burst = make_workload([(0.0, 64, 32) for _ in range(101)])
    res = simulate(burst, "fcfs", preset=COST, num_replicas=4, router="least-outstanding")
    assert sorted(r.num_requests for r in res.replicas) == [25, 25, 25, 26]


@pytest.mark.parametrize("router", ["random", "power-of-two", "length-aware", "least-tokens"])
@given(wl=workloads(max_requests=30), seed=st.integers(0, 5))
def test_same_seed_gives_identical_fleet_results(router: str, wl: Workload, seed: int) -> None:
    kw = {"seed": seed} if router in ("random", "power-of-two") else {}
    sched, cache = SMALL
    runs = [simulate(wl, "sjf-oracle", preset=COST, scheduler=sched, cache=cache, num_replicas=3,
                     router=router, router_kwargs=kw) for _ in range(2)]
    assert runs[0].assignment == runs[1].assignment
    assert _fingerprint(runs[0]) == _fingerprint(runs[1])
    # a Router object is reset at the start of each run: reusing it gives the same fleet
    obj = make_router(router, **kw)
    again = [simulate(wl, "sjf-oracle", preset=COST, scheduler=sched, cache=cache, num_replicas=3,
                      router=obj) for _ in range(2)]
    assert again[0].assignment == again[1].assignment == runs[0].assignment


def test_different_seeds_route_differently() -> None:
    wl = make_workload([(0.01 * i, 32, 16) for i in range(200)])
    a, b = (simulate(wl, "fcfs", preset=COST, num_replicas=4, router="random", router_kwargs={"seed": s})
            for s in (1, 2))
    assert a.assignment != b.assignment


def test_one_replica_with_a_router_matches_plain_simulation() -> None:
    wl = make_workload([(0.1 * i, 20 + 7 * i, 5 + (i * 13) % 40) for i in range(60)])
    plain = simulate(wl, "srpt-oracle", preset=COST)
    routed = simulate(wl, "srpt-oracle", preset=COST, router="length-aware")
    assert _fingerprint(plain) == _fingerprint(routed)
    assert plain.router is None and routed.router == "length-aware"


def test_route_function_still_works_and_conflicts_are_errors() -> None:
    wl = make_workload([(0.0, 8, 4), (0.0, 8, 4), (0.1, 8, 4)])
    res = simulate(wl, "fcfs", preset=COST, num_replicas=2, route=lambda req, reps: req.seq % 2)
    assert res.assignment == (0, 1, 0)
    with pytest.raises(ValueError, match="need a router"):
        simulate(wl, "fcfs", preset=COST, num_replicas=2)
    with pytest.raises(ValueError, match="not both"):
        simulate(wl, "fcfs", preset=COST, num_replicas=2, route=lambda r, s: 0, router="random")
    with pytest.raises(ValueError, match="router_kwargs"):
        simulate(wl, "fcfs", preset=COST, num_replicas=2, router=make_router("random"),
                 router_kwargs={"seed": 1})
    with pytest.raises(ValueError, match="Valid routers"):
        simulate(wl, "fcfs", preset=COST, num_replicas=2, router="nope")


def test_heterogeneous_fleet_weighs_replicas_by_speed() -> None:
    wl = make_workload([(0.02 * i, 200, 100) for i in range(300)])
    res = simulate(wl, "fcfs", preset=["llama3-8b-h100", "llama3-8b-l4"], router="least-outstanding")
    fast, slow = res.replicas
    assert (fast.preset, slow.preset) == ("llama3-8b-h100", "llama3-8b-l4")
    assert fast.speed == 1.0 and 0.0 < slow.speed < 0.5
    assert fast.num_requests > 2 * slow.num_requests
    with pytest.raises(ValueError, match="2 presets for 3 replicas"):
        simulate(wl, "fcfs", preset=["llama3-8b-h100", "llama3-8b-l4"], num_replicas=3, router="random")


def test_speeds_are_one_for_a_homogeneous_fleet() -> None:
    sched, cache = SchedulerConfig(), CacheConfig()
    assert relative_speeds([COST, COST], sched, cache, [100, 100]) == [1.0, 1.0]


def test_policy_estimate_reaches_the_router() -> None:
    # PARS with the exact noisy oracle (tau = 1): its score is log(true length), and the
    # router reads it (exp) before the replica's policy sees the request
    seen: dict[str, float] = {}

    class Spy(LengthAwareRouter):
        def _choose(self, request: Request, length: float, targets: Sequence[TargetLoad],
                    candidates: Sequence[int], uniform: bool) -> int:
            seen[request.request_id] = length
            return super()._choose(request, length, targets, candidates, uniform)

    wl = make_workload([(0.05 * i, 50, 10 if i % 3 else 400) for i in range(60)])
    kw = {"scorer": "noisy-oracle", "tau": 1.0}
    res = simulate(wl, "pars", preset=COST, num_replicas=3, router=Spy(), policy_kwargs=kw)
    assert all(r.state is RequestState.FINISHED for r in res.requests)
    for spec in wl:
        assert seen[spec.request_id] == pytest.approx(spec.num_output_tokens)
    # a policy without an estimate: the prompt length stands in
    seen.clear()
    simulate(wl, "fcfs", preset=COST, num_replicas=3, router=Spy())
    assert set(seen.values()) == {50.0}


def test_split_and_fleet_summaries() -> None:
    wl = make_workload([(0.03 * i, 40, 20 + i % 50) for i in range(120)])
    res = simulate(wl, "fcfs", preset=COST, num_replicas=3, router="round-robin")
    parts = split_by_replica(res)
    assert [len(p) for p in parts] == [40, 40, 40]
    assert sorted(r.request_id for p in parts for r in p) == sorted(r.request_id for r in res.requests)
    sums = fleet_summaries(res, slo="ttft:500 e2el:5000")
    assert list(sums) == [FLEET, "replica-0", "replica-1", "replica-2"]
    assert sums[FLEET].num_requests == 120
    assert sum(sums[f"replica-{k}"].num_slo_met or 0 for k in range(3)) == sums[FLEET].num_slo_met
    assert sums[FLEET].goodput is not None


def test_describe_fleet_groups_runs_of_one_preset() -> None:
    # the console's titles: "on 4 x llama3-8b-a100", not the name four times
    assert describe_fleet(["a"]) == "a"
    assert describe_fleet(fleet_presets("llama3-8b-a100", 4)) == "4 x llama3-8b-a100"
    assert describe_fleet(fleet_presets("h100:2,l4:2")) == "2 x h100, 2 x l4"
    assert describe_fleet(["a", "b", "a"]) == "1 x a, 1 x b, 1 x a"  # replica order kept
    with pytest.raises(ValueError, match="at least one replica"):
        describe_fleet([])


def test_fleet_presets_spec() -> None:
    assert fleet_presets("a") == ["a"]
    assert fleet_presets("a", 3) == ["a", "a", "a"]
    assert fleet_presets("h100:2,l4:1") == ["h100", "h100", "l4"]
    assert fleet_presets("x,y", 2) == ["x", "y"]
    assert fleet_presets(["p", "q"]) == ["p", "q"]
    assert fleet_presets("/tmp/my:model.json", 2) == ["/tmp/my:model.json"] * 2
    with pytest.raises(ValueError, match="describes 3 replicas, not 4"):
        fleet_presets("h100:2,l4:1", 4)
    with pytest.raises(ValueError, match="empty"):
        fleet_presets(" , ")
