"""The other policies: the simulator against headway's plugin inside vLLM 0.32's scheduler, on the
differential harness's scenarios (as ``test_displacement_vs_vllm.py`` compares the preemptive ones'
displacement): the non-preemptive queue orders, the tenant policies and ``bands`` (which the plugin
runs without preemption), each as declared. Both run the same policy on the same scores
(``headway_score`` on the requests) and, for the tenant policies, tenants of three tiers
(``headway_tenant``, ``headway_tier``); compared per request: first scheduled step, finishing step,
preemptions (KV shortages only)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations._stepdiff import VllmSteps, drawn, scenarios
from integrations.test_displacement_vs_vllm import _pair, _scored

pytestmark = [pytest.mark.vllm]

TIERS = ("premium", "standard", "batch")

POLICIES = [
    "sjf-oracle", "pars", "sjf-score", "rank-boost", "distboost", "sarathi", "bands", "tenant-fifo",
    "tenant-priority", "tenant-sjf", "tenant-weighted", "tenant-aging",
]  # fmt: skip


@drawn(300)
@given(
    scenario=scenarios(aborts=False), seed=st.integers(0, 2**16), policy=st.sampled_from(POLICIES),
    base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_other_policies_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, base: str
) -> None:
    """Each policy as declared, with vLLM's Scheduler or AsyncScheduler: every request scheduled first,
    finished and preempted at the same steps in both."""
    if policy == "sarathi":  # (it needs chunked prefill: the plugin refuses it without)
        scenario = {**scenario, "chunked_prefill": True}
    scenario = _scored(scenario, seed)
    if policy.startswith("tenant-"):  # three tenants of a tier each, in the requests' extra args
        scenario["requests"] = [{**r, "tenant": f"t{(seed + i) % 3}", "tier": TIERS[(seed + i) % 3]}
                                for i, r in enumerate(scenario["requests"])]  # fmt: skip
    sim, ref, _ = _pair(vllm_steps, scenario, policy, None, base)
    assert sim == ref, json.dumps({"policy": policy, "base": base, "seed": seed, "scenario": scenario})


def test_an_arrival_at_a_steps_end_gets_its_start_tag_after_that_steps_output(vllm_steps: VllmSteps) -> None:
    """tenant-weighted (start-time fair queueing): r4 and r5 start service in step 1, whose output moves
    the virtual time to r5's start tag, 0.5; r0 (premium) arrives as step 1 ends. vLLM adds it after that
    output: its start tag is 0.5, and when r5 waits again (a KV shortage at step 13) r5 goes first. The
    simulator took r0 before that step's output (a rounding tie goes to the arrival): tag 0.2, r0 first
    (found by a random-seed run of the test above)."""
    tiers = {"t0": "premium", "t1": "standard", "t2": "batch"}
    shapes = [("r1", 0, 2, 1, "t1"), ("r2", 0, 3, 1, "t2"), ("r3", 0, 15, 18, "t0"), ("r4", 0, 4, 1, "t1"),
              ("r5", 0, 5, 13, "t2"), ("r0", 2, 1, 1, "t0")]  # fmt: skip
    reqs = [
        {"id": rid, "seq": k, "arrive": at, "prompt": list(range(1000 * (k + 1), 1000 * (k + 1) + n)),
         "max_tokens": out, "priority": 0, "abort": None, "tenant": t, "tier": tiers[t]}
        for k, (rid, at, n, out, t) in enumerate(shapes)
    ]  # fmt: skip
    scenario = {
        "block_size": 16, "num_blocks": 4, "max_num_seqs": 3, "max_num_batched_tokens": 32, "max_model_len": 512,
        "chunked_prefill": True, "prefix_caching": False, "policy": "fcfs", "requests": reqs,
    }  # fmt: skip
    sim, ref, _ = _pair(vllm_steps, scenario, "tenant-weighted", None, "vllm")
    assert sim == ref
    assert ref["r0"] == (18, 18, 0) and ref["r5"] == (1, 18, 1)  # r0 after r5
