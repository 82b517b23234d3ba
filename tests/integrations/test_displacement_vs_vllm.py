"""The preemptive policies' displacement: headway's plugin inside vLLM 0.32's scheduler against the
simulator in exact mode, on the differential harness's scenarios.

Both run the same policy; the plugin's trace is put on the clock of ``sync_outcome`` /
``async_outcome`` and the simulator given the arrival times on it (the harness's ``"clock":
"steps"`` gives the plugin's policy the same times: UniBoost's keys read arrival times). Compared
per request: first scheduled step, finishing step, preemptions. Oracle lengths are ``max_tokens``
(no stop tokens); TRAIL's scores ride on the requests (``headway_score``).

Modes: ``none`` (vLLM's rule: only a running request short of KV blocks evicts, the policy's
victim) and ``evict`` (SGLang's retract) make the same decisions in both. ``pause`` (vllm-ltr's)
is the one named difference: the plugin runs it as ``none`` (vLLM's model runner holds at most
``max_num_seqs`` requests), the simulator pauses (``test_pause_is_the_simulators_alone``).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from integrations._stepdiff import PREFIXES, VllmSteps, async_outcome, scenarios, sim_outcome, sync_outcome

pytestmark = [pytest.mark.vllm]


def _scored(scenario: dict[str, Any], seed: int) -> dict[str, Any]:
    """Each request with a TRAIL-style score (log predicted tokens, off by a lognormal error)."""
    rng = random.Random(seed)
    reqs = [{**r, "score": round(math.log(r["max_tokens"]) + rng.gauss(0, 0.7), 3)} for r in scenario["requests"]]
    return {**scenario, "requests": reqs}


def _pair(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, mode: str | None, base: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(simulator's outcome, plugin's outcome, the plugin's reply) of ``policy`` in ``mode`` (None: as
    declared), the plugin in vLLM's Scheduler (``vllm``) or AsyncScheduler (``vllm-async``)."""
    args = {} if mode is None else {"displacement": mode}
    reply = vllm_steps.run(
        {**scenario, "clock": "steps"}, f"headway{base.removeprefix('vllm')}", policy=policy, oracle="max_tokens",
        policy_args=args,
    )  # fmt: skip
    ref, arrivals = (sync_outcome if base == "vllm" else async_outcome)(scenario, reply["steps"])
    sim = sim_outcome(
        {**scenario, "policy": policy}, arrivals, async_scheduling=base != "vllm", policy_kwargs=args or None
    )
    return sim, ref, reply


@settings(deadline=None, derandomize=True, max_examples=120)
@given(
    scenario=scenarios(aborts=False), seed=st.integers(0, 2**16),
    policy=st.sampled_from(["srpt-oracle", "trail-oracle", "trail", "uniboost-base", "uniboost-memguard", "ltr"]),
    base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_without_displacement_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, base: str
) -> None:
    """``displacement: none`` (a ``--policy-arg`` override): only a running request short of KV blocks
    evicts, and the victim is the policy's in both (the plugin hands it to vLLM's priority
    preemption as a rank). ``trail`` and ``ltr`` run synchronously only: with async scheduling
    vLLM's ``schedule()`` runs before the step in flight's output is processed, at that step's
    start, where the simulator plans with that output's progress reports (TRAIL's refinements) and
    at its end (LTR's promotions by time): 2 of 200 and 11 of 100 drawn scenarios differ there."""
    if policy in ("trail", "ltr") and base == "vllm-async":
        base = "vllm"
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, seed), policy, "none", base)
    assert sim == ref, json.dumps(scenario)


@settings(deadline=None, derandomize=True, max_examples=120)
@given(
    scenario=scenarios(aborts=False), seed=st.integers(0, 2**16),
    policy=st.sampled_from(["srpt-oracle", "trail-oracle", "uniboost-base"]),
    base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_evict_mode_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, base: str
) -> None:
    """``displacement: evict`` (SGLang's retract; UniBoost's declared mode): a better-keyed waiting
    request with a slot and budget but short of KV blocks evicts the worst-keyed running one.
    ``srpt-oracle`` and ``trail-oracle`` run synchronously only: their keys move with a running
    request's progress, which vLLM's ``AsyncScheduler`` reads without the token of the step in
    flight and the simulator's async plan with it
    (``test_async_evict_reads_progress_a_token_apart``)."""
    if policy != "uniboost-base" and base == "vllm-async":
        base = "vllm"
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, seed), policy, "evict", base)
    assert sim == ref, json.dumps(scenario)


