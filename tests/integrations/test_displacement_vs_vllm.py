"""The preemptive policies' displacement: headway's plugin inside vLLM 0.32's scheduler against the
simulator in exact mode, on the differential harness's scenarios.

Both run the same policy; the plugin's trace is put on the clock of ``sync_outcome`` /
``async_outcome`` and the simulator given the arrival times on it (the harness's ``"clock":
"steps"`` gives the plugin's policy the same times: UniBoost's keys read arrival times). Compared
per request: first scheduled step, finishing step, preemptions. Oracle lengths are ``max_tokens``
(no stop tokens); TRAIL's scores ride on the requests (``headway_score``).

Modes: ``none`` (vLLM's rule: only a running request short of KV blocks evicts, the policy's
victim) and ``evict`` (SGLang's retract) make the same decisions in both, with vLLM's
``Scheduler`` and its ``AsyncScheduler`` (whose plan of a step reads the policy before the output
of the step in flight: the simulator's async plan reads it so too). ``pause`` (vllm-ltr's) is the
one named difference: the plugin runs it as ``none`` (vLLM's model runner holds at most
``max_num_seqs`` requests), the simulator pauses (``test_pause_is_the_simulators_alone``).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations._stepdiff import PREFIXES, VllmSteps, async_outcome, drawn, scenarios, sim_outcome, sync_outcome

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


@drawn(120)
@given(
    scenario=scenarios(aborts=False), seed=st.integers(0, 2**16),
    policy=st.sampled_from(
        ["srpt-oracle", "trail-oracle", "trail", "uniboost-base", "uniboost-memguard", "uniboost", "ltr"]
    ),
    base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_without_displacement_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, base: str
) -> None:
    """``displacement: none`` (a ``--policy-arg`` override): only a running request short of KV blocks
    evicts, and the victim is the policy's in both (the plugin hands it to vLLM's priority
    preemption as a rank)."""
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, seed), policy, "none", base)
    assert sim == ref, json.dumps(scenario)


@drawn(120)
@given(
    scenario=scenarios(aborts=False), seed=st.integers(0, 2**16),
    policy=st.sampled_from(["srpt-oracle", "trail-oracle", "uniboost-base", "uniboost"]),
    base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_evict_mode_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, base: str
) -> None:
    """``displacement: evict`` (SGLang's retract; UniBoost's declared mode): a better-keyed waiting
    request with a slot and budget but short of KV blocks evicts the worst-keyed running one."""
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, seed), policy, "evict", base)
    assert sim == ref, json.dumps(scenario)


@drawn(80)
@given(
    scenario=scenarios(aborts=False, stops=True), seed=st.integers(0, 2**16),
    policy=st.sampled_from(["trail", "uniboost-base", "uniboost-memguard", "uniboost", "ltr"]),
    mode=st.sampled_from(["none", "evict"]), base=st.sampled_from(["vllm", "vllm-async"]),
)  # fmt: skip
def test_with_stop_tokens_sim_makes_the_plugins_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], seed: int, policy: str, mode: str, base: str
) -> None:
    """Requests that stop on a stop token before ``max_tokens``: with async scheduling vLLM runs a
    token past the stop (dropped) and still runs, for the next plan, a request whose stop is in
    the step in flight, recompute or not. Policies that read no true length only: the plugin's
    oracle reads ``max_tokens`` (the harness cannot tell it the stop), the simulator's the true
    length, so srpt-oracle and trail-oracle would differ by design."""
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, seed), policy, mode, base)
    assert sim == ref, json.dumps(scenario)


def test_async_evict_reads_progress_without_the_token_in_flight(vllm_steps: VllmSteps) -> None:
    """One usable KV block (vLLM keeps block 0 as its null block); r0 (2 tokens) runs, r2 (1 token)
    arrives short of blocks. vLLM plans the next step as r0's first token is in flight: r0 has 2
    tokens left, worse than r2's 1, and is evicted. So does the simulator's async plan, which reads
    r0 without that token (it read it with it: 1 left, a tie that r0's earlier arrival won, and
    nobody was evicted)."""
    scenario = {
        "block_size": 16, "num_blocks": 2, "max_num_seqs": 2, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": False, "prefix_caching": False, "policy": "fcfs",
        "requests": [_req(1, [27671], 1, 0), _req(0, [27671], 2, 7), _req(2, [27671], 1, 8)],
    }  # fmt: skip
    scenario["requests"] = [{**r, "seq": i} for i, r in enumerate(scenario["requests"])]
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, 0), "srpt-oracle", "evict", "vllm-async")
    assert sim == ref == {"r1": (0, 0, 0), "r0": (1, 3, 1), "r2": (2, 2, 0)}
    sync_sim, sync_ref, _ = _pair(vllm_steps, _scored(scenario, 0), "srpt-oracle", "evict", "vllm")
    assert sync_sim == sync_ref  # synchronously both read r0's progress after its token


def _with_scores(scenario: dict[str, Any], *scores: float) -> dict[str, Any]:
    reqs = [{**r, "seq": i, "score": x} for i, (r, x) in enumerate(zip(scenario["requests"], scores, strict=True))]
    return {**scenario, "requests": reqs}


def test_async_plan_hears_no_refinement_of_the_step_in_flight(vllm_steps: VllmSteps) -> None:
    """TRAIL on four usable KV blocks: r3 (19 tokens, predicted 19) and r4 (37 tokens, predicted 18.2)
    decode together until both need a block, at the plan of step 20, made as step 19 starts. r4's
    19th token, which runs out its prediction, is in flight: vLLM's plan reads r4 with 0.2 tokens
    left and r3 with 2, and evicts r3. The simulator planned it with that token's progress heard,
    TRAIL's refinement of r4 (E[L | L > 19]) made, and evicted r4."""
    scenario = _engine(
        _req(0, [27671], 1, 0), _req(1, [27671], 1, 0), _req(2, [27671], 1, 0), _req(3, [27671], 19, 0),
        _req(4, list(range(100, 114)), 37, 1), num_blocks=5, max_num_seqs=2, max_num_batched_tokens=16,
        prefix_caching=False,
    )  # fmt: skip
    sim, ref, _ = _pair(
        vllm_steps, _with_scores(scenario, 0.659, -0.978, -0.476, 3.204, 2.899), "trail", "none", "vllm-async"
    )
    assert sim == ref == {"r0": (0, 0, 0), "r1": (0, 0, 0), "r2": (1, 1, 0), "r3": (3, 40, 1), "r4": (1, 37, 0)}


