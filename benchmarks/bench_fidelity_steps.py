"""How many generated scenarios headway's simulator and plugin decide exactly as vLLM 0.32 does.

The step-by-step differential harness of ``tests/integrations`` (vLLM's own ``Scheduler`` run
with no model in the vLLM virtualenv; scenarios from its hypothesis strategy, derandomized, so
a rerun draws the same ones), for ``fcfs`` and ``priority``; bursts unless a kind says otherwise,
and no aborts but in the last three pairs of kinds:

* ``plugin``: ``HeadwayScheduler`` against vLLM, every step (scheduled ids and token counts,
  prefix-cache hits, preemptions, finishes); prefix caching as drawn;
* ``sim``: the simulator (exact step mode, one second a step) against vLLM, per request (first
  scheduled step, finishing step, preemptions, on the clock of ``_stepdiff.sync_outcome``, where
  a ``schedule()`` that preempted and runs nothing takes a hair); prefix caching off; both with vLLM's defaults
  (``scheduler_reserve_full_isl`` on: admission checks the whole prompt's blocks);
* ``sim_no_full_isl``: the same with ``scheduler_reserve_full_isl`` off in both (admission
  checks only the first prefill chunk's blocks);
* ``sim_prefix``: as ``sim`` with prefix caching as drawn (on in about half the scenarios);
* ``sim_prefix_no_full_isl``: as ``sim_no_full_isl`` with prefix caching as drawn;
* ``plugin_staggered`` and ``sim_staggered``: the plugin (every step) and the simulator (per
  request) on a second scenario of the same kind whose requests arrive over its first 30 steps
  (the running list is then no longer in priority order), prefix caching as drawn, and some of
  whose requests stop on a stop token (as on EOS) before ``max_tokens``;
* async scheduling, against vLLM's ``AsyncScheduler`` (the next step planned while one runs):
  ``plugin_async_staggered`` (``HeadwayScheduler`` on it, every step, the staggered scenario),
  ``sim_async`` and ``sim_async_staggered`` (the simulator with ``async_scheduling``, per request
  on the clock of ``_stepdiff.async_outcome``, where a ``schedule()`` that runs nothing takes no
  time; the burst and the staggered scenario, prefix caching as drawn);
* ``sim_long_prefill``: the simulator against vLLM's ``Scheduler`` on the staggered scenario with
  chunked prefill on, a ``long_prefill_token_threshold`` of 8 to 48 tokens drawn (adaptive or not),
  prefix caching as drawn (a threshold often has two requests prefill the same blocks in one step);
* ``sim_aborts`` and ``sim_async_aborts``: the simulator against vLLM's ``Scheduler`` and
  ``AsyncScheduler`` on a third scenario like the staggered one whose clients abort some requests
  (the harness calls ``finish_requests`` before a drawn step; the simulator gives each such
  request the timeout that puts its abort there), per request (``with_running_aborted``: the
  scenarios in which vLLM's ``Scheduler`` aborted a request after it had started);
* ``sim_admission_limits`` and ``sim_async_admission_limits``: the same aborting scenario with
  vLLM's ``watermark`` (0.1 to 0.5 of its block pool) and ``max_num_active_seqs`` (1 to the
  scenario's ``max_num_seqs``) drawn, against its ``Scheduler`` and ``AsyncScheduler``
  (``with_watermark_binding``: the scenarios in which the watermark changed vLLM's decisions);
* ``sim_api_limits`` and ``sim_async_api_limits``: the same aborting scenario with its API
  server's ``max_num_queued_reqs`` (1 to 8) and ``max_num_queued_tokens`` (none, or 0 to 600)
  drawn, each arrival checked by vLLM's own ``AsyncLLM.check_admission`` over a real
  ``OutputProcessor``; per request, and which requests were turned away for which limit
  (``with_rejections``: the scenarios in which vLLM's Scheduler's run turned one away).

``staggered_with_empty_step``: the staggered scenarios in which a step of vLLM's ``Scheduler``
preempted and scheduled nothing (its first running request was its own victim), a step the
simulator, as vLLM's model runner, takes no time for.

Writes ``benchmarks/results/fidelity_steps.json`` (with the command line and the first differing
scenarios of each kind)::

    python benchmarks/bench_fidelity_steps.py [--scenarios 500] [--policies fcfs,priority]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from integrations._stepdiff import (  # the harness lives with the tests
    Outcome,
    VllmSteps,
    async_outcome,
    first_difference,
    scenarios,
    sim_outcome,
    start,
    sync_pair,
    vllm_outcome,
)

RESULTS = Path(__file__).resolve().parent / "results"


def compare(harness: VllmSteps, policy: str, n: int) -> dict[str, Any]:
    kinds = ("plugin", "sim", "sim_no_full_isl", "sim_prefix", "sim_prefix_no_full_isl", "plugin_staggered",
             "sim_staggered", "plugin_async_staggered", "sim_async", "sim_async_staggered",
             "sim_long_prefill", "sim_aborts", "sim_async_aborts", "sim_admission_limits",
             "sim_async_admission_limits", "sim_api_limits", "sim_async_api_limits")  # fmt: skip
    extra = ("with_preemptions", "with_prefix_caching", "with_running_aborted", "with_watermark_binding",
             "with_rejections", "staggered_with_empty_step")  # fmt: skip
    counts = dict.fromkeys(("scenarios", *kinds, *extra), 0)
    first: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}

    def note(kind: str, scenario: dict[str, Any], detail: Any) -> None:
        if len(first[kind]) < 3:
            first[kind].append({"scenario": scenario, "difference": detail})

    def tally_steps(kind: str, scenario: dict[str, Any], ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
        """Count a plugin comparison (every step), noting the first difference."""
        diff = first_difference(ref, got)
        counts[kind] += diff is None
        if diff is not None:
            note(kind, scenario, diff)

    def tally(
        kind: str, scenario: dict[str, Any], ref: Outcome, sim: Outcome,
        ref_rejected: dict[str, str] | None = None, sim_rejected: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Count a simulator comparison (and of the requests the API server turned away, if given),
        noting the requests that differ."""
        a: dict[str, Any] = {**ref, **{f"{r} rejected": why for r, why in (ref_rejected or {}).items()}}
        b: dict[str, Any] = {**sim, **{f"{r} rejected": why for r, why in (sim_rejected or {}).items()}}
        counts[kind] += a == b
        if a != b:
            differ = sorted(r for r in {*a, *b} if a.get(r) != b.get(r))
            note(kind, scenario, {r: {"vllm": a.get(r), "sim": b.get(r)} for r in differ})

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(
        scenario=scenarios(policy=policy, aborts=False, burst=True),
        staggered=scenarios(policy=policy, aborts=False, stops=True),
        threshold=st.sampled_from([8, 16, 32, 48]),
        adaptive=st.booleans(),
        aborting=scenarios(policy=policy, stops=True),
        watermark=st.sampled_from([0.1, 0.2, 0.35, 0.5]),
        active=st.integers(1, 6),
        queued_reqs=st.integers(1, 8),
        queued_tokens=st.one_of(st.none(), st.integers(0, 600)),
    )
    def run(
        scenario: dict[str, Any], staggered: dict[str, Any], threshold: int, adaptive: bool, aborting: dict[str, Any],
        watermark: float, active: int, queued_reqs: int, queued_tokens: int | None,
    ) -> None:  # fmt: skip
        counts["scenarios"] += 1
        mine = {"headway": {"policy": policy}}
        tally_steps(
            "plugin", scenario, harness.run(scenario, "vllm")["steps"],
            harness.run({**scenario, **mine}, "headway")["steps"],
        )  # fmt: skip
        counts["with_prefix_caching"] += scenario["prefix_caching"]
        plain = {**scenario, "prefix_caching": False}
        for kind, sc, full in (
            ("sim", plain, True),
            ("sim_no_full_isl", plain, False),
            ("sim_prefix", scenario, True),
            ("sim_prefix_no_full_isl", scenario, False),
        ):
            sc = {**sc, "reserve_full_isl": full}
            trace = harness.run(sc, "vllm")["steps"]
            if kind == "sim":
                counts["with_preemptions"] += any(s["preempted"] for s in trace)
            sim, ref_outcome = sync_pair(sc, trace)
            tally(kind, sc, ref_outcome, sim)
        trace = harness.run(staggered, "vllm")["steps"]
        tally_steps("plugin_staggered", staggered, trace, harness.run({**staggered, **mine}, "headway")["steps"])
        sim, ref_outcome = sync_pair(staggered, trace)
        tally("sim_staggered", staggered, ref_outcome, sim)
        counts["staggered_with_empty_step"] += any(s["preempted"] and not s["sched"] for s in trace)
        trace = harness.run(staggered, "vllm-async")["steps"]
        got = harness.run({**staggered, **mine}, "headway-async")["steps"]
        tally_steps("plugin_async_staggered", staggered, trace, got)
        for kind, sc in (("sim_async", scenario), ("sim_async_staggered", staggered)):
            ref_outcome, arrivals = async_outcome(
                sc, trace if sc is staggered else harness.run(sc, "vllm-async")["steps"]
            )
            tally(kind, sc, ref_outcome, sim_outcome(sc, arrivals))
        sc = {
            **staggered, "chunked_prefill": True, "long_prefill_token_threshold": threshold,
            "long_prefill_token_threshold_adaptive": adaptive,
        }  # fmt: skip
        sim, ref_outcome = sync_pair(sc, harness.run(sc, "vllm")["steps"])
        tally("sim_long_prefill", sc, ref_outcome, sim)
        sim, ref_outcome = sync_pair(aborting, harness.run(aborting, "vllm")["steps"])
        counts["with_running_aborted"] += any(done == -1 for _, done, _ in ref_outcome.values())
        tally("sim_aborts", aborting, ref_outcome, sim)
        ref_outcome, arrivals = async_outcome(aborting, harness.run(aborting, "vllm-async")["steps"])
        tally("sim_async_aborts", aborting, ref_outcome, sim_outcome(aborting, arrivals))
        sc = {**aborting, "watermark": watermark, "max_num_active_seqs": min(active, aborting["max_num_seqs"])}
        trace = harness.run(sc, "vllm")["steps"]
        sim, ref_outcome = sync_pair(sc, trace)
        unlimited = harness.run({**sc, "watermark": 0.0}, "vllm")["steps"]
        counts["with_watermark_binding"] += vllm_outcome(unlimited) != vllm_outcome(trace)
        tally("sim_admission_limits", sc, ref_outcome, sim)
        ref_outcome, arrivals = async_outcome(sc, harness.run(sc, "vllm-async")["steps"])
        tally("sim_async_admission_limits", sc, ref_outcome, sim_outcome(sc, arrivals))
        sc = {**aborting, "max_num_queued_reqs": queued_reqs, "max_num_queued_tokens": queued_tokens}
        reply = harness.run(sc, "vllm")
        counts["with_rejections"] += bool(reply["rejected"])
        rejected: dict[str, str] = {}
        sim, ref_outcome = sync_pair(sc, reply["steps"], rejected)
        tally("sim_api_limits", sc, ref_outcome, sim, reply["rejected"], rejected)
        reply = harness.run(sc, "vllm-async")
        ref_outcome, arrivals = async_outcome(sc, reply["steps"])
        rejected = {}
        tally("sim_async_api_limits", sc, ref_outcome, sim_outcome(sc, arrivals, rejected), reply["rejected"], rejected)

    run()
    return {"counts": counts, "first_differences": first}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", type=int, default=500)
    ap.add_argument("--policies", default="fcfs,priority")
    args = ap.parse_args()
    harness = start()
    if isinstance(harness, str):
        print(harness, file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        out = {p: compare(harness, p, args.scenarios) for p in args.policies.split(",")}
    finally:
        harness.close()
    report = {
        "command": "python benchmarks/bench_fidelity_steps.py " + " ".join(sys.argv[1:]),
        "outcome_fields": "per request: [first scheduled step, finishing step, preemptions], on a clock where a "
        "step takes a second and a schedule() that runs nothing takes none (async kinds) or a microsecond "
        "(sync kinds: one that preempted; _stepdiff.async_outcome and sync_outcome)",
        "wall_s": round(time.perf_counter() - t0, 1),
        "policies": out,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fidelity_steps.json").write_text(json.dumps(report, indent=1) + "\n")
    for p, r in out.items():
        print(p, json.dumps(r["counts"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
