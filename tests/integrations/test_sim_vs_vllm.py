"""headway's simulator against vLLM 0.32's own ``Scheduler``, on the differential harness's scenarios.

The simulator runs in exact step-by-step mode (``max_steps_per_event=1``) with a cost model whose
every step takes one second, so its times are step numbers; vLLM's scheduler runs with no model
(``_vllm_steps.py``). Compared per request: the step it is first scheduled in, the step whose
output finishes it, and how often it is preempted. Bursts (every request arrives before the first
step), no aborts, prefix caching off: what the simulator models today.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from integrations._stepdiff import VllmSteps, roomy, scenarios, sim_outcome, vllm_outcome

pytestmark = [pytest.mark.vllm]



@settings(deadline=None, derandomize=True)
@given(scenario=scenarios(aborts=False, burst=True))
def test_fcfs_without_kv_pressure_sim_makes_vllms_decisions(vllm_steps: VllmSteps, scenario: dict[str, Any]) -> None:
    scenario = roomy(scenario)
    assert sim_outcome(scenario) == vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"]), json.dumps(scenario)


@settings(deadline=None, derandomize=True)
@given(scenario=scenarios(policy="priority", aborts=False, burst=True))
def test_priority_without_kv_pressure_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any]
) -> None:
    scenario = roomy(scenario)
    assert sim_outcome(scenario) == vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"]), json.dumps(scenario)
