"""summarize() on hand-computed runs (the five requests of conftest.example_run).

    id  tenant tier      state     arrival  ttft  tpot  e2e  norm  queue  out
    A   a      standard  finished  0        1     1     4    1     0      4
    B   a      standard  finished  1        2     0.5   4    0.8   1      5
    C   b      premium   finished  2        0.5   -     2    2     0      1
    D   b      premium   aborted   3        (client_gone, no finish_time)
    E   a      standard  aborted   3.5      (no reason)

Makespan: first arrival 0 -> last finish 5 (B) = 5 s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from headway.core import Request, RequestState, Tier
from headway.metrics import SLO, RunSummary, summarize
from headway.metrics._summary import ITL_KEY


def test_counts_tokens_and_throughput(example_run: list[Request]) -> None:
    s = summarize(example_run, name="fcfs")
    assert s.name == "fcfs"
    assert (s.num_requests, s.num_completed, s.num_aborted, s.num_unfinished) == (5, 3, 2, 0)
    assert dict(s.aborted_by_reason) == {"client_gone": 1, "unknown": 1}
    assert (s.start_time, s.end_time, s.makespan) == (0.0, 5.0, 5.0)
    assert (s.total_prompt_tokens, s.total_output_tokens) == (30, 10)
    assert s.request_throughput == pytest.approx(3 / 5)
    assert s.output_throughput == pytest.approx(10 / 5)
    assert s.total_token_throughput == pytest.approx(40 / 5)
    # aborted requests' preemptions count too
    assert (s.num_preemptions, s.num_recomputed_tokens) == (3, 13)
    assert s.slo is None and s.slo_attainment is None and s.goodput is None and s.num_slo_met is None


def test_latency_stats_exclude_aborted(example_run: list[Request]) -> None:
    s = summarize(example_run)
    # TTFT sorted [0.5, 1, 2]: p50 = 1, p90 at position 1.8 -> 1 + 0.8 = 1.8, p99 -> 1.98
    assert s.ttft.count == 3
    assert s.ttft.mean == pytest.approx(3.5 / 3)
    assert (s.ttft.min, s.ttft.p50, s.ttft.max) == (0.5, 1.0, 2.0)
    assert s.ttft.p90 == pytest.approx(1.8)
    assert s.ttft.p95 == pytest.approx(1.9)
    assert s.ttft.p99 == pytest.approx(1.98)
    # TPOT only for >= 2 output tokens: [0.5, 1]
    assert s.tpot.count == 2
    assert s.tpot.p50 == pytest.approx(0.75)
    assert s.tpot.p90 == pytest.approx(0.95)
    # E2E [2, 4, 4]
    assert s.e2e.mean == pytest.approx(10 / 3)
    assert (s.e2e.p50, s.e2e.p99, s.e2e.max) == (4.0, 4.0, 4.0)
    # normalized [0.8, 1, 2]
    assert s.normalized_latency.mean == pytest.approx(3.8 / 3)
    assert s.normalized_latency.p50 == pytest.approx(1.0)
    assert s.normalized_latency.p90 == pytest.approx(1.8)
    # queueing [0, 0, 1]
    assert s.queueing_delay.mean == pytest.approx(1 / 3)
    assert s.queueing_delay.p50 == 0.0


def test_slo_attainment_and_goodput(example_run: list[Request]) -> None:
    # A: ttft 1 <= 1.5, e2e 4 <= 4 (boundary) -> met; B: ttft 2 > 1.5 -> miss; C met; D, E aborted
    s = summarize(example_run, slo="ttft:1500 e2el:4000")
    assert s.slo == SLO(ttft=1.5, e2e=4.0)
    assert s.num_slo_met == 2
    assert s.slo_attainment == pytest.approx(2 / 5)  # over all requests, aborted are misses
    assert s.goodput == pytest.approx(2 / 5)  # 2 good requests / 5 s makespan


def test_goodput_per_tenant_and_tier(example_run: list[Request]) -> None:
    # met: A (tenant a, standard) and C (tenant b, premium); each group's goodput is over the run's 5 s
    s = summarize(example_run, slo="ttft:1500 e2el:4000")
    assert s.tenants["a"].goodput == pytest.approx(1 / 5) and s.tenants["b"].goodput == pytest.approx(1 / 5)
    assert s.tiers["standard"].goodput == pytest.approx(1 / 5) and s.tiers["premium"].goodput == pytest.approx(1 / 5)
    assert sum(g.goodput for g in s.tenants.values()) == pytest.approx(s.goodput)
    assert s.to_dict()["tenants"]["a"]["goodput"] == pytest.approx(1 / 5)
    assert all(g.goodput is None for g in summarize(example_run).tenants.values())  # no SLO: none


def test_tpot_target_one_token_request_meets_it(example_run: list[Request]) -> None:
    # A: tpot 1 > 0.6 miss; B: 0.5 met; C: 1 output token -> TPOT 0 -> met
    s = summarize(example_run, slo=SLO(tpot=0.6))
    assert s.num_slo_met == 2
    assert s.tenants["a"].num_slo_met == 1 and s.tenants["a"].slo_attainment == pytest.approx(1 / 3)
    assert s.tenants["b"].num_slo_met == 1 and s.tenants["b"].slo_attainment == pytest.approx(1 / 2)


def test_goodput_all_targets_together(example_run: list[Request]) -> None:
    s = summarize(example_run, slo="ttft:2000 tpot:600 e2el:3000")
    # A: e2e 4 > 3 miss; B: e2e 4 miss; C: ttft .5, tpot 0, e2e 2 -> met
    assert s.num_slo_met == 1
    assert s.goodput == pytest.approx(1 / 5)
    assert s.slo_attainment == pytest.approx(1 / 5)


def test_per_tenant_and_per_tier(example_run: list[Request]) -> None:
    s = summarize(example_run)
    assert list(s.tenants) == ["a", "b"]
    a, b = s.tenants["a"], s.tenants["b"]
    assert (a.num_requests, a.num_completed, a.num_aborted) == (3, 2, 1)
    assert (b.num_requests, b.num_completed, b.num_aborted) == (2, 1, 1)
    assert a.normalized_latency.mean == pytest.approx(0.9)
    assert b.normalized_latency.mean == pytest.approx(2.0)
    assert a.total_output_tokens == 9 and a.output_throughput == pytest.approx(9 / 5)
    assert (a.num_preemptions, b.num_preemptions) == (1, 2)
    # tiers ordered by importance: premium before standard
    assert list(s.tiers) == ["premium", "standard"]
    assert s.tiers["premium"].num_requests == 2 and s.tiers["premium"].e2e.max == 2.0
    assert s.tiers["standard"].ttft.count == 2


def test_jain_over_tenant_inverse_normalized_latency(example_run: list[Request]) -> None:
    # x_a = 1 / 0.9 = 10/9, x_b = 1 / 2 -> J = (29/18)^2 / (2 * 481/324) = 841 / 962
    s = summarize(example_run)
    assert s.jain_fairness == pytest.approx(841 / 962, abs=1e-12)


def test_jain_tenant_without_completions_counts_zero(
    mk_finished: Callable[..., Request], mk_aborted: Callable[..., Request]
) -> None:
    reqs = [
        mk_finished("x", 0.0, ttft=0.1, e2e=1.0, n_out=10, tenant="x"),  # norm 0.1 -> x = 10
        mk_finished("y", 0.0, ttft=0.1, e2e=1.0, n_out=10, tenant="y"),  # x = 10
        mk_aborted("z", 0.5, tenant="z"),  # x = 0
    ]
    # (10 + 10 + 0)^2 / (3 * 200) = 2/3
    assert summarize(reqs).jain_fairness == pytest.approx(2 / 3)
    assert summarize(reqs[:1]).jain_fairness == 1.0


def _zero_token(rid: str, tenant: str) -> Request:
    """A FINISHED request with no output token (no normalized latency)."""
    r = Request(rid, 0.0, 10, 10, tenant_id=tenant)
    r.state = RequestState.FINISHED
    r.finish_time = 1.0
    return r


def test_jain_leaves_out_tenants_without_a_finite_speed(mk_finished: Callable[..., Request]) -> None:
    fast = mk_finished("f", 0.0, ttft=0.0, e2e=0.0, n_out=3, tenant="fast")  # mean normalized latency 0
    x = mk_finished("x", 0.0, ttft=0.1, e2e=1.0, n_out=10, tenant="x")  # x = 10
    y = mk_finished("y", 0.0, ttft=0.5, e2e=2.0, n_out=4, tenant="y")  # x = 2
    # a zero latency made x infinite and the index NaN; now that tenant is left out
    assert summarize([fast, x, y]).jain_fairness == pytest.approx(summarize([x, y]).jain_fairness)
    assert summarize([x, y]).jain_fairness == pytest.approx(144 / (2 * 104))
    assert summarize([fast, x]).jain_fairness == 1.0  # one tenant left: nobody behind anybody
    assert summarize([_zero_token("z", "z"), x, y]).jain_fairness == pytest.approx(144 / 208)
    # one tenant is 1.0, whatever its latency (a 0-token request, or zero latency)
    assert summarize([_zero_token("z", "z")]).jain_fairness == 1.0
    assert summarize([fast]).jain_fairness == 1.0
    # tiny latencies: speeds near 1e307, whose squares would overflow (inf / inf = NaN)
    tiny = [mk_finished(t, 0.0, ttft=0.0, e2e=e2e, n_out=10, tenant=t) for t, e2e in (("p", 1e-306), ("q", 2e-306))]
    assert summarize(tiny).jain_fairness == pytest.approx(9 / 10)


def test_jain_is_nan_only_when_nobody_measurable_progressed(
    mk_finished: Callable[..., Request], mk_aborted: Callable[..., Request]
) -> None:
    assert math.isnan(summarize([mk_aborted("a", 0.0, tenant="a"), mk_aborted("b", 0.0, tenant="b")]).jain_fairness)
    # a starved tenant beside one whose speed is undefined: no positive speed to compare with
    assert math.isnan(summarize([mk_aborted("a", 0.0, tenant="a"), _zero_token("z", "z")]).jain_fairness)
    x = mk_finished("x", 0.0, ttft=0.1, e2e=1.0, n_out=10, tenant="x")
    assert summarize([mk_aborted("a", 0.0, tenant="a"), x]).jain_fairness == pytest.approx(1 / 2)


def test_order_does_not_matter(example_run: list[Request]) -> None:
    base = summarize(example_run, slo="ttft:1500").to_dict()
    shuffled = example_run[:]
    random.Random(7).shuffle(shuffled)
    assert summarize(shuffled, slo="ttft:1500").to_dict() == base


def test_empty_input_raises() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        summarize([])


def test_all_aborted(mk_aborted: Callable[..., Request]) -> None:
    s = summarize([mk_aborted("a", 1.0, reason="ttl", finish=3.0), mk_aborted("b", 2.0, reason="ttl")],
                  slo="e2el:1000")
    assert (s.num_completed, s.num_aborted) == (0, 2)
    assert dict(s.aborted_by_reason) == {"ttl": 2}
    assert s.makespan == 2.0  # the aborted request's finish_time still ends the run (after b's arrival)
    assert s.e2e.count == 0 and math.isnan(s.e2e.mean)
    assert s.request_throughput == 0.0 and s.goodput == 0.0 and s.slo_attainment == 0.0
    assert math.isnan(s.jain_fairness)
    d = s.to_dict()
    assert d["jain_fairness"] is None
    assert d["e2e"] == {"count": 0, "mean": None, "min": None, "p50": None, "p90": None,
                        "p95": None, "p99": None, "max": None}


def test_unfinished_requests_are_counted_and_miss_slo(mk_finished: Callable[..., Request]) -> None:
    waiting = Request("w", 0.5, 10, 10)
    s = summarize([mk_finished("f", 0.0, ttft=0.1, e2e=1.0, n_out=2), waiting], slo="e2el:5000")
    assert (s.num_completed, s.num_aborted, s.num_unfinished) == (1, 0, 1)
    assert s.slo_attainment == 0.5


def test_makespan_runs_to_the_latest_arrival(
    mk_finished: Callable[..., Request], mk_aborted: Callable[..., Request]
) -> None:
    # the last finish (1.0) is before a later arrival: the run still lasts until it arrived
    done = mk_finished("f", 0.0, ttft=0.5, e2e=1.0, n_out=4)
    for late in (Request("w", 10.0, 10, 10), mk_aborted("a", 10.0)):
        s = summarize([done, late], slo="e2el:5000")
        assert (s.start_time, s.end_time, s.makespan) == (0.0, 10.0, 10.0)
        assert s.request_throughput == pytest.approx(1 / 10) and s.goodput == pytest.approx(1 / 10)
    # an aborted request that arrived late and finished even later ends the run at its finish
    assert summarize([done, mk_aborted("a", 10.0, finish=12.0)]).end_time == 12.0
    assert summarize([done, Request("w", 0.5, 10, 10)]).end_time == 1.0  # an earlier arrival changes nothing


def test_finished_without_finish_time_is_an_error() -> None:
    r = Request("bad", 0.0, 10, 10)
    r.state = RequestState.FINISHED
    with pytest.raises(ValueError, match="no finish_time"):
        summarize([r])


def test_zero_makespan_rates_are_nan() -> None:
    r = Request("z", 1.0, 10, 10, tier=Tier.BATCH)
    r.state = RequestState.FINISHED
    r.num_output_tokens = 1
    r.first_token_time = r.last_token_time = r.finish_time = 1.0
    s = summarize([r], slo="e2el:1")
    assert s.makespan == 0.0 and math.isnan(s.request_throughput)
    assert s.goodput is not None and math.isnan(s.goodput)
    assert s.to_dict()["goodput"] is None
    assert s.jain_fairness == 1.0  # one tenant (with zero per-token latency) is as fair as can be


def test_dict_round_trip(example_run: list[Request]) -> None:
    for slo in (None, "ttft:1500 tpot:600"):
        s = summarize(example_run, slo=slo, name="x")
        d = s.to_dict()
        back = RunSummary.from_dict(d)
        assert back == s
        assert back.to_dict() == d


def _with_gaps(r: Request, *gaps: float) -> Request:
    r.extra[ITL_KEY] = list(gaps)
    return r


def test_itl_is_over_every_gap_of_completed_requests(
    mk_finished: Callable[..., Request], mk_aborted: Callable[..., Request]
) -> None:
    reqs = [
        _with_gaps(mk_finished("a", 0.0, ttft=0.1, e2e=0.4, n_out=4, tenant="a"), 0.1, 0.1, 0.1),
        _with_gaps(mk_finished("b", 0.0, ttft=0.1, e2e=1.1, n_out=3, tenant="b"), 0.2, 0.8),
        _with_gaps(mk_finished("c", 0.0, ttft=0.1, e2e=0.1, n_out=1)),  # one token: no gap
        _with_gaps(mk_aborted("d", 0.0, finish=1.0), 5.0),  # aborted: left out (as vLLM's failed requests)
        mk_finished("e", 0.0, ttft=0.1, e2e=2.0, n_out=3),  # no gaps recorded (unstreamed)
    ]
    s = summarize(reqs)
    # gaps [0.1, 0.1, 0.1, 0.2, 0.8]: ITL weighs every gap, TPOT every request
    assert s.itl.count == 5
    assert s.itl.mean == pytest.approx(1.3 / 5) and s.itl.p50 == pytest.approx(0.1) and s.itl.max == 0.8
    assert s.itl.p99 == pytest.approx(0.2 + 0.96 * 0.6)
    assert s.tpot.count == 3
    shuffled = reqs[::-1]
    assert summarize(shuffled).to_dict() == s.to_dict()
    back = RunSummary.from_dict(s.to_dict())
    assert back.itl == s.itl and back.to_dict() == s.to_dict()


def test_itl_is_absent_without_recorded_gaps(example_run: list[Request]) -> None:
    # the simulator has no chunks: ITL stays empty (NaN), it is not made up from TPOT
    s = summarize(example_run, slo="ttft:1500")
    assert s.itl.count == 0 and math.isnan(s.itl.mean)
    d = s.to_dict()
    assert d["itl"]["count"] == 0 and d["itl"]["mean"] is None
    # a summary written before ITL (and group goodput) existed still reads
    del d["itl"]
    for g in d["tenants"].values():
        del g["goodput"]
    old = RunSummary.from_dict(d)
    assert old.itl.count == 0 and all(math.isnan(g.goodput) for g in old.tenants.values())