def test_async_plan_reads_ltr_at_its_own_time(vllm_steps: VllmSteps) -> None:
    """LTR (initial step time 20 ms: 200 steps are 4 s): r0 (4 tokens) waits from 0 and starves at
    4.0; r4 (1 token, a better score) arrives at 2. vLLM plans step 4 as step 3 starts, at 3.000001:
    r0 is not promoted yet, and r4 goes first. The simulator read the queue at step 3's end, at 4.0,
    promoted r0 by its timer, and started r0 first."""
    scenario = _engine(
        _req(0, [27671], 4, 0), _req(1, [27671], 1, 0), _req(2, [27671], 1, 0), _req(3, PREFIXES[0] + [27671], 16, 0),
        _req(4, [27671], 1, 3), num_blocks=6, max_num_seqs=2, max_num_batched_tokens=16, prefix_caching=False,
    )  # fmt: skip
    sim, ref, _ = _pair(
        vllm_steps, _with_scores(scenario, 2.288, 1.015, 0.046, 2.237, -0.765), "ltr", "none", "vllm-async"
    )
    assert sim == ref == {"r0": (6, 9, 0), "r1": (0, 0, 0), "r2": (0, 0, 0), "r3": (1, 19, 0), "r4": (4, 4, 0)}


def test_async_arrival_at_a_steps_end_comes_after_that_steps_plan(vllm_steps: VllmSteps) -> None:
    """LTR, async, KV pressure: at the plan of step 21, made as step 20 starts, r3 needs a block and
    is its own victim (nothing is scheduled); its waiting period's promotion time is frozen from the
    step time LTR has measured by then, its decoders' outputs up to step 19's. That empty plan takes
    no time, and r7 arrives as step 20 ends. The simulator took r7 first (a rounding tie goes to the
    arrival), which reported step 20's decoders to LTR before that plan: two more step-time samples,
    r3 promoted at 183.9 instead of 180.0, and at step 181 r1 went before r3 (found by a random-seed
    run of the test above)."""
    shapes = {3: (78, 20, 0), 6: (98, 38, 1), 2: (138, 55, 9), 5: (2, 1, 9), 0: (81, 28, 10), 1: (49, 36, 10),
              4: (1, 1, 20), 7: (97, 60, 22)}  # fmt: skip
    reqs = [_req(i, list(range(1000 * (i + 1), 1000 * (i + 1) + n)), out, at) for i, (n, out, at) in shapes.items()]
    scenario = _engine(*reqs, num_blocks=16, max_num_seqs=3, max_num_batched_tokens=32, prefix_caching=False)
    scenario["requests"] = [{**r, "seq": k} for k, r in enumerate(scenario["requests"])]
    sim, ref, _ = _pair(vllm_steps, _scored(scenario, 0), "ltr", "none", "vllm-async")
    assert sim == ref
    assert ref["r3"] == (0, 184, 1) and ref["r1"] == (126, 199, 1)  # r3 restarts at 181, before r1


