"""The lazy heap of running keys must pick the victims a scan of every running key picks.

Every preemptive policy, in every displacement mode, on workloads that displace for slots and for
KV blocks (fast-forward and step by step): the per-request outcomes with the heap (and late
progress reports where a policy declares ``progress_at_hints``) equal those of the exact path,
``_running_keys.EXACT_SCAN``, which re-keys every running request at each check.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import make_request
from headway.core import (
    DISPLACEMENT_MODES,
    RUNNING_KEYS,
    Policy,
    PolicyKey,
    Request,
    available_policies,
    get_policy_class,
    make_policy,
)  # fmt: skip
from headway.policies import noisy_oracle_defaults
from headway.sim import CacheConfig, CostModel, SchedulerConfig, SimResult, _running_keys, simulate
from headway.sim._running_keys import RunningKeys
from headway.workload import RequestSpec, Workload, default_workload
from strategies import engine_configs, workloads

PREEMPTIVE = [n for n in available_policies() if get_policy_class(n).preemptive is True]

# (requests, rate, max_num_seqs, num_gpu_blocks, max_steps_per_event)
SCENARIOS = [
    (400, 6.0, 64, 1500, 1 << 30),  # KV pressure: evictions (and pauses for slots)
    (300, 12.0, 8, None, 1 << 30),  # few slots: pauses
    (150, 6.0, 16, 800, 1),  # both, step by step
]


def _outcome(res: SimResult) -> list[tuple[object, ...]]:
    return sorted(
        (r.request_id, r.first_token_time, r.finish_time, r.num_preemptions, r.num_pauses, r.num_recomputed_tokens)
        for r in res.requests
    )


def _simulate(
    wl: Workload, name: str, mode: str, sched: SchedulerConfig, cache: CacheConfig, exact: bool,
    preset: CostModel | None = None, **extra: Any,
) -> SimResult:  # fmt: skip
    kwargs = {**(noisy_oracle_defaults(name, None, tau=0.75, seed=0) or {}), **extra}
    _running_keys.EXACT_SCAN = exact
    try:
        policy = make_policy(name, displacement=mode, **kwargs)
        return simulate(wl, policy, scheduler=sched, cache=cache, **({} if preset is None else {"preset": preset}))
    finally:
        _running_keys.EXACT_SCAN = False


def _run(name: str, mode: str, scenario: tuple[Any, ...], exact: bool, budget: int = 8192, **extra: Any) -> SimResult:
    num, rate, seqs, blocks, steps = scenario
    sched = SchedulerConfig(max_num_seqs=seqs, max_steps_per_event=steps, max_num_batched_tokens=budget)
    return _simulate(default_workload(num_requests=num, rate=rate), name, mode, sched,
                     CacheConfig(num_gpu_blocks=blocks), exact, **extra)  # fmt: skip


def test_the_declared_policies_are_covered() -> None:
    assert {"trail", "ltr", "srpt-oracle", "uniboost-base"} <= set(PREEMPTIVE)
    assert {get_policy_class(n).running_keys for n in PREEMPTIVE} <= set(RUNNING_KEYS)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", DISPLACEMENT_MODES)
@pytest.mark.parametrize("name", PREEMPTIVE)
def test_lazy_heap_decides_as_the_exact_scan(name: str, mode: str, scenario: tuple[Any, ...]) -> None:
    lazy = _run(name, mode, scenario, exact=False)
    exact = _run(name, mode, scenario, exact=True)
    assert _outcome(lazy) == _outcome(exact)
    if mode == "pause" and scenario[2] == 8:
        assert sum(r.num_pauses for r in lazy.requests) > 0  # the scenario exercises displacement


@pytest.mark.parametrize("budget", [8192, 128])
@pytest.mark.parametrize("quantum", [3, 1])
@pytest.mark.parametrize("scenario", [SCENARIOS[0], SCENARIOS[2]])
@pytest.mark.parametrize("mode", ["pause", "evict"])
def test_ltr_starvation_promotions_under_the_heap(
    mode: str, scenario: tuple[Any, ...], quantum: int, budget: int
) -> None:
    """Short starvation and quantum counts: many promotions, quantum ends and re-pauses (step by step
    with few blocks: KV shortages while requests are paused, whose victim the heaps' tops give).
    A one-token quantum started by a report of a prefill chunk ends with the prefill's token: the
    heap re-keys a request as its prefill ends (it kept the prefill's key before, too low). With a
    small token budget prefills take several chunks, and each chunk's report spends a step of the
    quantum: the heap re-keys a request at each (the quantum can end before its prefill does)."""
    extra = {"starvation_steps": 20, "quantum_steps": quantum}
    lazy = _run("ltr", mode, scenario, exact=False, budget=budget, **extra)
    exact = _run("ltr", mode, scenario, exact=True, budget=budget, **extra)
    assert sum(r.num_preemptions for r in lazy.requests) > 0
    assert _outcome(lazy) == _outcome(exact)


@pytest.mark.parametrize("steps", [1, 1 << 30])
def test_a_recompute_whose_token_reaches_a_key_point_is_re_keyed(steps: int) -> None:
    """uniboost-base quantizes output to multiples of 64 tokens, the key worsening at each. r4 is
    evicted at 127 output tokens and recomputes; its prefill's token is its 128th, where no hint is
    armed (hints are armed as a request starts decoding). The heap kept the key from the prefill,
    too low, and at the next KV shortage evicted r0 where a scan of every key (and vLLM, with the
    plugin's rank: ``test_displacement_vs_vllm.py``) evicts r4 (found by a wide ``HEADWAY_HUNT``
    round; reduced by script)."""
    rows = [("r16", 0, 112, 69), ("r13", 29, 77, 92), ("r15", 33, 133, 61), ("r8", 34, 122, 8), ("r4", 40, 50, 132),
            ("r0", 42, 52, 4)]  # fmt: skip
    wl = Workload.from_specs("keypoint", [RequestSpec(i, float(t), p, o, max_tokens=o) for i, t, p, o in rows])
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_steps_per_event=steps)
    cache = CacheConfig(block_size=16, num_gpu_blocks=24, enable_prefix_caching=False)
    unit = CostModel.fixed_step(1.0, name="unit-step")
    lazy = _simulate(wl, "uniboost-base", "evict", sched, cache, False, unit)
    exact = _simulate(wl, "uniboost-base", "evict", sched, cache, True, unit)
    assert {r.request_id: r.num_preemptions for r in exact.requests}["r4"] == 3
    assert _outcome(lazy) == _outcome(exact)


def test_an_undeclared_running_keys_value_is_named() -> None:
    policy = make_policy("srpt-oracle")

    class Odd(type(policy)):  # type: ignore[misc]
        running_keys = "sometimes"

    with pytest.raises(ValueError, match="'sometimes'"):
        simulate(default_workload(num_requests=5), Odd(), scheduler=SchedulerConfig())


@settings(max_examples=100, deadline=None)
@given(
    wl=workloads(), cfg=engine_configs(), name=st.sampled_from(PREEMPTIVE), mode=st.sampled_from(DISPLACEMENT_MODES),
    step_by_step=st.booleans(), roomy=st.booleans(),
)  # fmt: skip
def test_lazy_heap_decides_as_the_exact_scan_on_random_engines(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], name: str, mode: str, step_by_step: bool, roomy: bool
) -> None:
    """Small caches (KV shortages) or roomy ones (full batches: pauses), few slots, budgets with and
    without chunked prefill, swap or recompute."""
    sched, cache = cfg
    if step_by_step:
        sched = dataclasses.replace(sched, max_steps_per_event=1)
    if roomy:
        cache = CacheConfig(num_gpu_blocks=4096)
    extra = {"starvation_steps": 20, "quantum_steps": 3} if name == "ltr" else {}
    lazy = _simulate(wl, name, mode, sched, cache, False, **extra)
    exact = _simulate(wl, name, mode, sched, cache, True, **extra)
    assert _outcome(lazy) == _outcome(exact)


def _generic_prio(key: tuple[float | int, ...], seq: int, clock: int | None, countdown: bool) -> tuple[float, ...]:
    """The heap priority written once for every key length (the reference for the unrolled cases)."""
    if not countdown:
        return (*(-x for x in key), -seq)
    whole = math.floor(key[0])
    anchor = -whole if clock is None else -(whole + clock)
    return (anchor, whole - key[0], *(-x for x in key[1:]), -seq)


_COMPONENT = st.one_of(st.integers(-10**6, 10**6), st.floats(-1e9, 1e9, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    key=st.lists(_COMPONENT, min_size=1, max_size=4).map(tuple), seq=st.integers(0, 10**6),
    clock=st.one_of(st.none(), st.integers(0, 10**6)), countdown=st.booleans(),
)  # fmt: skip
def test_heap_priorities_equal_the_generic_negation(
    key: tuple[float | int, ...], seq: int, clock: int | None, countdown: bool
) -> None:
    """The one- and two-component keys negated without a generator give the same priorities, value
    and type, as the loop over any key length (so the heaps order exactly as before)."""
    heap = RunningKeys(make_policy("trail" if countdown else "ltr"))
    got = heap._prio(key, seq, clock)
    want = _generic_prio(key, seq, clock, countdown)
    assert got == want
    assert [type(x) for x in got] == [type(x) for x in want]
    # and push, which inlines the one-component countdown case, files the same priority
    heap.policy.key = lambda request, now: key  # type: ignore[method-assign]
    heap.push("item", make_request(seq=seq), 0.0, clock)
    (pushed,) = heap._drift if countdown and clock is not None else heap._fixed
    assert pushed[0] == want
    assert [type(x) for x in pushed[0]] == [type(x) for x in want]


class _TableKeys(Policy):
    """Keys from a table the test edits (never registered): keys that improve between pushes, as the
    contract allows, and a can_preempt that lapses."""

    preemptive = True

    def __init__(self, mode: str) -> None:
        self.keys: dict[int, tuple[float, ...]] = {}
        self.blocked: set[int] = set()
        self.running_keys = mode

    def key(self, request: Request, now: float) -> PolicyKey:
        return self.keys[request.seq]

    def can_preempt(self, request: Request, now: float) -> bool:
        return request.seq not in self.blocked


_KEY = st.one_of(st.integers(0, 6), st.floats(0.0, 6.0, allow_nan=False)).map(float)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), mode=st.sampled_from(RUNNING_KEYS), width=st.sampled_from([1, 2]))
def test_worst_is_the_largest_key_above_the_bound_among_the_preemptible(data: Any, mode: str, width: int) -> None:
    """RunningKeys.worst against a scan of the live items' keys now, over pushes, drops, improved
    keys and lapsed can_preempt, for bounds anywhere (infinite too): its early stop at the heap's top
    (every entry bounds its key) finds what the scan finds."""
    if mode == "countdown":
        width = 1  # (decoders are not modelled here: no clock)
    policy = _TableKeys(mode)
    heap: RunningKeys[int] = RunningKeys(policy)
    reqs = {i: make_request(f"r{i}", seq=i) for i in range(12)}
    live: set[int] = set()
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["push", "drop", "improve", "lapse", "worst"]))
        i = data.draw(st.sampled_from(sorted(reqs)))
        if op == "push":
            policy.keys[i] = tuple(data.draw(_KEY) for _ in range(width))
            policy.blocked.discard(i)  # a key point: can_preempt may hold again
            heap.push(i, reqs[i], 0.0)
            live.add(i)
        elif op == "drop":
            heap.drop(i)
            live.discard(i)
        elif op == "improve" and i in live:
            policy.keys[i] = (policy.keys[i][0] - data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])), *policy.keys[i][1:])
            heap.forget()  # (keys move between checks: the next worst starts a new one)
        elif op == "lapse" and i in live and mode:  # (declared modes: it stays lapsed until a push)
            policy.blocked.add(i)
            heap.forget()
        elif op == "worst":
            first = data.draw(st.one_of(_KEY, st.just(math.inf), st.just(-math.inf)))
            above: tuple[PolicyKey, int] | None = (
                (first, *(data.draw(_KEY) for _ in range(width - 1))), data.draw(st.integers(0, 12))
            )
            if data.draw(st.booleans()):
                above = None  # any: a KV shortage's victim
            scan = [
                (policy.keys[j], j)
                for j in live
                if (above is None or (policy.keys[j], j) > above) and j not in policy.blocked
            ]
            found = heap.worst(above, 0.0, lambda item: None, lambda: [(j, reqs[j], None) for j in live])
            assert (None if found is None else found[1]) == (max(scan) if scan else None)


def test_a_push_of_the_priority_already_filed_adds_no_entry() -> None:
    """A request pushed again with the key its live entry holds (LTR: keyed as it is admitted, again
    as its prefill ends, most often unchanged) files nothing new: the entry stands, exact. A
    different key, a key the top was re-keyed to by worst, and a request whose entry left the heap
    (a lapsed can_preempt) are filed as before."""
    policy = _TableKeys("bounded")
    heap: RunningKeys[int] = RunningKeys(policy)
    reqs = {i: make_request(f"r{i}", seq=i) for i in range(2)}
    policy.keys = {0: (5.0,), 1: (3.0,)}

    def worst() -> tuple[int, tuple[PolicyKey, int]] | None:
        heap.forget()
        return heap.worst(None, 0.0, lambda item: None, lambda: [])

    for _ in range(3):
        heap.push(0, reqs[0], 0.0)
    heap.push(1, reqs[1], 0.0)
    assert len(heap._fixed) == 2
    policy.keys[0] = (4.0,)  # improved between key points: worst re-keys the top in place
    assert worst() == (0, ((4.0,), 0))
    heap.push(0, reqs[0], 0.0)  # a key point with the key worst filed: nothing new
    assert len(heap._fixed) == 2
    policy.keys[0] = (6.0,)  # worse at a key point: a new entry
    heap.push(0, reqs[0], 0.0)
    assert len(heap._fixed) == 3 and worst() == (0, ((6.0,), 0))
    policy.blocked.add(0)  # lapsed: its entry leaves the heap, it is found again once pushed
    assert worst() == (1, ((3.0,), 1))
    policy.blocked.discard(0)
    heap.push(0, reqs[0], 0.0)
    assert worst() == (0, ((6.0,), 0))
    heap.drop(0)
    heap.push(0, reqs[0], 0.0)  # dropped, then running again: filed
    assert worst() == (0, ((6.0,), 0))


def test_an_answer_is_remembered_within_a_check_until_a_push_a_drop_or_forget() -> None:
    """Asked again in the same check (same instant and clock) with nothing pushed or dropped, worst
    gives its last answer for any bound without re-keying; a key moved since (between checks, as
    progress moves them) is seen only after forget, and a push or drop is seen at once."""
    policy = _TableKeys("bounded")
    heap: RunningKeys[int] = RunningKeys(policy)
    reqs = {i: make_request(f"r{i}", seq=i) for i in range(3)}
    for i, k in [(0, 5.0), (1, 3.0)]:
        policy.keys[i] = (k,)
        heap.push(i, reqs[i], 0.0)
    calls: list[int] = []

    def worst(bound: float) -> tuple[int, tuple[PolicyKey, int]] | None:
        return heap.worst(((bound,), 9), 0.0, calls.append, lambda: [])

    assert worst(1.0) == (0, ((5.0,), 0))
    assert calls == [0]
    policy.keys[0] = (2.0,)  # improved without a push: the check's answer stands
    assert worst(1.0) == (0, ((5.0,), 0))
    assert worst(6.0) is None  # a bound at or above the answer: nobody
    assert calls == [0]  # (no re-key)
    heap.forget()  # a new check
    assert worst(1.0) == (1, ((3.0,), 1))
    policy.keys[2] = (4.0,)
    heap.push(2, reqs[2], 0.0)
    assert worst(1.0) == (2, ((4.0,), 2))
    heap.drop(2)
    assert worst(1.0) == (1, ((3.0,), 1))
    # another instant is another check
    policy.keys[1] = (1.5,)
    assert heap.worst(((1.0,), 9), 1.0, calls.append, lambda: []) == (0, ((2.0,), 0))


@pytest.mark.parametrize("mode", ["bounded", "countdown"])
def test_a_countdown_prefill_ending_this_step_waits_for_its_decoding_key(mode: str) -> None:
    """admit files a request's key as push does, except a countdown key whose last prefill chunk
    runs in this step: it is keyed when it starts decoding (RunningKeys.decoding)."""
    policy = _TableKeys(mode)
    heap: RunningKeys[int] = RunningKeys(policy)
    reqs = {i: make_request(f"r{i}", seq=i) for i in range(2)}
    policy.keys.update({0: (5.0,), 1: (3.0,)})
    heap.admit(0, reqs[0], 0.0, last_chunk=True)
    heap.admit(1, reqs[1], 0.0, last_chunk=False)
    found = heap.worst(None, 0.0, lambda item: None, lambda: [])
    assert found == ((1, ((3.0,), 1)) if mode == "countdown" else (0, ((5.0,), 0)))
    heap.decoding(0, reqs[0], 0.0, 0)
    heap.forget()
    assert heap.worst(None, 0.0, lambda item: None, lambda: []) == (0, ((5.0,), 0))
