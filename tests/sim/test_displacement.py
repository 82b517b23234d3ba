"""vLLM V1's preemption rules as the default, and the displacement modes preemptive policies ask for.

Hand-computed scenarios with a unit cost model (every step takes 1 s), in both the exact
step-by-step mode and the fast-forward mode.
"""

from __future__ import annotations

import dataclasses

import pytest

from factories import make_workload, unit_cost
from headway.core import get_policy_class, make_policy
from headway.sim import CacheConfig, SchedulerConfig, SimulationStalled, simulate
from headway.workload import RequestSpec, Workload

STEPS = [1, 1 << 30]


def _one_slot(max_steps: int) -> SchedulerConfig:
    return SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_steps_per_event=max_steps)


@pytest.mark.parametrize("max_steps", STEPS)
@pytest.mark.parametrize("mode", ["none", "evict"])
def test_a_full_batch_displaces_nobody(max_steps: int, mode: str) -> None:
    # One slot. A (4-token prompt, 10 tokens) runs from t=0; B (1 token left) arrives at 0.5 and
    # outranks A under SRPT, but a full batch is no reason to evict: B waits for A's slot.
    wl = make_workload([(0.0, 4, 10), (0.5, 4, 1)])
    policy = make_policy("srpt-oracle", displacement=mode)
    res = simulate(wl, policy, preset=unit_cost(1.0), scheduler=_one_slot(max_steps))
    a, b = res.requests
    assert a.finish_time == pytest.approx(10.0) and b.finish_time == pytest.approx(11.0)
    assert (a.num_preemptions, b.num_preemptions) == (0, 0)


@pytest.mark.parametrize("max_steps", STEPS)
def test_pause_takes_the_slot_and_keeps_the_kv(max_steps: int) -> None:
    # As above in pause mode: at t=1 B takes A's slot; A keeps its 4 prompt tokens + 1 output in
    # KV and resumes at t=2 with a 1-token step, no recompute: its tokens 2..10 end at 3..11.
    wl = make_workload([(0.0, 4, 10), (0.5, 4, 1)])
    policy = make_policy("srpt-oracle", displacement="pause")
    res = simulate(wl, policy, preset=unit_cost(1.0), scheduler=_one_slot(max_steps))
    a, b = res.requests
    assert b.first_scheduled_time == pytest.approx(1.0) and b.finish_time == pytest.approx(2.0)
    assert a.finish_time == pytest.approx(11.0)
    assert (a.num_preemptions, a.num_pauses, a.num_recomputed_tokens) == (1, 1, 0)
    assert res.replicas[0].num_preemptions == 0  # nothing was evicted


@pytest.mark.parametrize("max_steps", STEPS)
@pytest.mark.parametrize("mode", ["none", "evict"])
def test_no_eviction_for_the_token_budget(max_steps: int, mode: str) -> None:
    # No chunked prefill, a 10-token budget: while A1 and A2 decode (1 token each), B's 9-token
    # prompt does not fit the 8 left. vLLM waits; it never evicts a decoder to free budget.
    wl = make_workload([(0.0, 2, 5), (0.0, 2, 5), (0.5, 9, 1)])
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, enable_chunked_prefill=False,
                            max_steps_per_event=max_steps)  # fmt: skip
    res = simulate(wl, make_policy("srpt-oracle", displacement=mode), preset=unit_cost(1.0), scheduler=sched)
    a1, a2, b = res.requests
    assert a1.finish_time == a2.finish_time == pytest.approx(5.0) and b.finish_time == pytest.approx(6.0)
    assert [r.num_preemptions for r in res.requests] == [0, 0, 0]


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_step_that_preempted_admits_nobody(max_steps: int) -> None:
    # Three 16-token blocks. A and B (16-token prompts) hold one each; at t=1 both cross a block
    # boundary, one block is free: B (the later) is evicted. C (4 tokens, priority -1, arrived
    # at 0.5) would fit the block B freed, but vLLM admits nobody in a step that preempted: C
    # starts at t=2, not t=1.
    wl = Workload.from_specs("t", [
        RequestSpec("a", 0.0, 16, 10), RequestSpec("b", 0.0, 16, 10), RequestSpec("c", 0.5, 4, 1, priority=-1),
    ])  # fmt: skip
    res = simulate(wl, "priority", preset=unit_cost(1.0), scheduler=SchedulerConfig(max_steps_per_event=max_steps),
                   cache=CacheConfig(num_gpu_blocks=3))  # fmt: skip
    a, b, c = res.requests
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert c.first_scheduled_time == pytest.approx(2.0) and c.finish_time == pytest.approx(3.0)