def test_async_a_victim_displaced_after_an_empty_plan_has_no_token_in_flight(vllm_steps: VllmSteps) -> None:
    """SRPT, evict, async, 6 usable KV blocks, 2 slots: r0 (18 tokens) and r1 (15) decode until the plan
    of step 15, where r0 is short of a block and its own victim: an empty plan. vLLM's engine then
    waits for step 14's output and schedules again: r3 (1 token) displaces r1, whose token of step 14
    has come (no output in flight), so vLLM's admission does not skip r1 but stops at it (4 blocks, 3
    free) and r0 waits. The simulator's plan made again after that output skipped r1 as if its token
    were in flight, and admitted r0 (found by a random-seed run of the test above)."""
    shapes = {0: (18, 18, 0), 2: (1, 1, 0), 1: (50, 15, 1), 3: (33, 1, 3)}
    reqs = [_req(i, list(range(1000 * (i + 1), 1000 * (i + 1) + n)), out, at) for i, (n, out, at) in shapes.items()]
    scenario = _engine(
        *reqs, num_blocks=7, max_num_seqs=2, max_num_batched_tokens=512, chunked_prefill=False, prefix_caching=False
    )
    scenario["requests"] = [{**r, "seq": k} for k, r in enumerate(scenario["requests"])]
    sim, ref, _ = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm-async")
    assert sim == ref
    assert ref["r1"] == (2, 17, 1) and ref["r0"] == (0, 20, 1)  # r1 restarts before r0


def test_async_victim_waits_keyed_without_its_token_in_flight(vllm_steps: VllmSteps) -> None:
    """SRPT: r1 (49 tokens) is evicted for KV blocks at the plan of step 6, with its third token in
    flight: the plugin queues it keyed by 47 tokens left (the token comes later, and the queue keeps
    the key), and r2 (46 tokens), queued since 2, starts before it at 7. The simulator queued r1 with
    that token (46 left, a tie that r1's earlier arrival won) and restarted r1 first."""
    scenario = _engine(
        _req(0, list(range(100, 160)), 6, 0), _req(1, list(range(200, 249)), 49, 0), _req(2, [27671], 46, 2),
        num_blocks=9, max_num_seqs=2, max_num_batched_tokens=32, prefix_caching=False,
    )  # fmt: skip
    sim, ref, _ = _pair(vllm_steps, scenario, "srpt-oracle", "none", "vllm-async")
    assert sim == ref == {"r0": (0, 6, 0), "r1": (1, 70, 2), "r2": (7, 52, 0)}


def test_async_displaces_a_request_finishing_in_the_step_in_flight(vllm_steps: VllmSteps) -> None:
    """UniBoost, one usable KV block: r1 (1 token) runs its prefill in step 1, which finishes it, and
    r2 arrives. vLLM plans step 2 as step 1 starts: r1 still runs, its token in flight, and the
    plugin evicts it for r2 (it finishes as its token comes). The simulator's plan had r1 finished,
    and no running request to evict."""
    scenario = _engine(
        _req(0, [27671], 1, 0), _req(1, [27671, 12624], 1, 0), _req(2, [27671], 1, 3), num_blocks=2,
        max_num_seqs=2, max_num_batched_tokens=512, chunked_prefill=False, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "uniboost-base", "evict", "vllm-async")
    assert reply["displaced"] == 1
    assert sim == ref == {"r0": (0, 0, 0), "r1": (1, 1, 1), "r2": (2, 2, 0)}


