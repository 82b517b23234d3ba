"""Properties of the simulator over random workloads and engine configurations."""

from __future__ import annotations

import dataclasses
import gc
import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import make_workload, unit_cost
from headway.core import Policy, PolicyKey, Request, RequestState, make_policy
from headway.policies import FCFSPolicy
from headway.sim import CacheConfig, EventLoop, SchedulerConfig, SimResult, SimulationStalled, simulate
from headway.sim._events import STEP_END, tie_floor
from headway.workload import RequestSpec, Workload
from strategies import engine_configs, workloads

COST = unit_cost(0.01, 1e-4, 1e-6)


class CountingFCFS(FCFSPolicy):
    """FCFS that records every hook call (never registered)."""

    def __init__(self) -> None:
        self.finished: Counter[str] = Counter()
        self.arrived: Counter[str] = Counter()

    def on_arrival(self, request: Request, now: float) -> None:
        self.arrived[request.request_id] += 1

    def on_finish(self, request: Request, now: float) -> None:
        self.finished[request.request_id] += 1


def _fingerprint(res: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.state, r.first_scheduled_time, r.first_token_time, r.finish_time,
         r.num_output_tokens, r.num_preemptions, r.num_recomputed_tokens)
        for r in res.requests
    ]



@given(wl=workloads(), cfg=engine_configs())
def test_every_request_finishes_exactly_once(wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig]) -> None:
    sched, cache = cfg
    policy = CountingFCFS()
    res = simulate(wl, policy, preset=COST, scheduler=sched, cache=cache)
    assert len(res.requests) == len(wl)
    for spec, req in zip(wl.requests, res.requests, strict=True):
        assert req.request_id == spec.request_id
        assert req.is_finished
        if req.state is RequestState.FINISHED:
            assert policy.finished[req.request_id] == 1
            assert req.num_output_tokens <= spec.num_output_tokens
            assert req.arrival_time <= req.first_token_time <= req.finish_time  # type: ignore[operator]
        else:
            assert policy.finished[req.request_id] == 0
    assert sum(policy.arrived.values()) <= len(wl)



def _server_holds_until(r: Request, wl: Workload) -> float | None:
    """Until when vLLM's API server counted ``r`` as unfinished: its finish, or its client's abort
    (the server forgets it then, before the engine takes the abort); None if it turned ``r`` away."""
    assert r.finish_time is not None
    if str(r.extra.get("abort_reason", "")).startswith("rejected"):
        assert r.finish_time == r.arrival_time and r.first_scheduled_time is None
        return None
    if r.extra.get("abort_reason") != "client timeout":
        return r.finish_time
    timeout = wl.requests[r.seq].timeout  # (the simulator numbers requests in the workload's order)
    assert timeout is not None and r.finish_time >= r.arrival_time + timeout - 1e-9
    return r.arrival_time + timeout


@given(wl=workloads(), cfg=engine_configs(), limit=st.integers(0, 6))
def test_the_server_never_holds_more_unfinished_requests_than_max_num_queued_reqs(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], limit: int
) -> None:
    sched, cache = cfg
    sched = dataclasses.replace(sched, max_num_queued_reqs=limit)
    res = simulate(wl, "fcfs", preset=COST, scheduler=sched, cache=cache)
    events = []
    for r in res.requests:
        end = _server_holds_until(r, wl)
        if end is None:
            continue
        events += [(r.arrival_time, 1), (end, -1)]
    unfinished = peak = 0
    for _, change in sorted(events):  # (a finish before an arrival at the same time)
        unfinished += change
        peak = max(peak, unfinished)
    assert peak <= limit


@given(wl=workloads(), cfg=engine_configs(), limit=st.integers(0, 4), router=st.sampled_from(["round-robin", "random"]))
def test_a_fleet_turns_a_request_away_only_when_every_replica_is_full(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], limit: int, router: str
) -> None:
    sched, cache = cfg
    sched = dataclasses.replace(sched, max_num_queued_reqs=limit, max_num_queued_tokens=None)
    res = simulate(wl, "fcfs", preset=COST, scheduler=sched, cache=cache, num_replicas=3, router=router)
    held: list[tuple[int, float, int, float]] = []  # (replica, arrival, seq, end) of each admitted request
    rejected = []
    for k, r in zip(res.assignment, res.requests, strict=True):
        end = _server_holds_until(r, wl)
        if end is None:
            rejected.append(r)
        else:
            held.append((k, r.arrival_time, r.seq, end))
    for r in rejected:  # each replica then held at least `limit` (counting ties as held: an upper bound;
        t = r.arrival_time  # a rounding tie too: the event loop takes the arrival first, tie_floor)
        for k in range(3):
            n = sum(1 for j, a, seq, end in held if j == k and (a, seq) < (t, r.seq) and end >= tie_floor(t))
            assert n >= limit, (r.request_id, k, n)


