"""Decode progress in runs (``Policy.on_decode_progress``) must equal one report per decoder.

LTR learns its step time from every decoder's progress at every step. With the runs hook the
simulator reports a batch's decoders in one call and leaves their counters lazy; these tests run
the same simulations with one ``on_progress`` per decoder (``_decode.PER_REQUEST_PROGRESS``) and
require the same per-request outcomes and the same learned step time, bit for bit: the step time
sets every starvation promotion, so a different value shows as a different schedule only
sometimes, the value itself always.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import make_request
from headway.core import DISPLACEMENT_MODES, RequestState, make_policy
from headway.policies import LTRPolicy, noisy_oracle_defaults
from headway.sim import CacheConfig, SchedulerConfig, SimResult, SimulationStalled, _decode, simulate
from headway.workload import Workload, default_workload
from strategies import engine_configs, workloads


def _outcome(res: SimResult) -> list[tuple[object, ...]]:
    return sorted(
        (r.request_id, r.first_token_time, r.last_token_time, r.finish_time, r.num_preemptions, r.num_pauses,
         r.num_recomputed_tokens, r.num_output_tokens)
        for r in res.requests
    )  # fmt: skip


def _simulate(
    wl: Workload, mode: str, sched: SchedulerConfig, cache: CacheConfig, per_request: bool, **extra: Any
) -> tuple[SimResult, float]:
    kwargs = {**(noisy_oracle_defaults("ltr", None, tau=0.75, seed=0) or {}), **extra}
    policy = make_policy("ltr", displacement=mode, **kwargs)
    assert isinstance(policy, LTRPolicy)
    _decode.PER_REQUEST_PROGRESS = per_request
    try:
        res = simulate(wl, policy, scheduler=sched, cache=cache)
    finally:
        _decode.PER_REQUEST_PROGRESS = False
    return res, policy.step_time


def _both(wl: Workload, mode: str, sched: SchedulerConfig, cache: CacheConfig, **extra: Any) -> SimResult:
    runs, runs_step = _simulate(wl, mode, sched, cache, False, **extra)
    each, each_step = _simulate(wl, mode, sched, cache, True, **extra)
    assert runs_step == each_step
    assert _outcome(runs) == _outcome(each)
    return runs


# (requests, rate, max_num_seqs, num_gpu_blocks, max_steps_per_event)
SCENARIOS = [
    (400, 6.0, 64, 1500, 1 << 30),  # KV pressure: evictions (and pauses for slots)
    (300, 12.0, 8, None, 1 << 30),  # few slots: pauses
    (150, 6.0, 16, 800, 1),  # both, step by step
    (300, 2.0, 32, None, 1 << 30),  # light load: stretches with an empty queue (late reports)
]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", DISPLACEMENT_MODES)
def test_runs_learn_and_decide_as_one_report_per_decoder(mode: str, scenario: tuple[Any, ...]) -> None:
    num, rate, seqs, blocks, steps = scenario
    sched = SchedulerConfig(max_num_seqs=seqs, max_steps_per_event=steps)
    wl = default_workload(num_requests=num, rate=rate)
    res = _both(wl, mode, sched, CacheConfig(num_gpu_blocks=blocks), starvation_steps=20, quantum_steps=3)
    assert all(r.state is RequestState.FINISHED for r in res.requests)


@settings(max_examples=100, deadline=None)
@given(
    wl=workloads(), cfg=engine_configs(), mode=st.sampled_from(DISPLACEMENT_MODES), step_by_step=st.booleans(),
    roomy=st.booleans(), starvation=st.sampled_from([3, 20, 200]),
)  # fmt: skip
def test_runs_equal_one_report_per_decoder_on_random_engines(
    wl: Workload, cfg: tuple[SchedulerConfig, CacheConfig], mode: str, step_by_step: bool, roomy: bool, starvation: int
) -> None:
    sched, cache = cfg
    if step_by_step:
        sched = dataclasses.replace(sched, max_steps_per_event=1)
    if roomy:
        cache = CacheConfig(num_gpu_blocks=4096)
    # as _both, where LTR's rotation may livelock a small engine: then both paths must stall alike
    outcomes: list[object] = []
    extra: dict[str, Any] = {"starvation_steps": starvation, "quantum_steps": 2}
    for per_request in (False, True):
        try:
            res, step_time = _simulate(wl, mode, sched, cache, per_request, **extra)
            outcomes.append((step_time, _outcome(res)))
        except SimulationStalled as stalled:
            outcomes.append(str(stalled))
    assert outcomes[0] == outcomes[1]


def test_a_run_is_its_reports_one_by_one() -> None:
    """The hook on its own: a run of three decoders equals their three on_progress calls."""
    runs, each = (LTRPolicy(initial_step_time=0.02, step_time_ema=0.05) for _ in range(2))
    reqs = [make_request(f"d{i}", score=1.0) for i in range(3)]
    for r in reqs:
        r.transition(RequestState.RUNNING)
        each.on_arrival(r, 0.0)
        r.num_output_tokens = 1
        each.on_progress(r, 0.5, 1)  # the prefill's report
    for r in reqs:
        r.num_output_tokens = 3
        each.on_progress(r, 0.53, 2)
    runs.on_decode_progress(0.53, [(3, 2, 0.5)])
    assert runs.step_time == each.step_time != 0.02