@pytest.mark.parametrize("policy", ["srpt-oracle", "trail-oracle"])
def test_evict_looks_hits_up_before_the_running_loop_allocates(vllm_steps: VllmSteps, policy: str) -> None:
    """Six usable KV blocks: r5 (an 81-token prompt) finishes at 9 and leaves its blocks cached; r2
    (32-token prompt) resumes in chunks; r6 (r5's prompt) arrives at 11 and evicts r2 at step 12.
    The plugin's check runs before vLLM's running loop: r2's next chunk never takes a block, and r6
    hits 64 tokens. The simulator's check looked the hit up after that chunk's block came off the
    free queue, the oldest of r5's cached blocks, and r6 hit 48 (the residual of evict mode)."""
    p = PREFIXES[2] + [27671]
    scenario = _engine(
        _req(0, [27671], 1, 0), _req(1, [27671], 1, 0), _req(2, list(range(100, 132)), 3, 0), _req(3, [27671], 1, 0),
        _req(4, [27671], 1, 0), _req(5, p, 1, 3), _req(6, p, 1, 11), num_blocks=7, max_num_seqs=2,
        max_num_batched_tokens=16,
    )  # fmt: skip
    sim, ref, _ = _pair(vllm_steps, scenario, policy, "evict", "vllm")
    assert sim == ref
    assert ref["r6"] == (12, 13, 0)  # (16 tokens at 12, 1 at 13: a 64-token hit)


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


