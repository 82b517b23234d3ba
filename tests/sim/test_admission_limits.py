"""vLLM's admission limits (``SchedulerConfig``): ``watermark``, the share of the KV cache a waiting
request must leave free while another request runs, and ``max_num_active_seqs``, the running set's
size below ``max_num_seqs`` (the engine's scheduler: ``tests/integrations/test_sim_vs_vllm.py``
checks both against vLLM's); ``max_num_queued_reqs`` and ``max_num_queued_tokens``, its API
server's rejections of arriving requests (HTTP 503), which never reach the scheduler.

Hand-computed with a unit cost model (every step takes 1 s).
"""

from __future__ import annotations

import pytest

from factories import make_request, make_workload, unit_cost
from headway.core import Request, RequestState
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.sim._calibrate import engine_configs
from headway.workload import RequestSpec, Workload


def _first_tokens(rows: list[tuple[float, int, int]], blocks: int = 9, **cfg: object) -> list[float]:
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, **cfg)  # type: ignore[arg-type]
    cache = CacheConfig(block_size=16, num_gpu_blocks=blocks)
    res = simulate(make_workload(rows), "fcfs", preset=unit_cost(1.0), scheduler=sched, cache=cache)
    return [r.first_token_time for r in res.requests]  # type: ignore[misc]


def test_a_watermark_keeps_blocks_free_while_another_request_runs() -> None:
    # 9 blocks (vLLM's pool: 10 with its null block); watermark 0.2: int(0.2 * 10) = 2 blocks. A (64
    # tokens: 4 blocks) is admitted with nothing running, which the watermark does not hold back; B
    # (4 blocks) would leave 1 free, under the watermark's 2: it waits until A is done (a first
    # token at 1, four more by 5), where without a watermark both start at once.
    both = [(0.0, 64, 5), (0.0, 64, 1)]
    assert _first_tokens(both) == pytest.approx([1.0, 1.0])
    assert _first_tokens(both, watermark=0.2) == pytest.approx([1.0, 6.0])
    # 3 blocks (48 tokens) leave 2 free: admitted beside A
    assert _first_tokens([(0.0, 64, 5), (0.0, 48, 1)], watermark=0.2) == pytest.approx([1.0, 1.0])
    # alone, a request may use every block whatever the watermark (8 of 9, 3 held back)
    assert _first_tokens([(0.0, 128, 2)], watermark=0.35) == pytest.approx([1.0])


def test_max_num_active_seqs_bounds_the_running_set() -> None:
    # three 16-token prompts, two tokens each: one at a time (each done a step after its first token)
    rows = [(0.0, 16, 2)] * 3
    assert _first_tokens(rows, blocks=64) == pytest.approx([1.0, 1.0, 1.0])
    assert _first_tokens(rows, blocks=64, max_num_active_seqs=1) == pytest.approx([1.0, 3.0, 5.0])
    assert _first_tokens(rows, blocks=64, max_num_active_seqs=2) == pytest.approx([1.0, 1.0, 3.0])


def test_admission_limits_are_validated_and_carried_from_a_step_log() -> None:
    with pytest.raises(ValueError, match="max_num_active_seqs must be between 1 and max_num_seqs"):
        SchedulerConfig(max_num_seqs=4, max_num_active_seqs=5)
    with pytest.raises(ValueError, match="watermark must be in"):
        SchedulerConfig(watermark=1.0)
    assert SchedulerConfig(max_num_seqs=8).active_seqs == 8
    assert SchedulerConfig(max_num_seqs=8, max_num_active_seqs=3).active_seqs == 3
    meta = {"max_num_batched_tokens": 256, "max_num_seqs": 8, "block_size": 16, "num_gpu_blocks": 100}
    sched = engine_configs({**meta, "max_num_active_seqs": 3, "watermark": 0.05})[0]
    assert (sched.max_num_active_seqs, sched.watermark) == (3, 0.05)
    plain, cache = engine_configs({**meta, "max_num_active_seqs": None})
    assert (plain.max_num_active_seqs, plain.watermark) == (None, 0.0)
    assert cache.num_gpu_blocks == 99  # vLLM's pool of 100 holds its null block


def _outcomes(specs: list[RequestSpec], **cfg: object) -> list[str]:
    """Each request's fate: its first token's time, or why it was turned away."""
    sched = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256, **cfg)  # type: ignore[arg-type]
    res = simulate(Workload.from_specs("t", specs), "fcfs", preset=unit_cost(1.0), scheduler=sched)
    return [_fate(r) for r in res.requests]


def _fate(r: Request) -> str:
    if r.state is RequestState.ABORTED:
        return str(r.extra["abort_reason"])
    return f"{r.first_token_time:g}"


def test_max_num_queued_reqs_rejects_arrivals_while_that_many_are_unfinished() -> None:
    # one running at a time; A (done at 2) and B are unfinished when C and D arrive; E arrives after A
    specs = [RequestSpec(r, t, 16, 2) for r, t in (("A", 0.0), ("B", 0.0), ("C", 0.0), ("D", 0.5), ("E", 2.5))]
    full = "rejected: max_num_queued_reqs"
    assert _outcomes(specs, max_num_queued_reqs=2) == ["1", "3", full, full, "5"]
    assert _outcomes(specs) == ["1", "3", "5", "7", "9"]
    assert _outcomes(specs, max_num_queued_reqs=0) == [full] * 5  # vLLM's 0: nothing gets in