def test_async_evict_reads_progress_a_token_apart(vllm_steps: VllmSteps) -> None:
    """The named difference of ``evict`` under async scheduling (found by the test above in a full
    run): one usable KV block (vLLM keeps block 0 as its null block); r0 (2 tokens) runs, r2 (1 token)
    arrives short of blocks. vLLM plans the next step as r0's first token is in flight: r0 has 2
    tokens left, worse than r2's 1, and is evicted. The simulator plans that step when it ends, with
    r0's token: 1 left, a tie that r0's earlier arrival wins: nobody is evicted."""
    scenario = {
        "block_size": 16, "num_blocks": 2, "max_num_seqs": 2, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": False, "prefix_caching": False, "policy": "fcfs",
        "requests": [_req(1, [27671], 1, 0), _req(0, [27671], 2, 7), _req(2, [27671], 1, 8)],
    }  # fmt: skip
    scenario["requests"] = [{**r, "seq": i} for i, r in enumerate(scenario["requests"])]
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, 0), "srpt-oracle", "evict", "vllm-async")
    assert ref == {"r1": (0, 0, 0), "r0": (1, 3, 1), "r2": (2, 2, 0)}
    assert sim == {"r1": (0, 0, 0), "r0": (1, 2, 0), "r2": (3, 3, 0)}
    sync_sim, sync_ref, _ = _pair(vllm_steps, _scored(scenario, 0), "srpt-oracle", "evict", "vllm")
    assert sync_sim == sync_ref  # synchronously both read r0's progress after its token


def _req(i: int, prompt: list[int], out: int, arrive: int) -> dict[str, Any]:
    return {
        "id": f"r{i}",
        "seq": i,
        "arrive": arrive,
        "prompt": prompt,
        "max_tokens": out,
        "priority": 0,
        "abort": None,
    }


