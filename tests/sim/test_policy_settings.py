"""Engine settings a policy states (Sarathi's chunked prefill and token budget) reach the simulator."""

from __future__ import annotations

import pytest

from headway.core import make_policy
from headway.sim import SchedulerConfig, simulate
from headway.workload import RequestSpec


def _one_long_prompt() -> list[RequestSpec]:
    return [RequestSpec("long", 0.0, num_prompt_tokens=900, num_output_tokens=2)]


def test_sarathi_caps_the_step_token_budget() -> None:
    sched = SchedulerConfig(max_num_batched_tokens=2048)
    fcfs = simulate(_one_long_prompt(), "fcfs", scheduler=sched)
    sarathi = simulate(_one_long_prompt(), "sarathi", scheduler=sched, policy_kwargs={"token_budget": 256})
    assert fcfs.scheduler is not None and fcfs.scheduler.max_num_batched_tokens == 2048
    assert sarathi.scheduler is not None and sarathi.scheduler.max_num_batched_tokens == 256
    # the 900-token prompt takes 4 chunked steps instead of one: its first token comes later
    assert fcfs.num_steps == 2 and sarathi.num_steps == 5
    assert sarathi.requests[0].first_token_time > fcfs.requests[0].first_token_time
    # a budget above the engine's leaves the engine's
    big = simulate(_one_long_prompt(), "sarathi", scheduler=sched, policy_kwargs={"token_budget": 4096})
    assert big.scheduler == sched and big.num_steps == 2


def test_sarathi_needs_chunked_prefill_and_a_positive_integer_budget() -> None:
    with pytest.raises(ValueError, match="'sarathi' needs chunked prefill"):
        simulate(_one_long_prompt(), "sarathi", scheduler=SchedulerConfig(enable_chunked_prefill=False))
    for bad in (0, 1.5, True, "512"):
        with pytest.raises(ValueError, match=f"token_budget must be a positive integer, got {bad!r}"):
            make_policy("sarathi", token_budget=bad)


def test_a_policy_instance_runs_one_simulation() -> None:
    # a stateful policy (gamma-Ada's gamma, an estimator's bias, a scorer's random draws) would
    # start a second run from where the first ended: reproducible runs need a fresh instance
    pol = make_policy("uniboost")
    simulate(_one_long_prompt(), pol)
    with pytest.raises(ValueError, match="'uniboost' instance already ran a simulation"):
        simulate(_one_long_prompt(), pol)
    simulate(_one_long_prompt(), "uniboost")  # by name: a new instance each time
    simulate(_one_long_prompt(), "uniboost")