@given(wl=workloads(), cfg=engine_configs(), name=st.sampled_from(["fcfs", "priority", "sjf-oracle", "srpt-oracle"]))
def test_kv_cache_and_token_budget_are_respected(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], name: str
) -> None:
    sched, cache = cfg
    res = simulate(wl, name, preset=COST, scheduler=sched, cache=cache, record_timeline=True)
    (rep,) = res.replicas
    assert rep.timeline is not None
    assert all(0 <= used <= rep.num_gpu_blocks for _, _, _, used in rep.timeline)
    assert all(running <= sched.active_seqs for _, _, running, _ in rep.timeline)
    assert rep.max_step_tokens <= sched.max_num_batched_tokens
    # (simulate() itself raises if blocks are not all returned at the end)



@given(wl=workloads(), cfg=engine_configs())
def test_fcfs_never_reorders_arrivals(wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig]) -> None:
    sched, cache = cfg
    res = simulate(wl, "fcfs", preset=COST, scheduler=sched, cache=cache)
    started = [r.first_scheduled_time for r in res.requests if r.first_scheduled_time is not None]
    assert started == sorted(started)



FAST_FORWARD_POLICIES = [
    "fcfs", "sjf-oracle", "srpt-oracle", "uniboost-base", "uniboost-memguard", "uniboost", "ltr", "trail",
]
# LTR learns its step time from progress reports and reads it at arrival; starving after 20 steps, a
# 3-step quantum, it promotes (and preempts) within these small workloads
POLICY_KWARGS: dict[str, dict[str, object]] = {
    "ltr": {"scorer": "noisy-oracle", "tau": 0.5, "starvation_steps": 20, "quantum_steps": 3},
    "trail": {"scorer": "noisy-oracle", "tau": 0.5},
}


@given(
    wl=workloads(), cfg=engine_configs(), name=st.sampled_from(FAST_FORWARD_POLICIES),
    per_arrival=st.sampled_from([0.0, 3e-3]),
)  # fmt: skip
def test_fast_forward_matches_exact_mode(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], name: str, per_arrival: float
) -> None:
    sched, cache = cfg
    cost = dataclasses.replace(COST, per_arrival=per_arrival)
    kw = POLICY_KWARGS.get(name)
    exact_cfg = dataclasses.replace(sched, max_steps_per_event=1)
    try:
        fast = simulate(wl, name, policy_kwargs=kw, preset=cost, scheduler=sched, cache=cache)
    except SimulationStalled as exc:  # a livelock (LTR's rotation under a small KV budget): step by step too
        with pytest.raises(SimulationStalled) as stalled:
            simulate(wl, name, policy_kwargs=kw, preset=cost, scheduler=exact_cfg, cache=cache)
        assert str(stalled.value) == str(exc)
        return
    exact = simulate(wl, name, policy_kwargs=kw, preset=cost, scheduler=exact_cfg, cache=cache)
    assert_same_outcomes(fast, exact)


def assert_same_outcomes(fast: SimResult, exact: SimResult) -> None:
    """Fast-forward and step-by-step runs agree: steps, states, counts, and times to rounding."""
    assert fast.num_steps == exact.num_steps
    for a, b in zip(fast.requests, exact.requests, strict=True):
        assert (a.state, a.num_output_tokens, a.num_preemptions, a.num_recomputed_tokens) == (
            b.state, b.num_output_tokens, b.num_preemptions, b.num_recomputed_tokens)
        for f in ("queued_time", "first_scheduled_time", "first_token_time", "finish_time"):
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None), (a.request_id, f)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-12), (a.request_id, f)