def test_max_num_queued_tokens_counts_prompts_until_their_first_token() -> None:
    # one running at a time. A (60 tokens) and B (60) are let in (0, then 60 queued); C is not (120 >=
    # 100); D comes at 1.5, after A's first token (60 queued: B's), and E at 2.5 with 70 (B's and D's)
    specs = [
        RequestSpec("A", 0.0, 60, 2), RequestSpec("B", 0.0, 60, 2), RequestSpec("C", 0.0, 10, 2),
        RequestSpec("D", 1.5, 10, 2), RequestSpec("E", 2.5, 90, 2),
    ]  # fmt: skip
    over = "rejected: max_num_queued_tokens"
    assert _outcomes(specs, max_num_queued_tokens=100) == ["1", "3", over, "5", "7"]
    # the check is queued >= limit, the arriving prompt not counted: at 10, B (60 queued) and C are
    # turned away, D gets in (A has its first token), and E (D's 10 queued) is turned away; at 11 E
    # gets in
    assert _outcomes(specs, max_num_queued_tokens=10) == ["1", over, over, "3", over]
    assert _outcomes(specs, max_num_queued_tokens=11) == ["1", over, over, "3", "5"]


def test_a_running_request_stops_counting_when_its_client_aborts_not_when_the_engine_takes_it() -> None:
    # vLLM's API server forgets an aborted request at once (its output processor's abort_requests),
    # while the engine takes the abort only at its step's end. A's 200-token prompt is a 4-step
    # prefill (64-token budget); its client gives up at 1.5, mid-step; B arrives at 1.7, before that
    # step ends at 2: with A still counted it would be turned away by both limits
    specs = [RequestSpec("A", 0.0, 200, 3, timeout=1.5), RequestSpec("B", 1.7, 10, 1)]
    for limits in ({"max_num_queued_reqs": 1}, {"max_num_queued_tokens": 100}):
        sched = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, **limits)  # type: ignore[arg-type]
        res = simulate(Workload.from_specs("t", specs), "fcfs", preset=unit_cost(1.0), scheduler=sched)
        a, b = res.requests
        assert (_fate(a), a.finish_time) == ("client timeout", 2.0)  # the engine took it at the step's end
        assert _fate(b) == "3"  # admitted: scheduled at 2, its first token at 3


def test_a_request_its_client_abandoned_stops_counting_against_the_token_limit() -> None:
    # A runs (its first token at 1); B waits (one slot) and its client gives up at 0.5; C arrives at
    # 0.7 with A's 10 tokens queued, not A's and B's 105
    specs = [
        RequestSpec("A", 0.0, 10, 5), RequestSpec("B", 0.0, 95, 2, timeout=0.5), RequestSpec("C", 0.7, 10, 1),
    ]  # fmt: skip
    assert _outcomes(specs, max_num_queued_tokens=100) == ["1", "client timeout", "6"]
    with pytest.raises(ValueError, match="max_num_queued_tokens must be >= 0"):
        SchedulerConfig(max_num_queued_tokens=-1)


def test_a_fleet_routes_a_request_one_replica_turns_away_to_another() -> None:
    # two replicas, one slot each, round robin, max_num_queued_reqs 1. A (long) goes to replica 0, B
    # (short, done at 2) to replica 1; C at 3 is routed to replica 0, which is full (A runs until 20):
    # as a load balancer retries vLLM's 503 elsewhere, it goes to replica 1. D, also at 3, finds both
    # full and is turned away (by the last replica tried)
    specs = [
        RequestSpec("A", 0.0, 16, 20), RequestSpec("B", 0.0, 16, 2), RequestSpec("C", 3.0, 16, 2),
        RequestSpec("D", 3.0, 16, 2),
    ]  # fmt: skip
    sched = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256, max_num_queued_reqs=1)
    res = simulate(
        Workload.from_specs("t", specs), "fcfs", preset=unit_cost(1.0), scheduler=sched, num_replicas=2,
        router="round-robin",
    )  # fmt: skip
    assert [_fate(r) for r in res.requests] == ["1", "1", "4", "rejected: max_num_queued_reqs"]
    assert res.assignment == (0, 1, 1, 1)


def test_the_server_checks_an_arrival_before_it_learns_the_output_held_back() -> None:
    # async scheduling: an arrival at a step's end is checked before the server learns that step's
    # output (vLLM's front end), which the engine has processed (the simulator ends the step first):
    # its counts are held back, then learnt in order; an abort meanwhile counts the prompt it held
    from headway.sim._api_server import ApiServerLimits

    a, b = make_request("a", prompt=6), make_request("b", prompt=3)
    api = ApiServerLimits(2, 5)
    api.admitted(a)
    api.hold(1)
    a.first_token_time = 1.0  # the engine's output: a's first token
    api.first_token(a)
    assert api.check(0) == "rejected: max_num_queued_tokens"  # a's prompt still queued for the server
    api.release()
    assert api.queued_tokens == 0 and api.check(0) is None
    api.admitted(b)
    api.hold(2)
    b.first_token_time = 2.0
    api.first_token(b)
    api.finished(a)
    assert api.check(0) == "rejected: max_num_queued_reqs"  # a, b unfinished as the server knows them
    api.client_left(b)  # its client gives up now: the server forgets b's prompt, queued as it knows
    assert api.queued_tokens == 0 and api.check(0) is None
    api.release()
    assert api.queued_tokens == 0 and api.dropped == {b} and api.held is None  # (its prompt counted off once)
    api.engine_took_abort(b)
    assert api.queued_tokens == 0 and not api.dropped