def _engine(*reqs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    base = {
        "block_size": 16, "num_blocks": 12, "max_num_seqs": 4, "max_num_batched_tokens": 256, "max_model_len": 512,
        "chunked_prefill": True, "prefix_caching": True, "policy": "fcfs", "requests": list(reqs),
    }  # fmt: skip
    return {**base, **kw}


def test_evict_counts_the_prefix_cache_hit(vllm_steps: VllmSteps) -> None:
    """r2 (5 tokens) arrives at step 10 with r0's system prompt still cached (3 of its 4 blocks) while
    r1 (60 tokens) runs: 4 blocks are free, and vLLM admits r2 with them. The plugin evicted r1 for
    it (it counted r2's prompt whole, and a block for every running request); the simulator did not."""
    p = PREFIXES[0]
    scenario = _engine(
        _req(0, p + list(range(1, 21)), 3, 0), _req(1, list(range(100, 200)), 60, 0),
        _req(2, p + list(range(300, 310)), 5, 10),
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm")
    assert reply["displaced"] == 0
    assert sim == ref == {"r0": (0, 2, 0), "r1": (3, 62, 0), "r2": (10, 14, 0)}


def test_evict_admits_with_the_hit_of_the_running_loops_blocks(vllm_steps: VllmSteps) -> None:
    """r1 (1 token) and r0 (16 tokens) share a 49-token prompt; r1's prefill takes two steps. At
    step 1 r0 fits (a slot, and 3 free blocks with its 2-block hit) in the displacement check,
    and vLLM's waiting loop admits it after its running loop allocated, and so cached, the block
    r1's last chunk fills: r0 hits 48 tokens and finishes at 16. The simulator admitted it inside
    the check, with the 32-token hit of the blocks cached before, and finished it at 17."""
    prompt = [*range(1000, 1048), 27671]
    scenario = _engine(
        _req(0, prompt, 16, 0), _req(1, prompt, 1, 0), num_blocks=7, max_num_seqs=2, max_num_batched_tokens=32
    )
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm")
    assert reply["displaced"] == 0
    assert sim == ref == {"r0": (1, 16, 0), "r1": (0, 1, 0)}


def test_evict_checks_every_waiting_request_in_order(vllm_steps: VllmSteps) -> None:
    """r1 (4 tokens) and r2 (8 tokens, 80-token prompt) arrive at step 5 while r0 (60 tokens) runs: r1
    fits, r2 does not and evicts r0 in the same step, in both (the plugin looked at the queue's head
    alone, and r2 evicted r0 a step later)."""
    scenario = _engine(
        _req(0, list(range(100, 200)), 60, 0), _req(1, list(range(300, 310)), 4, 5),
        _req(2, list(range(400, 480)), 8, 5), num_blocks=13, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm")
    assert reply["displaced"] == 1 and [s["step"] for s in reply["steps"] if s["preempted"]] == [5]
    assert sim == ref == {"r0": (0, 67, 1), "r1": (5, 8, 0), "r2": (5, 12, 0)}


def test_async_admission_skips_a_request_evicted_with_its_token_in_flight(vllm_steps: VllmSteps) -> None:
    """Async scheduling: r1 (5 tokens) evicts r0 (31 tokens, its first token in flight) at step 1, and
    r0, better keyed than r2 (55 tokens), is next in the queue; vLLM's admission skips a preempted
    request with output in flight (``num_stale_output_tokens``) without stopping there, so r2 is
    admitted in that step too. So is it in the simulator (which stopped at r0 and started r2 at 6)."""
    scenario = _engine(
        _req(0, list(range(100, 240)), 31, 0), _req(1, list(range(300, 455)), 5, 1),
        _req(2, list(range(500, 514)), 55, 1), num_blocks=15, chunked_prefill=False, max_num_batched_tokens=512,
        max_num_seqs=5, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm-async")
    assert next((s["step"], s["preempted"]) for s in reply["steps"] if s["preempted"]) == (1, ["r0"])
    assert sim == ref == {"r0": (0, 35, 1), "r1": (1, 5, 0), "r2": (1, 59, 1)}


def test_ltr_hears_the_progress_of_a_request_finishing_in_a_step(vllm_steps: VllmSteps) -> None:
    """LTR's step time is learnt from every step's progress reports, the final step of a request
    that finishes in it (r0's last decode token, r1's one-token prefill) included, as the
    simulator reports it. The plugin reported progress after vLLM had freed the step's finished
    requests, so it missed r0's last sample: r2 and r3 arrived (at 25) with a smaller step time,
    and r2 starved sooner and started at 74 instead of 81."""
    scenario = _engine(
        _req(0, list(range(100, 187)), 7, 10), _req(1, list(range(200, 365)), 1, 16),
        _req(2, list(range(400, 505)), 38, 25), _req(3, list(range(600, 767)), 29, 25),
        _req(4, list(range(800, 838)), 55, 29), num_blocks=16, max_num_seqs=3, prefix_caching=False,
    )  # fmt: skip
    for r, score in zip(scenario["requests"], (2.964, 0.471, 4.258, 3.956, 3.751), strict=True):
        r["score"] = score
    sim, ref, _ = _pair(vllm_steps, scenario, "ltr", "none", "vllm")
    assert (
        sim == ref == {"r0": (10, 16, 0), "r1": (17, 17, 0), "r2": (81, 118, 0), "r3": (25, 132, 1), "r4": (29, 83, 0)}
    )


@pytest.mark.parametrize("base", ["vllm", "vllm-async"])
def test_pause_is_the_simulators_alone(vllm_steps: VllmSteps, base: str) -> None:
    """The named difference: on one slot, r1 (3 tokens) arrives while r0 (40 tokens) runs. In
    ``pause`` mode (srpt-oracle's declared one) the simulator pauses r0 for it; the plugin runs
    ``pause`` as ``none`` and r1 waits, as it does in the simulator with ``displacement: none``."""
    scenario = _engine(_req(0, [100] * 20, 40, 0), _req(1, [101] * 20, 3, 1), max_num_seqs=1, prefix_caching=False)
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", None, base)
    assert reply["displaced"] == 0
    assert ref["r1"][0] > ref["r0"][1]  # the plugin: r1 starts after r0 finished
    assert sim["r0"][2] == 1 and sim["r1"][1] < sim["r0"][1]  # the simulator: r0 paused, r1 first
    none, ref_none, _ = _pair(vllm_steps, scenario, "srpt-oracle", "none", base)
    assert none == ref_none == ref