def test_fast_forward_matches_exact_mode_async_preemptive() -> None:
    """Found by the property above. With async scheduling a preemptive policy reads each plan a step
    behind (``sim/_async.py``): r0's rekey hint, reached at the end of a stretch (step 64), is delivered
    after the plan of step 65 and first seen by the plan of step 66, which evicts r0 for r12. A stretch
    launched right after that output skipped that plan, and uniboost-base (evict) on a burst of 18
    requests in 5 KV blocks ran 72 steps fast-forwarded against 73 step by step (r0 finished at 0.674
    against 0.741). That launch is now one step (``_decode_horizon``), and the run still fast-forwards."""
    wl = make_workload([(0.0, 1, 66), *[(0.0, 1, 1)] * 11, (0.0, 1, 27), *[(0.0, 1, 1)] * 5])
    sched = SchedulerConfig(max_num_batched_tokens=68, max_num_seqs=2, enable_chunked_prefill=False,
                            scheduler_reserve_full_isl=False, async_scheduling=True)
    cache = CacheConfig(num_gpu_blocks=5)
    fast = simulate(wl, "uniboost-base", preset=COST, scheduler=sched, cache=cache)
    exact = simulate(wl, "uniboost-base", preset=COST, scheduler=dataclasses.replace(sched, max_steps_per_event=1),
                     cache=cache)
    assert exact.num_steps == 73
    assert_same_outcomes(fast, exact)
    assert fast.replicas[0].num_step_events < 40  # (73 step by step: the two decode stretches stay)


def test_fast_forward_matches_exact_mode_at_a_rounding_tie() -> None:
    """Found by the property above (deep profile). A decode stretch ends at 3.14 in closed form and at
    3.1399999999999997 step by step (19 step times added one by one); two requests arrive at 3.14. Before,
    they fell inside the step in flight in fast-forward (each lengthening it by per_arrival: r6 finished at
    3.146) and after its end step by step (r6 at 3.1399999999999997), and the runs went apart from there.
    An arrival within a rounding tie of a step end now counts as at it, in both modes, and comes after
    that step's output, as vLLM adds a request after the output of the step it came in."""
    wl = make_workload([
        (0.01, 1, 1), (0.02, 1, 1), (0.07, 281, 112), (0.12000000000000001, 218, 47), (0.32, 1, 134),
        (0.52, 62, 43), (0.52, 74, 133), (0.53, 183, 133), (0.54, 94, 17), (0.74, 207, 1), (0.94, 129, 133),
        (1.94, 1, 1), (2.94, 1, 59), (3.14, 1, 1), (3.14, 1, 1),
    ])  # fmt: skip
    cost = dataclasses.replace(COST, per_arrival=3e-3)
    # found before vLLM's scheduler_reserve_full_isl was modelled: the tie needs first-chunk admission
    sched = SchedulerConfig(max_num_batched_tokens=248, max_num_seqs=4, enable_chunked_prefill=True,
                            preemption_mode="swap", scheduler_reserve_full_isl=False)
    cache = CacheConfig(num_gpu_blocks=27)
    fast = simulate(wl, "srpt-oracle", preset=cost, scheduler=sched, cache=cache)
    exact = simulate(wl, "srpt-oracle", preset=cost, scheduler=dataclasses.replace(sched, max_steps_per_event=1),
                     cache=cache)
    assert_same_outcomes(fast, exact)
    # both arrivals at 3.14 come after the step ending then, in which r6 finishes; they join the next
    # step, which their frontend time lengthens by 2 x 3 ms (it was the step ending then, r6 at 3.146)
    for res in (fast, exact):
        assert res.requests[6].finish_time == pytest.approx(3.14, abs=1e-12)
        assert res.requests[13].queued_time == pytest.approx(3.14, abs=1e-12)
        assert res.requests[13].finish_time == pytest.approx(3.15666, abs=1e-9)


