"""vLLM's ``long_prefill_token_threshold`` (``SchedulerConfig``): a cap on one request's prefill chunk.

Hand-computed with a unit cost model (every step takes 1 s); ``tests/integrations/test_sim_vs_vllm.py``
checks the same against vLLM's scheduler.
"""

from __future__ import annotations

import pytest

from factories import make_workload, unit_cost
from headway.sim import SchedulerConfig, simulate
from headway.sim._calibrate import engine_configs


def _first_tokens(rows: list[tuple[float, int, int]], **cfg: object) -> list[float]:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, **cfg)  # type: ignore[arg-type]
    res = simulate(make_workload(rows), "fcfs", preset=unit_cost(1.0), scheduler=sched)
    return [r.first_token_time for r in res.requests]  # type: ignore[misc]


def test_the_cap_holds_while_another_request_runs_or_waits() -> None:
    # A 60-token prompt alone: one step, cap or not. Beside a 10-token one (5 tokens out) in a 64-token
    # budget: without the cap it takes 60 and the short one 4, then 6 (first tokens at 1 and 2); capped
    # at 16 a step it takes 16+16+16+12 (first token at 4) and the short one its 10 at once (at 1). With
    # the short one done after its first token, the long one is alone from step 1 on: 16, then 44.
    assert _first_tokens([(0.0, 60, 1)], long_prefill_token_threshold=16) == pytest.approx([1.0])
    both = [(0.0, 60, 5), (0.0, 10, 5)]
    assert _first_tokens(both) == pytest.approx([1.0, 2.0])
    assert _first_tokens(both, long_prefill_token_threshold=16) == pytest.approx([4.0, 1.0])
    assert _first_tokens([(0.0, 60, 5), (0.0, 10, 1)], long_prefill_token_threshold=16) == pytest.approx([2.0, 1.0])
    # adaptive: at least the budget over the requests running and waiting (64 / 2 = 32): 32 + 28
    adaptive = {"long_prefill_token_threshold": 16, "long_prefill_token_threshold_adaptive": True}
    assert _first_tokens(both, **adaptive) == pytest.approx([2.0, 1.0])


def test_the_cap_needs_chunked_prefill_and_a_step_log_carries_it() -> None:
    with pytest.raises(ValueError, match="needs chunked prefill"):
        SchedulerConfig(enable_chunked_prefill=False, long_prefill_token_threshold=16)
    meta = {"max_num_batched_tokens": 256, "max_num_seqs": 8, "block_size": 16, "num_gpu_blocks": 100}
    logged = {**meta, "long_prefill_token_threshold": 32, "long_prefill_token_threshold_adaptive": True}
    sched = engine_configs(logged)[0]
    assert (sched.long_prefill_token_threshold, sched.long_prefill_token_threshold_adaptive) == (32, True)
    assert engine_configs(meta)[0].long_prefill_token_threshold == 0
    off = {**meta, "enable_chunked_prefill": False, "long_prefill_token_threshold": 32}
    assert engine_configs(off)[0].long_prefill_token_threshold == 0