@pytest.mark.parametrize("max_steps", STEPS)
def test_evict_mode_evicts_for_kv_blocks(max_steps: int) -> None:
    # Two blocks. A (16-token prompt, 10 tokens) holds one and needs a second at t=1; B (16-token
    # prompt, 1 token) arrives at 0.5. At t=1 A takes the free block (running first). At t=2 B
    # outranks A (1 < 8 left) and finds no block: evict mode evicts A (recompute); pause mode too
    # (a KV shortage), none mode waits.
    wl = make_workload([(0.0, 16, 10), (0.5, 16, 1)])
    out = {}
    for mode in ("none", "pause", "evict"):
        sched = SchedulerConfig(max_steps_per_event=max_steps)
        res = simulate(wl, make_policy("srpt-oracle", displacement=mode), preset=unit_cost(1.0), scheduler=sched,
                       cache=CacheConfig(num_gpu_blocks=2))  # fmt: skip
        out[mode] = [(r.num_preemptions, r.finish_time) for r in res.requests]
    assert out["none"] == [(0, pytest.approx(10.0)), (0, pytest.approx(11.0))]
    assert out["evict"] == out["pause"]
    (pa, _), (pb, fb) = out["evict"]
    assert (pa, pb) == (1, 0) and fb == pytest.approx(2.0)  # B ran in step [1, 2]


def test_declared_modes_and_overrides() -> None:
    for name, mode in [("srpt-oracle", "pause"), ("trail", "pause"), ("trail-oracle", "pause"), ("ltr", "pause"),
                       ("uniboost-base", "evict"), ("uniboost-memguard", "evict"), ("uniboost", "evict")]:  # fmt: skip
        cls = get_policy_class(name)
        assert cls.preemptive and cls.displacement == mode and cls.displacement_source
    assert get_policy_class("fcfs").displacement == "none"
    assert make_policy("ltr", displacement="evict").displacement == "evict"
    with pytest.raises(ValueError, match="displacement must be one of none, pause, evict, got 'swap'"):
        make_policy("ltr", displacement="swap")
    with pytest.raises(ValueError, match="'sjf-oracle' is not preemptive"):
        make_policy("sjf-oracle", displacement="pause")