def test_fast_forward_matches_exact_mode_at_an_abort_tied_with_an_async_plan() -> None:
    """Found by the property above (with async displacing policies fast-forwarded; FCFS shows it too).
    r3's client aborts at 1.21 + 0.3 = 1.51, the time the step starting at 1.509999 is planned at
    (``ASYNC_PLAN_DELAY`` after that start): step by step the abort counts as by then (a rounding tie)
    and is taken before that step's output, r3 aborted at 1.520691 with 22 tokens. In a decode stretch
    that start is 1.5099989999999995 in closed form, and the abort counted as after that plan: the
    stretch ran on, r3 got its 23rd token and r2 finished a step later (1.531385 against 1.531087).
    The stretch's cut now counts a tie as by the plan, as the step's end does (``_apply_aborts``)."""
    rows = [(0.05, 274, 1, 0.05), (0.11, 190, 87, None), (0.21, 76, 120, None), (1.21, 277, 23, 0.3),
            (1.42, 1, 1, None)]  # fmt: skip
    specs = [RequestSpec(f"r{i}", t, p, o, timeout=timeout) for i, (t, p, o, timeout) in enumerate(rows)]
    wl = Workload.from_specs("t", specs)
    cost = dataclasses.replace(COST, per_arrival=3e-3)
    sched = SchedulerConfig(max_num_batched_tokens=79, max_num_seqs=12, enable_chunked_prefill=True,
                            scheduler_reserve_full_isl=False, watermark=0.5, async_scheduling=True)
    cache = CacheConfig(num_gpu_blocks=38)
    fast = simulate(wl, "fcfs", preset=cost, scheduler=sched, cache=cache)
    exact = simulate(wl, "fcfs", preset=cost, scheduler=dataclasses.replace(sched, max_steps_per_event=1), cache=cache)
    assert_same_outcomes(fast, exact)
    r3 = fast.requests[3]
    assert (r3.state, r3.num_output_tokens) == (RequestState.ABORTED, 22)
    assert fast.replicas[0].num_step_events < fast.num_steps  # (the decode stretch stays)


def test_an_arrival_a_rounding_tie_after_an_event_goes_first() -> None:
    """The event loop's side of the rule: an arrival a few ulps after a heap event is simultaneous with it,
    so it runs first (arrivals win ties), and the event then runs at the arrival's time, never earlier."""
    loop = EventLoop()
    seen: list[tuple[str, float]] = []
    loop.schedule(math.nextafter(3.14, 0.0), STEP_END, lambda _: seen.append(("step", loop.now)))
    loop.schedule(3.19, STEP_END, lambda _: seen.append(("step", loop.now)))
    loop.set_arrivals([3.14, 3.2], lambda i: seen.append(("arrival", loop.now)))
    loop.run()
    assert seen == [("arrival", 3.14), ("step", 3.14), ("step", 3.19), ("arrival", 3.2)]



@given(wl=workloads(), cfg=engine_configs())
def test_same_inputs_give_identical_results(wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig]) -> None:
    sched, cache = cfg
    runs = [simulate(wl, "sjf-oracle", preset=COST, scheduler=sched, cache=cache) for _ in range(2)]
    assert _fingerprint(runs[0]) == _fingerprint(runs[1])


class Sneaky(Policy):
    """A non-oracle policy that tries to read true lengths."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.true_output_tokens(request),)


def test_non_oracle_policy_cannot_read_true_lengths() -> None:
    from factories import make_workload
    from headway.core import OracleAccessError

    with pytest.raises(OracleAccessError, match="not an oracle"):
        simulate(make_workload([(0.0, 4, 3)]), Sneaky(), preset=COST)
    oracle = make_policy("sjf-oracle")
    with pytest.raises(OracleAccessError, match="no oracle bound"):
        oracle.true_output_tokens(Request("x", 0.0, 1, 1))


class _GCProbe(FCFSPolicy):
    """FCFS that records whether the cyclic collector runs during each arrival (never registered)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.enabled: list[bool] = []
        self.fail_at = fail_at

    def on_arrival(self, request: Request, now: float) -> None:
        self.enabled.append(gc.isenabled())
        if len(self.enabled) == self.fail_at:
            raise RuntimeError("probe")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cyclic_gc_is_paused_during_the_loop_and_restored(enabled: bool) -> None:
    wl = make_workload([(0.0, 10, 5), (0.1, 20, 3)])
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        probe = _GCProbe()
        simulate(wl, probe, preset=COST, scheduler=SchedulerConfig())
        assert probe.enabled == [False, False]
        assert gc.isenabled() is enabled
        failing = _GCProbe(fail_at=1)
        with pytest.raises(RuntimeError, match="probe"):
            simulate(wl, failing, preset=COST, scheduler=SchedulerConfig())
        assert gc.isenabled() is enabled  # restored when the loop raises too
    finally:
        (gc.enable if was else gc.disable)()
