"""Step-by-step differential test: headway's plugin against vLLM 0.32's own schedulers.

vLLM's ``Scheduler`` and ``AsyncScheduler`` run in-process in the vLLM virtualenv with no model
(``_vllm_steps.py``); this side (main virtualenv) generates the request streams with hypothesis
and compares every step: scheduled request ids and token counts (in order), prefix-cache hits
(each new request's computed tokens), preemptions and finishes. ``HYPOTHESIS_PROFILE=deep`` runs
1,000 scenarios per test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations._stepdiff import VllmSteps, describe, drawn, first_difference, scenarios

pytestmark = [pytest.mark.vllm]


def _same(vllm_steps: VllmSteps, scenario: dict[str, Any], base: str, policy: str) -> None:
    ref = vllm_steps.run(scenario, base)
    got = vllm_steps.run(scenario, f"headway{base.removeprefix('vllm')}", policy=policy)
    describe(scenario, ref["steps"])
    diff = first_difference(ref["steps"], got["steps"])
    assert diff is None, f"{diff}\nscenario: {json.dumps(scenario)}"
    assert got["tokens"] == ref["tokens"]


@drawn()
@given(scenario=scenarios(), base=st.sampled_from(["vllm", "vllm-async"]))
def test_fcfs_plugin_makes_vllms_decisions(vllm_steps: VllmSteps, scenario: dict[str, Any], base: str) -> None:
    _same(vllm_steps, scenario, base, "fcfs")


@drawn()
@given(scenario=scenarios(policy="priority"), base=st.sampled_from(["vllm", "vllm-async"]))
def test_priority_plugin_makes_vllms_decisions(vllm_steps: VllmSteps, scenario: dict[str, Any], base: str) -> None:
    _same(vllm_steps, scenario, base, "priority")


@drawn()
@given(scenario=scenarios(), base=st.sampled_from(["vllm", "vllm-async"]))
def test_sjf_oracle_plugin_differs_from_vllm_only_in_order(
    vllm_steps: VllmSteps, scenario: dict[str, Any], base: str
) -> None:
    """``sjf-oracle`` in the plugin makes the decisions vLLM's own priority scheduling makes when each
    request's priority is its true output length (``max_tokens`` here): the same admissions,
    budgets, KV allocation and preemptions (the victim: the longest running request), only the
    order is SJF's."""
    by_length = {
        **scenario,
        "policy": "priority",
        "requests": [{**r, "priority": r["max_tokens"]} for r in scenario["requests"]],
    }
    ref = vllm_steps.run(by_length, base)
    got = vllm_steps.run(scenario, f"headway{base.removeprefix('vllm')}", policy="sjf-oracle", oracle="max_tokens")
    diff = first_difference(ref["steps"], got["steps"])
    assert diff is None, f"{diff}\nscenario: {json.dumps(scenario)}"
    assert got["tokens"] == ref["tokens"]


def _burst(*lengths: int, seqs: int = 1, blocks: int = 64) -> dict[str, Any]:
    """Requests of 20-token prompts and the given output lengths, arriving one step apart."""
    return {
        "block_size": 16, "num_blocks": blocks, "max_num_seqs": seqs, "max_num_batched_tokens": 256,
        "max_model_len": 512, "chunked_prefill": True, "prefix_caching": False, "policy": "fcfs",
        "requests": [
            {"id": f"r{i}", "seq": i, "arrive": i, "prompt": [100 + i] * 20, "max_tokens": n, "priority": 0,
             "abort": None}
            for i, n in enumerate(lengths)
        ],
    }  # fmt: skip


def test_the_harness_tells_policies_apart(vllm_steps: VllmSteps) -> None:
    """The comparison can fail: on one slot, SJF runs the short request before the second long one."""
    scenario = _burst(30, 30, 3)
    ref = vllm_steps.run(scenario, "vllm")
    got = vllm_steps.run(scenario, "headway", policy="sjf-oracle", oracle="max_tokens")
    assert first_difference(ref["steps"], got["steps"]) is not None
    order = [rid for s in got["steps"] for rid in s["finished"]]
    assert order == ["r0", "r2", "r1"] and [rid for s in ref["steps"] for rid in s["finished"]] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("base", ["vllm", "vllm-async"])