def test_step_records_show_the_preemption_and_the_held_admission() -> None:
    wl = Workload.from_specs("t", [
        RequestSpec("a", 0.0, 16, 10), RequestSpec("b", 0.0, 16, 10), RequestSpec("c", 0.5, 4, 1, priority=-1),
    ])  # fmt: skip
    res = simulate(wl, "priority", preset=unit_cost(1.0), scheduler=SchedulerConfig(max_steps_per_event=1),
                   cache=CacheConfig(num_gpu_blocks=3), record_steps=True)  # fmt: skip
    steps = res.replicas[0].steps
    assert steps is not None
    assert [(s.time, s.scheduled, s.preempted) for s in steps[:3]] == [
        (0.0, (("a", 16), ("b", 16)), ()),
        (1.0, (("a", 1),), ("b",)),  # b evicted; c (arrived at 0.5) not admitted in this step
        (2.0, (("a", 1), ("c", 4)), ()),
    ]


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_request_that_evicts_itself_ends_the_running_loop(max_steps: int) -> None:
    # vLLM's running loop goes in running-list order, and when the request short of blocks is its
    # own victim it stops there: nobody after it runs that step. Three 16-token blocks, priority.
    # A (10-token prompt, priority 1) runs first; B (16 tokens, priority 0) joins at t=1 and takes
    # the last block at t=2. At t=7 A, first in the running list, needs a second block: it is the
    # lowest priority, so it evicts itself, and B sits the step out (blocks kept, no token). That
    # step schedules nothing and takes no time (vLLM's model runner returns at once): B runs at t=7.
    # tests/integrations/test_sim_vs_vllm.py runs the same against vLLM's own scheduler.
    wl = Workload.from_specs("t", [
        RequestSpec("a", 0.0, 10, 20, priority=1), RequestSpec("b", 0.5, 16, 10, priority=0),
    ])  # fmt: skip
    res = simulate(wl, "priority", preset=unit_cost(1.0), scheduler=SchedulerConfig(max_steps_per_event=max_steps),
                   cache=CacheConfig(num_gpu_blocks=3), record_steps=max_steps == 1,
                   record_timeline=max_steps == 1)  # fmt: skip
    a, b = res.requests
    assert (a.num_preemptions, b.num_preemptions) == (1, 0)
    assert b.finish_time == pytest.approx(11.0)  # 10 tokens from t=1, one empty step out
    assert a.finish_time == pytest.approx(24.0)  # back at t=11 (its 17 tokens need B's blocks), 13 to go
    if max_steps == 1:
        steps = res.replicas[0].steps
        assert steps is not None
        assert [(s.time, s.scheduled, s.preempted) for s in steps[6:9]] == [
            (6.0, (("a", 1), ("b", 1)), ()),
            (7.0, (), ("a",)),  # a evicted itself; b, after it in the running list, sat out
            (7.0, (("b", 1),), ()),  # the empty step took no time
        ]
        # (time, waiting, running) as step 6 ends, and as the empty step ends at the same time: b
        # still runs (it only sat the step out) and a waits
        timeline = res.replicas[0].timeline
        assert timeline is not None
        assert [t[:3] for t in timeline if t[0] == pytest.approx(7.0)] == [(7.0, 0, 2), (7.0, 1, 1)]


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_step_that_only_preempted_takes_the_cost_models_empty_step(max_steps: int) -> None:
    # The scenario above with ``empty_step`` 0.25 s: the step at t=7 that only evicts a takes that
    # long, and every later time moves by it (step by step and fast-forward alike).
    wl = Workload.from_specs("t", [
        RequestSpec("a", 0.0, 10, 20, priority=1), RequestSpec("b", 0.5, 16, 10, priority=0),
    ])  # fmt: skip
    cost = dataclasses.replace(unit_cost(1.0), empty_step=0.25)
    res = simulate(wl, "priority", preset=cost, scheduler=SchedulerConfig(max_steps_per_event=max_steps),
                   cache=CacheConfig(num_gpu_blocks=3), record_steps=max_steps == 1)  # fmt: skip
    a, b = res.requests
    assert (a.num_preemptions, b.num_preemptions) == (1, 0)
    assert (b.finish_time, a.finish_time) == (pytest.approx(11.25), pytest.approx(24.25))
    if max_steps == 1:
        steps = res.replicas[0].steps
        assert steps is not None
        assert [(s.time, s.scheduled, s.preempted) for s in steps[6:9]] == [
            (6.0, (("a", 1), ("b", 1)), ()), (7.0, (), ("a",)), (7.25, (("b", 1),), ()),
        ]  # fmt: skip


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_victim_in_the_middle_of_the_running_list_frees_blocks_for_those_after_it(max_steps: int) -> None:
    # Priority, five KV blocks: a (priority 0) and b (priority 1) decode from t=0, c (priority 0)
    # from t=16 (running list a, b, c). At t=17 all three need a block and none is free: a evicts b,
    # whose two blocks and given-back reservation leave one for c too, as in vLLM's loop; c was
    # evicted as well when b's reservation was taken off twice. tests/integrations/
    # test_sim_vs_vllm.py runs the same against vLLM's own scheduler.
    wl = Workload.from_specs("t", [
        RequestSpec("a", 0.0, 16, 40, priority=0), RequestSpec("b", 0.0, 16, 40, priority=1),
        RequestSpec("c", 16.0, 16, 40, priority=0),
    ])  # fmt: skip
    cache = CacheConfig(num_gpu_blocks=5, enable_prefix_caching=False)
    res = simulate(wl, "priority", preset=unit_cost(1.0), scheduler=SchedulerConfig(max_steps_per_event=max_steps),
                   cache=cache, record_steps=max_steps == 1)  # fmt: skip
    assert {r.request_id: r.num_preemptions for r in res.requests} == {"a": 0, "b": 1, "c": 1}  # (c: later)
    if max_steps == 1:
        steps = res.replicas[0].steps
        assert steps is not None
        assert [(s.time, s.scheduled, s.preempted) for s in steps[17:18]] == [(17.0, (("a", 1), ("c", 1)), ("b",))]


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_victim_scheduled_earlier_gives_its_tokens_to_a_later_prefill(max_steps: int) -> None:
    # vLLM's running loop sizes a partial prefill's chunk at its turn, so tokens given back by a
    # victim it had scheduled earlier in the step go to it. 14 blocks, a 16-token budget, priority:
    # x (priority 3), y and z (2) decode from t=0 and t=1; w (priority 1, 144 tokens, 1 to
    # generate) prefills from t=3 in chunks of 13 (16 less 3 decoders) and holds 9 blocks by t=13.
    # At t=13 the three decoders each need a second block and 2 are free: z is short, x (the
    # lowest priority, scheduled before z) is evicted and gives its token back, so w's last chunk
    # is 14 tokens, its whole rest, and w finishes in that step. tests/integrations/
    # test_sim_vs_vllm.py runs the same against vLLM's own scheduler.
    wl = Workload.from_specs("t", [
        RequestSpec("x", 0.0, 4, 14, priority=3), RequestSpec("y", 1.0, 5, 13, priority=2),
        RequestSpec("z", 1.0, 5, 13, priority=2), RequestSpec("w", 3.0, 144, 1, priority=1),
    ])  # fmt: skip
    sched = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=5, max_steps_per_event=max_steps)
    res = simulate(wl, "priority", preset=unit_cost(1.0), scheduler=sched, cache=CacheConfig(num_gpu_blocks=14),
                   record_steps=max_steps == 1)  # fmt: skip
    x, y, z, w = res.requests
    assert [r.num_preemptions for r in (x, y, z, w)] == [1, 0, 0, 0]
    assert w.finish_time == pytest.approx(14.0)  # the step from t=13
    if max_steps == 1:
        steps = res.replicas[0].steps
        assert steps is not None
        assert [(s.scheduled, s.preempted) for s in steps if s.time == pytest.approx(13.0)] == [
            ((("y", 1), ("z", 1), ("w", 14)), ("x",)),
        ]


