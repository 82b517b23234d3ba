"""Priority bands around an inner policy: strict bands, fair tenant flows, inner order, share."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core import PolicyQueue, Request, RequestState, Tier, make_policy
from headway.policies import BandsPolicy
from headway.sim import SchedulerConfig, simulate
from headway.workload import RequestSpec

from .conftest import make_request


def _req(tenant: str = "default", priority: int = 0, score: float | None = None, arrival: float = 0.0) -> Request:
    r = make_request(tenant=tenant, score=score, arrival=arrival)
    r.priority = priority
    return r


def _drain(pol: BandsPolicy, reqs: list[Request], n: int | None = None) -> list[Request]:
    """Queue ``reqs`` (arrival order), then start ``n`` of them one by one as an engine would."""
    q = PolicyQueue(pol)
    for r in reqs:
        pol.on_arrival(r, 0.0)
        q.add(r, 0.0)
    out = []
    for _ in range(len(reqs) if n is None else n):
        q.refresh(0.0)
        r = q.pop()
        r.transition(RequestState.RUNNING)
        pol.on_progress(r, 0.0, 1)
        out.append(r)
    return out


def test_bands_are_strict_and_lower_priority_value_first():
    pol = BandsPolicy("fcfs")
    reqs = [_req(priority=p) for p in (2, 0, 1, 2, 0, 1)]
    assert [r.priority for r in _drain(pol, reqs)] == [0, 0, 1, 1, 2, 2]


def test_tier_bands():
    pol = BandsPolicy("fcfs", by="tier")
    reqs = [make_request(tier=t) for t in (Tier.BATCH, Tier.STANDARD, Tier.PREMIUM)]
    assert [r.tier for r in _drain(pol, reqs)] == [Tier.PREMIUM, Tier.STANDARD, Tier.BATCH]


def test_tenants_alternate_inside_a_band_whatever_the_arrival_order():
    pol = BandsPolicy("fcfs")
    reqs = [_req("a") for _ in range(6)] + [_req("b") for _ in range(3)]
    assert "".join(r.tenant_id for r in _drain(pol, reqs)) == "ababab" + "aaa"


def test_tenant_weights_give_shares():
    pol = BandsPolicy("fcfs", tenant_weights={"a": 2.0})
    reqs = [_req("a") for _ in range(20)] + [_req("b") for _ in range(20)]
    first = _drain(pol, reqs, 12)
    assert collections.Counter(r.tenant_id for r in first) == {"a": 8, "b": 4}


def test_inner_policy_orders_inside_a_flow_and_turns_stay_fair():
    # sjf-score: smaller score first. Tenant a's short request arrives last, yet takes a's next turn.
    pol = BandsPolicy("sjf-score")
    a = [_req("a", score=s) for s in (5.0, 4.0, 3.0)]
    b = [_req("b", score=s) for s in (9.0, 8.0)]
    late = _req("a", score=1.0)
    order = _drain(pol, [*a, *b, late])
    assert [(r.tenant_id, r.score) for r in order] == [
        ("a", 1.0), ("b", 8.0), ("a", 3.0), ("b", 9.0), ("a", 4.0), ("a", 5.0)
    ]  # fmt: skip


def test_anti_starvation_share():
    pol = BandsPolicy("fcfs", share=0.2)
    reqs = [_req(priority=0) for _ in range(50)] + [_req(priority=1) for _ in range(50)]
    first = _drain(pol, reqs, 50)
    low = sum(r.priority == 1 for r in first)
    assert 8 <= low <= 12  # band 1 weight 0.2 against band 0's 0.8
    strict = _drain(BandsPolicy("fcfs"), [_req(priority=p) for p in [0] * 50 + [1] * 50], 50)
    assert all(r.priority == 0 for r in strict)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="share must be"):
        BandsPolicy(share=1.0)
    with pytest.raises(ValueError, match="by must be"):
        BandsPolicy(by="tenant")
    with pytest.raises(ValueError, match=r"tenant_weights\['a'\]"):
        BandsPolicy(tenant_weights={"a": 0})
    with pytest.raises(ValueError, match="cannot be 'bands'"):
        BandsPolicy("bands")
    pol = make_policy("bands", inner="pars", scorer="noisy-oracle", tau=0.8, seed=1)
    assert isinstance(pol, BandsPolicy) and pol.inner.name == "pars"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from("abc"), st.floats(0, 10)), min_size=1, max_size=30))
def test_property_strict_bands_and_inner_order_per_flow(items):
    pol = BandsPolicy("sjf-score")
    reqs = [_req(t, priority=p, score=s) for p, t, s in items]
    order = _drain(pol, reqs)
    assert sorted(r.request_id for r in order) == sorted(r.request_id for r in reqs)
    assert [r.priority for r in order] == sorted(r.priority for r in order)  # all queued at once: strict
    for flow in {(r.priority, r.tenant_id) for r in reqs}:
        scores = [(r.score, r.seq) for r in order if (r.priority, r.tenant_id) == flow]
        assert scores == sorted(scores)  # the inner order inside each tenant's flow
    for band in {r.priority for r in reqs}:  # fair turns: per band, flow counts differ by <= 1 in any prefix
        seq = [r.tenant_id for r in order if r.priority == band]
        total = collections.Counter(seq)
        seen: collections.Counter[str] = collections.Counter()
        for t in seq:
            seen[t] += 1
            live = [u for u in total if seen[u] < total[u] or u == t]
            assert max(seen[u] for u in live) - min(seen[u] for u in live) <= 1


def test_simulator_runs_bands_around_pars():
    specs = [
        RequestSpec(f"r{i}", 0.0, 64, 32 if i % 2 else 400, tenant_id="ab"[i % 2 == 0 and i % 4 == 0], priority=i % 2)
        for i in range(40)
    ]
    sched = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=4096)
    res = simulate(specs, "bands", scheduler=sched, policy_kwargs={"inner": "pars", "scorer": "noisy-oracle",
                                                                   "tau": 1.0, "seed": 0})  # fmt: skip
    assert all(r.state is RequestState.FINISHED for r in res.requests)
    starts = sorted(res.requests, key=lambda r: (r.first_scheduled_time, r.seq))
    # two slots, all queued at t=0: the 20 priority-0 requests start before any priority-1 one
    assert {r.priority for r in starts[:20]} == {0}
    again = simulate(specs, "bands", scheduler=sched, policy_kwargs={"inner": "pars", "scorer": "noisy-oracle",
                                                                     "tau": 1.0, "seed": 0})  # fmt: skip
    assert [r.finish_time for r in again.requests] == [r.finish_time for r in res.requests]


def test_idle_flows_are_forgotten():
    """Priorities and tenants come from clients: the flows of finished work do not pile up."""
    pol = BandsPolicy("fcfs")
    for i in range(3 * 1024):
        r = _req(f"t{i}", priority=i)
        _drain(pol, [r])
        r.transition(RequestState.FINISHED)
        pol.on_finish(r, 0.0)
    assert len(pol._flows) < 1024 and len(pol._band_v) < 1024