def test_a_full_batch_displaces_nobody_by_default(vllm_steps: VllmSteps, base: str) -> None:
    """srpt-oracle (declared mode ``pause``, vllm-ltr's, which vLLM's model runner cannot hold: the
    plugin runs it as ``none``) makes vLLM's decision when a shorter request finds every slot
    taken: it waits; nobody is preempted."""
    scenario = _burst(40, 3)
    ref = vllm_steps.run(scenario, base)
    got = vllm_steps.run(scenario, f"headway{base.removeprefix('vllm')}", policy="srpt-oracle", oracle="max_tokens")
    assert got["displaced"] == 0
    assert first_difference(ref["steps"], got["steps"]) is None


def test_one_class_picks_vllms_scheduler_as_async_scheduling_says(vllm_steps: VllmSteps) -> None:
    """``HeadwayScheduler`` is built on vLLM's ``AsyncScheduler`` when async scheduling is on (the
    differential tests above drive it so), on ``Scheduler`` when off; ``HeadwayAsyncScheduler``
    named with async scheduling off is refused, naming the class to use."""
    scenario = _burst(3)
    sync = vllm_steps.run(scenario, "headway", policy="fcfs")
    assert sync["mro"] == ["HeadwayScheduler", "Scheduler", "SchedulerInterface"]
    assert vllm_steps.run(scenario, "headway-async", policy="fcfs")["mro"] == [
        "HeadwayAsyncScheduler", "AsyncScheduler", "Scheduler",
    ]  # fmt: skip
    with pytest.raises(AssertionError, match="HeadwayAsyncScheduler needs vLLM's async scheduling"):
        vllm_steps.run(scenario, "headway-async-class", policy="fcfs")


def _kv_tight() -> dict[str, Any]:
    """A long request holds 10 of 15 usable blocks when a short one needing 7 arrives; a slot is free."""
    scenario = _burst(60, 3, seqs=2, blocks=16)
    scenario["requests"][0]["prompt"] = [100] * 150
    scenario["requests"][1].update(arrive=3, prompt=[101] * 100)
    return scenario


@pytest.mark.parametrize("base", ["vllm", "vllm-async"])
def test_evict_mode_displaces_for_kv_blocks_only(vllm_steps: VllmSteps, base: str) -> None:
    """``displacement: evict`` (SGLang's retract): a better-keyed waiting request that has a slot but
    not enough free KV blocks evicts the worst-keyed running one; in the default mode it waits, as
    in vLLM."""
    hw = f"headway{base.removeprefix('vllm')}"
    scenario = _kv_tight()
    ref = vllm_steps.run(scenario, base)
    waits = vllm_steps.run(scenario, hw, policy="srpt-oracle", oracle="max_tokens")
    assert waits["displaced"] == 0 and first_difference(ref["steps"], waits["steps"]) is None
    evicts = vllm_steps.run(
        scenario, hw, policy="srpt-oracle", oracle="max_tokens", policy_args={"displacement": "evict"}
    )
    assert evicts["displaced"] == 1
    assert [rid for s in evicts["steps"] for rid in s["finished"]] == ["r1", "r0"]
    assert [rid for s in ref["steps"] for rid in s["finished"]] == ["r0", "r1"]
    assert evicts["tokens"] == ref["tokens"] == {"r0": 60, "r1": 3}
    # a full batch (one slot) displaces nobody, evict mode or not
    full = {**scenario, "max_num_seqs": 1}
    evict = {"displacement": "evict"}
    one_slot = vllm_steps.run(full, hw, policy="srpt-oracle", oracle="max_tokens", policy_args=evict)
    assert one_slot["displaced"] == 0
    assert first_difference(vllm_steps.run(full, base)["steps"], one_slot["steps"]) is None