# One slot, 8-token prefill chunks and 29 KV blocks for nine prompts of up to 274 tokens: LTR's
# rotation (20 idle steps promote a request for a 3-step quantum) evicts each promoted request's
# recompute before it gets past where its last one ended, and the cycle repeats for ever.
_LIVELOCK = [(0.2, 11, 199), (0.21, 279, 160), (3.21, 125, 181), (4.21, 198, 90), (4.26, 169, 58),
             (7.26, 107, 59), (7.31, 112, 90), (8.31, 247, 123), (8.32, 274, 54)]  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_displacement_livelock_stops_with_an_error_instead_of_running_forever(async_scheduling: bool) -> None:
    kw = {"scorer": "noisy-oracle", "tau": 0.5, "starvation_steps": 20, "quantum_steps": 3}
    cache = CacheConfig(block_size=16, num_gpu_blocks=29)
    errors = []
    for max_steps in STEPS:
        sched = SchedulerConfig(
            max_num_seqs=1, max_num_batched_tokens=241, long_prefill_token_threshold=8, watermark=0.2,
            async_scheduling=async_scheduling, max_steps_per_event=max_steps,
        )  # fmt: skip
        with pytest.raises(SimulationStalled, match="evicted 1,000 times in a row") as stalled:
            simulate(make_workload(_LIVELOCK), "ltr", policy_kwargs=kw, preset=unit_cost(0.01, 1e-4, 1e-6),
                     scheduler=sched, cache=cache)  # fmt: skip
        errors.append(str(stalled.value))
    assert errors[0] == errors[1]  # fast-forward and step by step stall at the same eviction
    # with room for two of them at once the same rotation ends
    res = simulate(make_workload(_LIVELOCK), "ltr", policy_kwargs=kw, preset=unit_cost(0.01, 1e-4, 1e-6),
                   scheduler=sched, cache=CacheConfig(block_size=16, num_gpu_blocks=58))  # fmt: skip
    assert all(r.num_output_tokens == n for r, (_, _, n) in zip(res.requests, _LIVELOCK, strict=True))


@pytest.mark.parametrize("max_steps", STEPS)
def test_a_running_request_that_evicts_itself_beside_a_paused_one_leaves_an_empty_step(max_steps: int) -> None:
    # Found by the fast-forward property hunt. One slot, 16 blocks: trail (pause) paused r0 (8 blocks)
    # for r11, whose last token needs a 9th block; the policy's victim is r11 itself (its noisy
    # prediction keys it below r0), so the step schedules nobody and, having preempted, admits nobody.
    # Nothing ran, and the replica went idle with both waiting: the run ended with them unfinished.
    # vLLM's engine schedules again after such a step (an empty model output); the next plan resumes r0.
    wl = make_workload([(0.0, 81, 130), (0.0, 1, 44)] + [(0.0, 1, 1)] * 9 + [(1.0, 96, 34)])
    sched = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1, max_steps_per_event=max_steps)
    kw = {"scorer": "noisy-oracle", "tau": 0.5}
    res = simulate(wl, "trail", policy_kwargs=kw, preset=unit_cost(0.01, 1e-4, 1e-6), scheduler=sched,
                   cache=CacheConfig(block_size=16, num_gpu_blocks=16), record_steps=True)  # fmt: skip
    assert [r.num_output_tokens for r in res.requests] == [130, 44] + [1] * 9 + [34]
    steps = [s for s in res.replicas[0].steps or () if s.preempted == ("r11",)]
    assert [(s.scheduled, s.num_steps) for s in steps] == [((), 1)]  # the empty step
    (after,) = [s for s in res.replicas[0].steps or () if s.time == steps[0].time and s.scheduled]
    assert after.scheduled == (("r0", 1),)  # at once: it took no model time