@pytest.mark.parametrize("num_blocks", [7, 8])
def test_evict_counts_a_free_cached_block_two_requests_hit_once(vllm_steps: VllmSteps, num_blocks: int) -> None:
    """r0 (a 33-token prompt) finishes at step 0 and leaves its two full blocks cached and free; r2
    and r3 (its first 32 tokens and one of their own) arrive at step 5 while r1 (60 tokens) runs.
    r2 takes the two cached blocks out of the free queue and one new block; r3 hits the same two,
    which r2 holds by then, and needs one new block: vLLM admits both with four free blocks, as it
    does without displacement. The check counted the two blocks as leaving the free queue for r3
    again, so r3 fell two blocks short and evicted r1, in the plugin and the simulator alike."""
    shared = PREFIXES[1]
    scenario = _engine(
        _req(0, [*shared, 27671], 1, 0), _req(1, list(range(100, 116)), 60, 0), _req(2, [*shared, 300], 2, 5),
        _req(3, [*shared, 301], 2, 5), num_blocks=num_blocks,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm")
    assert reply["displaced"] == 0
    assert sim == ref == {"r0": (0, 0, 0), "r1": (0, 59, 0), "r2": (5, 6, 0), "r3": (5, 6, 0)}
    none, ref_none, _ = _pair(vllm_steps, scenario, "srpt-oracle", "none", "vllm")
    assert none == ref_none == ref


def test_evict_looks_up_a_resumed_requests_own_hit_after_the_running_loop(vllm_steps: VllmSteps) -> None:
    """r5's 5-token prompt fills no block, so no block of it is hashed by the workload: the blocks it
    computes are its own. Evicted at step 58 with two full blocks, it waits with them in the free
    queue. At step 59 the displacement check counts r5 as admitted with those two blocks hit; then
    vLLM's running loop gives r0 and r1 a new block each, the free queue's oldest: r5's. vLLM's waiting
    loop finds no hit and schedules 30 of r5's tokens; the simulator kept the hit it had counted (it
    held that nothing cached since changes the own blocks of such a request) and scheduled one (found
    by a random round of requests without hashed blocks)."""
    scenario = _engine(
        _req(3, list(range(5300, 5311)), 54, 5), _req(0, list(range(5000, 5005)), 45, 15),
        _req(1, list(range(5100, 5112)), 38, 22), _req(5, list(range(5500, 5505)), 30, 30),
        num_blocks=13, max_num_seqs=5, max_num_batched_tokens=32,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "trail-oracle", "evict", "vllm")
    assert [(s["step"], s["preempted"]) for s in reply["steps"] if s["preempted"]] == [(58, ["r5"])]
    assert next(s["sched"]["r5"] for s in reply["steps"] if s["step"] == 59) == [30, 0]
    assert sim == ref


def test_a_recompute_whose_token_reaches_a_key_point_is_ranked_with_it(vllm_steps: VllmSteps) -> None:
    """uniboost-base (key worse at each 64 output tokens): r4, evicted at 127 tokens, recomputes, and its
    prefill's token is its 128th. At step 181's KV shortage vLLM evicts r4, the plugin ranking it
    with its key at 128; the simulator's heap of running keys kept r4's key from before that token
    and evicted r0 (``tests/sim/test_running_keys.py`` has the same run against a scan of every key)."""
    rows = [(16, 0, 112, 69), (13, 29, 77, 92), (15, 33, 133, 61), (8, 34, 122, 8), (4, 40, 50, 132), (0, 42, 52, 4)]
    scenario = _engine(
        *(_req(i, list(range(1000 * (i + 1), 1000 * (i + 1) + p)), o, t) for i, t, p, o in rows),
        num_blocks=25, max_num_batched_tokens=64, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "uniboost-base", "evict", "vllm")
    assert next(s["preempted"] for s in reply["steps"] if s["step"] == 181) == ["r4"]
    assert sim == ref


def test_async_admission_stops_at_a_victim_that_sat_the_step_in_flight_out(vllm_steps: VllmSteps) -> None:
    """Async scheduling, 8-token blocks: at step 4 a KV shortage evicts r9 and ends the running loop,
    so r6 and r1 sit that step out. Planning step 5 (step 4 in flight), r8 displaces r1: r1 has no
    token in flight, so vLLM's admission stops at it (too large for the blocks left) and r9 behind it
    waits. The simulator took every displaced request as having output in flight, set r1 aside and
    admitted r9 (found by a wide ``HEADWAY_HUNT`` round)."""
    scenario = _engine(
        _req(3, list(range(100, 113)), 5, 0), _req(9, list(range(200, 221)), 7, 0),
        _req(1, list(range(300, 354)), 5, 1), _req(6, list(range(400, 479)), 4, 1),
        _req(8, list(range(500, 517)), 1, 2),
        block_size=8, num_blocks=25, max_num_batched_tokens=512, chunked_prefill=False, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm-async")
    assert next(s["sched"] for s in reply["steps"] if "r8" in s["sched"]) == {"r6": [1, 81], "r8": [17, 0]}
    assert sim == ref


def test_async_admission_stops_at_a_displaced_prefill_that_sat_the_step_in_flight_out(vllm_steps: VllmSteps) -> None:
    """Async scheduling, chunked prefill, no prefix caching: at step 15 a KV shortage evicts r7 and
    ends the running loop, so r5 (129-token prompt, 104 tokens computed) sits that step out.
    Planning step 16 (step 15 in flight), r6 (1 token) displaces r5: r5 has nothing in flight
    (``num_in_flight_tokens`` is 0), so vLLM's admission stops at it (its whole prompt needs 9
    blocks, 8 are free) and r7 behind it waits. The simulator took the displaced partial prefill
    as having its chunk in flight, set it aside and admitted r7 (found by a round of
    displaced prefills after a sit-out: the decoder's case is the test above)."""
    scenario = _engine(
        _req(4, list(range(4100, 4104)), 14, 2), _req(5, list(range(5100, 5229)), 2, 6),
        _req(6, [6100], 1, 7), _req(7, list(range(7100, 7106)), 13, 4),
        num_blocks=12, max_num_seqs=3, max_num_batched_tokens=15, prefix_caching=False,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "trail-oracle", "evict", "vllm-async")
    steps = {s["step"]: s for s in reply["steps"]}
    assert (steps[15]["preempted"], list(steps[15]["sched"])) == (["r7"], ["r4"])
    assert (steps[16]["preempted"], list(steps[16]["sched"])) == (["r5"], ["r6"])
    assert sim == ref


def test_async_plan_keys_a_request_ending_its_prefill_at_the_plans_time(vllm_steps: VllmSteps) -> None:
    """LTR, async scheduling, evict: r5 resumes at step 21 with its last prefill chunk, planned
    before r4 (waiting since its eviction at step 8) is promoted; the plan of step 22, made as step
    21 starts, reads r4 promoted and r5, whose chunk is in flight, not (its own promotion comes
    later), and r4 displaces r5. The simulator keyed r5 into its heap of running keys as r5 started
    decoding, at the end of step 21, by which time r5's own promotion had come: a key better than
    the one the earlier-made plan reads, so no bound of it, and the check found no victim (a scan
    of every key found r5). r2's stop token runs a step after its last token, which puts r5's
    chunk there (found by a round aimed at requests finishing in a step just ended)."""
    scenario = _with_scores(
        _engine(
            {**_req(2, list(range(2100, 2117)), 11, 9), "stop_at": 10}, _req(4, list(range(4100, 4114)), 4, 4),
            _req(5, list(range(5100, 5117)), 2, 8),
            block_size=8, num_blocks=6, max_num_seqs=2, max_num_batched_tokens=9,
        ),
        2.643, 3.37, 2.829,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "ltr", "evict", "vllm-async")
    steps = {s["step"]: s for s in reply["steps"]}
    assert steps[21]["sched"] == {"r5": [9, 8]}
    assert (steps[22]["preempted"], steps[22]["sched"]) == (["r5"], {"r4": [9, 0]})
    assert sim == ref


def test_async_check_finds_a_request_whose_recompute_ends_it_in_the_step_in_flight(vllm_steps: VllmSteps) -> None:
    """TRAIL, async scheduling, evict: at step 12 r8 (evicted at step 11 with 6 tokens) resumes,
    and the token of its 17-token recompute is its last (a stop token); r2 displaces r6. Planning
    step 13 as step 12 starts, vLLM still runs r8 (its stop comes with that step's output), and r6
    (2 tokens left) displaces it (3 left). TRAIL's keys count down, so the simulator files a key in
    its heap of running keys as a request starts decoding, not at the admission of its last
    prefill chunk; r8 finished instead, so the heap held no key of it and the check found no victim,
    where a scan of every key found r8 (found by comparing the heap with that scan, simulator only,
    on a round aimed at requests finishing in the step just ended)."""
    scenario = _with_scores(
        _engine(
            _req(2, [2100], 1, 12), _req(5, [5100], 6, 0), _req(6, list(range(6100, 6196)), 2, 11),
            {**_req(8, list(range(8100, 8111)), 9, 5), "stop_at": 7},
            num_blocks=8, max_num_seqs=3, max_num_batched_tokens=512, chunked_prefill=False,
        ),
        2, 4, 2, 3,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "trail", "evict", "vllm-async")
    steps = {s["step"]: s for s in reply["steps"]}
    assert (steps[12]["sched"], steps[12]["finished"]) == ({"r2": [1, 0], "r8": [17, 0]}, ["r2", "r8"])
    assert steps[13]["preempted"] == ["r8"]
    assert sim == ref


def test_async_check_follows_a_recompute_whose_token_crosses_a_memguard_threshold(vllm_steps: VllmSteps) -> None:
    """UniBoost, async scheduling, evict: r5, evicted by its own KV shortage at step 31, recomputes
    in steps 32-34, and the token its recompute ends with is its 32nd: MemGuard's next threshold,
    where its key worsens and it may be evicted. vLLM's plan of step 36 reads that token, and r6
    displaces r5. The simulator's async plan hears a prefill's report after the next plan, and
    skips a check where nothing moved since the last one (queue head, running keys' key points,
    key epoch); the report was no key point there, as it is synchronously, so the check of step 36
    was skipped and r5 displaced a step later (found by a round aimed at requests finishing in the
    step just ended)."""
    scenario = _engine(
        _req(1, [1100], 15, 1), _req(5, list(range(5100, 5118)), 34, 0), _req(6, list(range(6100, 6118)), 15, 0),
        num_blocks=5, max_num_seqs=2, max_num_batched_tokens=19, prefix_caching=False,
    )  # fmt: skip
    scenario["requests"] = [{**r, "seq": i} for i, r in enumerate(scenario["requests"])]
    sim, ref, reply = _pair(vllm_steps, scenario, "uniboost", "evict", "vllm-async")
    steps = {s["step"]: s for s in reply["steps"]}
    assert (steps[34]["sched"], steps[35]["sched"]) == ({"r5": [11, 38]}, {"r5": [1, 49]})
    assert (steps[36]["preempted"], steps[36]["sched"]) == (["r5"], {"r6": [19, 0]})
    assert sim == ref


def test_evict_counts_the_blocks_an_admission_takes_not_the_ones_it_asks(vllm_steps: VllmSteps) -> None:
    """srpt-oracle, evict: at step 7 r6 (81-token prompt) and r1 (1 token) arrive while r3 decodes;
    6 blocks are free after r3's. vLLM's admission asks r6 for blocks for its whole prompt
    (``scheduler_reserve_full_isl``: 6) but allocates those of its first chunk (16 tokens, the
    long-prefill threshold: 1), so r1 fits in the 5 left. The plugin's displacement check took the
    6 blocks asked as taken, found r1 short and evicted r3 (which vLLM admitted again in the same
    step, from its cached blocks); the simulator counted the chunk's block, as vLLM does, and
    evicted nobody (found by a round with shared prefixes, aborts, priorities and prefill caps)."""
    scenario = _engine(
        _req(1, [1100], 2, 7), _req(3, list(range(3100, 3145)), 7, 2), _req(6, list(range(6100, 6181)), 1, 7),
        num_blocks=11, max_num_seqs=3, max_num_batched_tokens=23, long_prefill_token_threshold=16,
    )  # fmt: skip
    scenario["requests"] = [{**r, "seq": i} for i, r in enumerate(scenario["requests"])]
    sim, ref, reply = _pair(vllm_steps, scenario, "srpt-oracle", "evict", "vllm")
    steps = {s["step"]: s for s in reply["steps"]}
    assert (steps[7]["preempted"], steps[7]["sched"]) == ([], {"r3": [1, 48], "r6": [16, 0], "r1": [1, 0]})
    assert sim == ref


def test_async_eviction_of_a_finishing_request_leaves_its_last_block_uncached(vllm_steps: VllmSteps) -> None:
    """LTR, async scheduling, evict, prefix caching: planning step 36, r3 displaces r2 and r0, whose
    stop token is in the step in flight. r0's last block (the tail of its 62-token prompt and its
    first two output tokens) was never cached: its last token was in flight when vLLM allocated the
    block, and the displacement came before r0's next allocation. vLLM puts a freed block without a
    hash at the head of its free queue, so r3's chunks take it (and r2's partial block) before r2's
    cached first block, and r2 resumes at step 39 with 16 tokens cached. The simulator freed r0 as
    a request that had finished, its last block cached, so r3 took r2's first block instead and
    r2 recomputed it (found by a round aimed at requests finishing in the step just ended)."""
    scenario = _with_scores(
        _engine(
            {**_req(0, list(range(100, 162)), 4, 29), "stop_at": 3}, _req(1, list(range(1100, 1112)), 1, 7),
            _req(2, [2100, 2101, 2102], 29, 7), _req(3, list(range(3100, 3149)), 1, 36),
            num_blocks=9, max_num_seqs=3, max_num_batched_tokens=14,
        ),
        1.859, 0.64, 3.342, 0.955,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "ltr", "evict", "vllm-async")
    steps = {s["step"]: s for s in reply["steps"]}
    assert sorted(steps[36]["preempted"]) == ["r0", "r2"]
    assert steps[39]["sched"]["r2"] == [7, 16]
    assert sim == ref


def test_two_requests_with_one_prompt_write_their_own_output_blocks(vllm_steps: VllmSteps) -> None:
    """r0 and r3 share a 22-token prompt; MemGuard, under async scheduling, evicts r3 at step 42 and
    it resumes with its first 48 tokens cached. When the harness's fabricated output was the same
    token for everyone, r3's output blocks held the same tokens as r0's, whose blocks (in use) vLLM's
    lookup could find for them: it resumed r3 a step before the simulator, whose workload hashes the
    prompts alone, as sampled answers (found by a wide ``HEADWAY_HUNT`` round). Each request's output
    is its own token now: its own blocks, as in the simulator."""
    p = list(range(2000, 2022))
    scenario = _engine(
        _req(0, p, 43, 0), _req(1, [*p, *range(3000, 3018)], 42, 0), _req(2, [*p, *range(4000, 4019)], 42, 0),
        _req(3, p, 43, 0), num_blocks=17, max_num_seqs=5, max_num_batched_tokens=32,
    )  # fmt: skip
    sim, ref, reply = _pair(vllm_steps, scenario, "uniboost-memguard", "none", "vllm-async")
    assert next((s["step"], s["preempted"]) for s in reply["steps"] if s["preempted"]) == (42, ["r3"])
    assert sim == ref


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
