"""vLLM's async scheduling (``SchedulerConfig.async_scheduling``): each step planned as the one before starts.

Hand-computed scenarios with a unit cost model (every step takes 1 s), step by step and in
fast-forward mode, each against the synchronous scheduler's decisions on the same workload.
``tests/integrations/test_sim_vs_vllm.py`` checks the same mode against vLLM's ``AsyncScheduler``.
"""

from __future__ import annotations

import pytest

from factories import make_workload, unit_cost
from headway.core import PolicyKey, Request
from headway.policies import FCFSPolicy
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import RequestSpec, Workload

STEPS = [1, 1 << 30]


def _finishes(wl: Workload, *, async_scheduling: bool, max_steps: int, seqs: int = 2) -> list[float]:
    sched = SchedulerConfig(
        max_num_seqs=seqs, max_num_batched_tokens=8, max_steps_per_event=max_steps, async_scheduling=async_scheduling
    )
    res = simulate(wl, "fcfs", preset=unit_cost(1.0), scheduler=sched)
    assert all(r.num_preemptions == 0 for r in res.requests)
    return [r.finish_time for r in res.requests]  # type: ignore[misc]


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_finished_requests_slot_is_free_a_step_later(max_steps: int) -> None:
    # Two slots. A (10 tokens) and B (2 tokens) prefill in step 0 and decode in step 1, whose output
    # finishes B at t=2. Synchronous: C takes B's slot in step 2 and ends at 3. Async: step 2 was
    # planned as step 1 started, with B still in its slot (no token for it); C runs in step 3.
    wl = make_workload([(0.0, 4, 10), (0.0, 4, 2), (0.0, 4, 1)])
    assert _finishes(wl, async_scheduling=False, max_steps=max_steps) == pytest.approx([10.0, 2.0, 3.0])
    assert _finishes(wl, async_scheduling=True, max_steps=max_steps) == pytest.approx([10.0, 2.0, 4.0])


@pytest.mark.parametrize("max_steps", STEPS)
@pytest.mark.parametrize(("arrival", "sync_end", "async_end"), [(2.0, 3.0, 4.0), (2.5, 4.0, 5.0), (2.9, 4.0, 5.0)])
def test_a_request_arriving_while_a_step_runs_waits_for_the_plan_after_next(
    max_steps: int, arrival: float, sync_end: float, async_end: float
) -> None:
    # A decodes from t=0, one step a second (step k runs from k to k+1); B (1 token) arrives.
    # Synchronous: the plan made when the step in flight ends admits it (at 2.0, a tie, step 2,
    # which ends at 3; during step 2, step 3). Async: the step after the one in flight was planned
    # as that one started, so B joins the plan made as the next one starts: a step later.
    wl = make_workload([(0.0, 4, 10), (arrival, 4, 1)])
    assert _finishes(wl, async_scheduling=False, max_steps=max_steps)[1] == pytest.approx(sync_end)
    assert _finishes(wl, async_scheduling=True, max_steps=max_steps)[1] == pytest.approx(async_end)


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_plan_with_nothing_to_run_costs_no_time(max_steps: int) -> None:
    # One slot. A (3 tokens, its max_tokens) ends at t=3. Async, step 3 was planned with A still in the
    # slot and nothing to run: the engine waits for step 2's output and plans again at once, so B starts
    # at 3 and ends at 4, as with the synchronous scheduler. An idle engine starts an arrival at once.
    # Had A stopped on its own (EOS), step 3 would have run A's one more token, and B ended at 5.
    def finishes(max_tokens: int | None, async_scheduling: bool) -> list[float]:
        specs = [RequestSpec("a", 0.0, 4, 3, max_tokens=max_tokens), RequestSpec("b", 0.0, 4, 1, max_tokens=1),
                 RequestSpec("c", 7.5, 4, 2, max_tokens=2)]  # fmt: skip
        wl = Workload.from_specs("w", specs)
        return _finishes(wl, async_scheduling=async_scheduling, max_steps=max_steps, seqs=1)

    for async_scheduling in (False, True):
        assert finishes(3, async_scheduling) == pytest.approx([3.0, 4.0, 9.5])
    assert finishes(None, False) == pytest.approx([3.0, 4.0, 9.5])
    assert finishes(None, True) == pytest.approx([3.0, 5.0, 9.5])


