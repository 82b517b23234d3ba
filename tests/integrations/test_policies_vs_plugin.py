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
from hypothesis import given, settings
from hypothesis import strategies as st

from integrations._stepdiff import VllmSteps, scenarios
from integrations.test_displacement_vs_vllm import _pair, _scored

pytestmark = [pytest.mark.vllm]

TIERS = ("premium", "standard", "batch")

POLICIES = [
    "sjf-oracle", "pars", "sjf-score", "rank-boost", "distboost", "sarathi", "bands", "tenant-fifo",
    "tenant-priority", "tenant-sjf", "tenant-weighted", "tenant-aging",
]  # fmt: skip


@settings(deadline=None, derandomize=True, max_examples=300)
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
