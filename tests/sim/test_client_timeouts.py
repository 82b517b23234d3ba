"""Clients that abort their requests (``RequestSpec.timeout``), hand-computed: one-second steps.

vLLM takes an abort between steps: a waiting request leaves the queue when its client gives up, a
running one after the step in flight (whose output comes first), before the next step is planned.
``tests/integrations/test_sim_vs_vllm.py`` checks the same against vLLM's own schedulers.
"""

from __future__ import annotations

import pytest

from factories import unit_cost
from headway.core import RequestState
from headway.metrics import summarize
from headway.sim import CacheConfig, SchedulerConfig, SimResult, simulate
from headway.workload import RequestSpec, Workload, load_workload

STEP = unit_cost(1.0)


def _run(specs: list[RequestSpec], *, seqs: int = 1, async_scheduling: bool = False, exact: bool = True) -> SimResult:
    sched = SchedulerConfig(
        max_num_seqs=seqs, async_scheduling=async_scheduling, max_steps_per_event=1 if exact else 1 << 30
    )
    wl = Workload.from_specs("t", specs)
    return simulate(wl, "fcfs", preset=STEP, scheduler=sched, cache=CacheConfig(num_gpu_blocks=64))


@pytest.mark.parametrize("exact", [True, False])
def test_a_waiting_request_leaves_at_its_timeout_a_running_one_after_the_step(exact: bool) -> None:
    # one slot: a prefills in step 0 and decodes from step 1; its client gives up at 3.5, in step 3,
    # and it leaves as that step ends (4.0), when b starts; c waits behind them and leaves at 3.0
    res = _run([
        RequestSpec("a", 0.0, 16, 10, timeout=3.5),
        RequestSpec("b", 0.0, 16, 10),
        RequestSpec("c", 1.0, 16, 10, timeout=2.0),
    ], exact=exact)  # fmt: skip
    a, b, c = res.requests
    assert (a.state, a.first_scheduled_time, a.finish_time) == (RequestState.ABORTED, 0.0, 4.0)
    assert a.extra["abort_reason"] == "client timeout" and a.num_preemptions == 0
    assert (b.state, b.first_scheduled_time, b.finish_time) == (RequestState.FINISHED, 4.0, 14.0)
    assert (c.state, c.first_scheduled_time, c.finish_time) == (RequestState.ABORTED, None, 3.0)
    summary = summarize(res.requests)
    assert (summary.num_completed, summary.num_aborted, summary.aborted_by_reason) == (1, 2, {"client timeout": 2})


@pytest.mark.parametrize(("timeout", "state"), [(1.5, RequestState.ABORTED), (2.5, RequestState.FINISHED)])
def test_the_step_in_flight_finishes_what_it_finishes_before_the_abort(timeout: float, state: RequestState) -> None:
    # a's third token comes out of step 2 (ending at 3.0); an abort during that step comes after it
    (a,) = _run([RequestSpec("a", 0.0, 16, 3, timeout=timeout)]).requests
    assert (a.state, a.finish_time) == (state, 2.0 if state is RequestState.ABORTED else 3.0)


@pytest.mark.parametrize(("timeout", "state"), [(2.0000005, RequestState.ABORTED), (2.5, RequestState.FINISHED)])
def test_async_scheduling_takes_an_abort_before_the_output_of_the_step_in_flight(
    timeout: float, state: RequestState
) -> None:
    # vLLM's async scheduler plans step 3 as step 2 starts, before step 2's output: an abort by
    # then (ASYNC_PLAN_DELAY after that start) ends a, whose last token step 2 computes; a later
    # one comes after that output, which finished a
    (a,) = _run([RequestSpec("a", 0.0, 16, 3, timeout=timeout)], async_scheduling=True).requests
    assert (a.state, a.finish_time) == (state, 3.0)


def test_an_aborted_requests_blocks_stay_in_the_prefix_cache() -> None:
    # a computes its 48-token prompt (three hashed blocks) and is aborted after step 2; b, with the
    # same three blocks and one more, finds them cached
    res = _run([
        RequestSpec("a", 0.0, 48, 20, block_hashes=(1, 2, 3), timeout=2.5),
        RequestSpec("b", 5.0, 64, 1, block_hashes=(1, 2, 3, 4)),
    ])  # fmt: skip
    a, b = res.requests
    assert a.state is RequestState.ABORTED and b.num_cached_tokens == 48


def test_the_next_turn_of_a_session_follows_an_aborted_one() -> None:
    # the client gives up on t1 at 2.5 and sends t2 a think time later, at 3.5: the engine takes the
    # abort at its step's end (3.0), which the client does not wait for
    res = _run([
        RequestSpec("t1", 0.0, 16, 10, timeout=2.5),
        RequestSpec("t2", 0.0, 16, 2, after="t1", think_time=1.0),
    ])  # fmt: skip
    t1, t2 = res.requests
    assert (t1.state, t1.finish_time) == (RequestState.ABORTED, 3.0)
    assert (t2.arrival_time, t2.state) == (3.5, RequestState.FINISHED)
    # with no think time it comes as the client gives up (2.5), before the engine takes the abort (3.0)
    res = _run([
        RequestSpec("t1", 0.0, 16, 10, timeout=2.5),
        RequestSpec("t2", 0.0, 16, 2, after="t1", think_time=0.0),
    ])  # fmt: skip
    assert res.requests[1].arrival_time == 2.5
    assert res.requests[0].finish_time == 3.0


def test_a_client_timeout_applies_to_every_request_of_a_workload() -> None:
    wl = load_workload("default", num_requests=20, client_timeout=2.0)
    assert {s.timeout for s in wl.requests} == {2.0}
    with pytest.raises(ValueError, match="client_timeout"):
        load_workload("default", num_requests=20, client_timeout=-1.0)
    with pytest.raises(ValueError, match="timeout"):
        RequestSpec("a", 0.0, 16, 3, timeout=float("nan"))