def test_a_step_logs_async_scheduling_reaches_its_replay() -> None:
    # the plugin's step-log header records vLLM's async_scheduling; a header without it predates that
    from headway.sim._calibrate import engine_configs

    meta = {"max_num_batched_tokens": 256, "max_num_seqs": 8, "block_size": 16, "num_gpu_blocks": 100}
    assert engine_configs({**meta, "async_scheduling": True})[0].async_scheduling
    assert not engine_configs({**meta, "async_scheduling": False})[0].async_scheduling
    assert not engine_configs(meta)[0].async_scheduling


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_request_that_stopped_on_its_own_gets_one_more_token(max_steps: int) -> None:
    # Every step costs 1 s + 0.1 s a token. A (10 tokens) and B (2) prefill in step 0 (1.8 s) and decode
    # in step 1 (1.2 s): B's second token ends it at 3.0. Stopped on its own (EOS), vLLM's async scheduler
    # gave B a token in step 2 before it could see that (1.2 s, not 1.1), so A ends at 11.9, not 11.8;
    # stopped at max_tokens, B is not scheduled again (vLLM counts its tokens in flight), nor synchronously.
    def a_finish(b_max_tokens: int | None, async_scheduling: bool) -> float:
        wl = Workload.from_specs(
            "w", [RequestSpec("a", 0.0, 4, 10), RequestSpec("b", 0.0, 4, 2, max_tokens=b_max_tokens)]
        )
        sched = SchedulerConfig(
            max_num_seqs=2, max_num_batched_tokens=8, max_steps_per_event=max_steps, async_scheduling=async_scheduling
        )
        res = simulate(wl, "fcfs", preset=unit_cost(1.0, per_token=0.1), scheduler=sched)
        assert res.requests[1].finish_time == pytest.approx(3.0)
        return res.requests[0].finish_time  # type: ignore[return-value]

    assert a_finish(None, True) == pytest.approx(11.9)
    assert a_finish(2, True) == pytest.approx(11.8)
    assert a_finish(None, False) == a_finish(2, False) == pytest.approx(11.8)


class _PromotesX(FCFSPolicy):
    """Later arrivals first, but request ``x`` jumps the queue from time ``at`` on (a starvation
    promotion, as PARS's or LTR's, announced by ``rekey_at_time``); never registered."""

    def __init__(self, at: float) -> None:
        self.at = at

    def key(self, request: Request, now: float) -> PolicyKey:
        if request.request_id == "x" and now >= self.at:
            return (0, request.arrival_time)
        return (1, -request.arrival_time)

    def rekey_at_time(self, request: Request) -> float | None:
        return self.at if request.request_id == "x" else None


def _promotion_run(at: float) -> list[tuple[str, float | None, float | None, int]]:
    # Two slots, four 16-token KV blocks, every step 1 s. A and X prefill in step 0 and decode; the
    # plan of the step at t=17, made as the step at t=16 started (t=16.000001), finds no block for
    # both and evicts X (the later arrival). C arrived at t=5 and waits, ahead of an unpromoted X.
    specs = [RequestSpec("a", 0.0, 16, 60), RequestSpec("x", 0.0, 16, 60), RequestSpec("c", 5.0, 16, 4)]
    sched = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, async_scheduling=True)
    cache = CacheConfig(num_gpu_blocks=4, enable_prefix_caching=False)
    res = simulate(Workload.from_specs("w", specs), _PromotesX(at), preset=unit_cost(1.0), scheduler=sched, cache=cache)
    return [(r.request_id, r.first_scheduled_time, r.finish_time, r.num_preemptions) for r in res.requests]


@pytest.mark.parametrize("at", [16.0000015, 16.5, 17.0])
def test_a_promotion_due_while_the_plan_that_queued_it_runs_is_not_lost(at: float) -> None:
    # X, evicted by a plan made at t=16.000001 (its key then unpromoted), is due its promotion before
    # the step that plan launched ends (t=17). The plan after, made at t=17.000001, sees it promoted,
    # as it sees a promotion due at t=17.0000005, after that step's end: X goes back to the queue's
    # head and C waits (the timer was not armed: X stayed unpromoted, as if never due, and C ran at 18).
    promoted = _promotion_run(17.0000005)
    assert promoted != _promotion_run(1000.0)
    assert _promotion_run(at) == promoted
