"""Hand-computed scenarios with exact expected times."""

from __future__ import annotations

import pytest

from factories import make_workload, unit_cost
from headway.core import RequestState
from headway.sim import CacheConfig, SchedulerConfig, simulate


@pytest.mark.parametrize("max_steps", [1, 1 << 30])
def test_two_requests_mixed_batch(max_steps: int) -> None:
    # step time = 1 + 0.25 x tokens + 0.01 x KV tokens read.
    # step 0 [0, 2.04]:  A prefills 4 tokens (kv 4)            -> A's first token at 2.04
    # step 1 [2.04, 4.38]: A decodes (kv 5) + B prefills 4 (kv 4) -> 1 + 1.25 + 0.09 = 2.34;
    #                      B (1 output token) finishes at 4.38
    # step 2 [4.38, 5.69]: A decodes (kv 6) -> 1 + 0.25 + 0.06 = 1.31; A's 3rd token ends it
    wl = make_workload([(0.0, 4, 3), (0.5, 4, 1)])
    res = simulate(wl, "fcfs", preset=unit_cost(1.0, 0.25, 0.01),
                   scheduler=SchedulerConfig(max_steps_per_event=max_steps))
    a, b = res.requests
    assert a.first_token_time == pytest.approx(2.04, abs=1e-12)
    assert b.first_token_time == pytest.approx(4.38, abs=1e-12)
    assert b.finish_time == pytest.approx(4.38, abs=1e-12)
    assert a.finish_time == pytest.approx(5.69, abs=1e-12)
    assert a.tpot == pytest.approx((5.69 - 2.04) / 2, abs=1e-12)
    assert b.ttft == pytest.approx(3.88, abs=1e-12)
    assert (a.num_output_tokens, b.num_output_tokens) == (3, 1)
    assert res.num_steps == 3
    assert all(r.state is RequestState.FINISHED for r in res.requests)


@pytest.mark.parametrize("max_steps", [1, 1 << 30])
def test_an_arrival_lengthens_the_step_in_flight(max_steps: int) -> None:
    # As test_two_requests_mixed_batch, with per_arrival = 0.5: A arrives on an idle engine (no
    # cost, queued at 0); B arrives at 0.5 during step 0, which ends 0.5 later, at 2.54; B is
    # queued then. Step 1 [2.54, 4.88], step 2 [4.88, 6.19].
    import dataclasses

    wl = make_workload([(0.0, 4, 3), (0.5, 4, 1)])
    cost = dataclasses.replace(unit_cost(1.0, 0.25, 0.01), per_arrival=0.5)
    res = simulate(wl, "fcfs", preset=cost, scheduler=SchedulerConfig(max_steps_per_event=max_steps))
    a, b = res.requests
    assert (a.queued_time, b.queued_time) == (0.0, pytest.approx(2.54, abs=1e-12))
    assert a.first_token_time == pytest.approx(2.54, abs=1e-12)
    assert b.finish_time == pytest.approx(4.88, abs=1e-12)
    assert a.finish_time == pytest.approx(6.19, abs=1e-12)


def test_arrivals_during_a_decode_stretch_cut_it_and_add_up() -> None:
    # A decodes alone (step 1 + 0.25 + 0.01 x kv); B and C arrive at 3.0 and 3.1, inside the same
    # decode step, each adding 0.5 to it; fast-forward and step-by-step agree.
    import dataclasses

    wl = make_workload([(0.0, 4, 40), (3.0, 4, 2), (3.1, 4, 2)])
    cost = dataclasses.replace(unit_cost(1.0, 0.25, 0.01), per_arrival=0.5)
    runs = [simulate(wl, "fcfs", preset=cost, scheduler=SchedulerConfig(max_steps_per_event=k)) for k in (1, 1 << 30)]
    base = simulate(wl, "fcfs", preset=unit_cost(1.0, 0.25, 0.01), scheduler=SchedulerConfig(max_steps_per_event=1))
    for res in runs:
        b, c = res.requests[1], res.requests[2]
        assert b.queued_time == c.queued_time  # both seen at the end of the step they arrived in
        assert b.queued_time == pytest.approx(base.requests[1].queued_time + 1.0, abs=1e-12)
    assert [r.finish_time for r in runs[0].requests] == pytest.approx([r.finish_time for r in runs[1].requests])


@pytest.mark.parametrize("max_steps", [1, 1 << 30])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_when_blocks_run_out(max_steps: int, mode: str) -> None:
    # Two blocks of 16 tokens; two 16-token prompts fill them. At step 1 both decoders
    # cross a block boundary and need a block each: FCFS evicts the later one (B).
    # A then runs alone: steps 1..9 give it tokens 2..10, finishing at t=10 and freeing
    # both blocks. B returns: recompute prefills its 17 tokens (16 prompt + 1 output)
    # at step [10, 11] and samples token 2; 8 decode steps finish it at t=19.
    # Swap keeps B's 16 computed tokens: it resumes with a 1-token step, the same timing
    # here because per-token and swap costs are zero.
    wl = make_workload([(0.0, 16, 10), (0.0, 16, 10)])
    res = simulate(wl, "fcfs", preset=unit_cost(1.0),
                   scheduler=SchedulerConfig(max_steps_per_event=max_steps, preemption_mode=mode),  # type: ignore[arg-type]
                   cache=CacheConfig(num_gpu_blocks=2))
    a, b = res.requests
    assert a.first_token_time == 1.0 and b.first_token_time == 1.0
    assert a.finish_time == pytest.approx(10.0)
    assert b.finish_time == pytest.approx(19.0)
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert b.num_recomputed_tokens == (16 if mode == "recompute" else 0)
    assert res.replicas[0].num_preemptions == 1


def test_prompt_larger_than_cache_is_aborted_with_reason() -> None:
    wl = make_workload([(0.0, 100, 5), (0.0, 10, 5)])
    res = simulate(wl, "fcfs", preset=unit_cost(), cache=CacheConfig(num_gpu_blocks=2))
    big, small = res.requests
    assert big.state is RequestState.ABORTED
    assert big.extra["abort_reason"] == "prompt does not fit the KV cache (32 tokens)"
    assert small.state is RequestState.FINISHED


def test_no_chunking_prompt_must_fit_budget() -> None:
    # Without chunked prefill a 40-token prompt cannot share a 48-token step with a
    # second 40-token prompt: the second waits one step.
    wl = make_workload([(0.0, 40, 1), (0.0, 40, 1)])
    res = simulate(wl, "fcfs", preset=unit_cost(1.0),
                   scheduler=SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=4,
                                             enable_chunked_prefill=False))
    a, b = res.requests
    assert (a.finish_time, b.finish_time) == (1.0, 2.0)


def test_chunked_prefill_splits_long_prompt() -> None:
    # 100-token prompt with a 48-token budget: chunks 48, 48, 4 -> first token after 3 steps.
    wl = make_workload([(0.0, 100, 2)])
    res = simulate(wl, "fcfs", preset=unit_cost(1.0),
                   scheduler=SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=4))
    (a,) = res.requests
    assert a.first_token_time == 3.0 and a.finish_time == 4.0
    assert res.replicas[0].max_step_tokens == 48
