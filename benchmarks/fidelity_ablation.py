"""The cost model's frontend terms on and off, over the step log of one fidelity run.

Re-fits the calibration probe of a ``bench_fidelity.py --workdir DIR`` run two ways and replays
every measured policy segment in the simulator with each:

- ``now``: as the simulator works today: a cost per request arriving during a step
  (``per_arrival``), latencies counted from when the scheduler first saw each request
  (``queued_time``; vLLM's engine core adds requests between steps);
- ``before``: no arrival term, latencies counted from the arrival.

The real measurements are the same for both, so the difference is the model's alone (a new
server run moves the engine's speed by several percent, see ``fidelity_vllm_cpu.md``). The
probe's lines, the rate and the workload seed come from the ``run.json`` the benchmark leaves
in ``DIR``.

    python benchmarks/fidelity_ablation.py DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from headway.integrations._probe import fidelity_max_prompt, fidelity_workload, simulate_replay
from headway.sim._calibrate import StepLog, fit_from_step_log, percentile, relative_error

METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90")


def split(
    path: Path, probe_lines: tuple[int, int]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple[str, list[dict[str, Any]]]]]:
    """Header, the measured probe's steps, and (policy, request records) per replay segment."""
    header: dict[str, Any] = {}
    probe: list[dict[str, Any]] = []
    segs: list[tuple[str, list[dict[str, Any]]]] = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = row.get("type")
        if kind == "header":
            header = header or row
        elif kind == "policy":
            segs.append((str(row["policy"]), []))
        elif kind == "request" and segs:
            segs[-1][1].append(row)
        elif "step" in row and probe_lines[0] <= i < probe_lines[1]:
            probe.append(row)
    return header, probe, segs


def stats(ttft: list[float], e2e: list[float]) -> dict[str, float]:
    return {
        "e2e_mean": statistics.fmean(e2e), "e2e_p90": percentile(e2e, 90),
        "ttft_mean": statistics.fmean(ttft), "ttft_p90": percentile(ttft, 90),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path, help="a bench_fidelity.py --workdir (steps.jsonl and run.json)")
    args = ap.parse_args()
    log, meta = args.workdir / "steps.jsonl", args.workdir / "run.json"
    if not log.is_file() or not meta.is_file():
        ap.error(f"{args.workdir}: needs steps.jsonl and run.json from bench_fidelity.py --workdir")
    run = json.loads(meta.read_text())
    header, probe, segs = split(log, tuple(run["probe_lines"]))
    if not header or not probe or not segs:
        ap.error(f"{log}: needs a header, probe steps and at least one policy segment")
    without = [{**s, "arrivals": 0} for s in probe]
    now, _ = fit_from_step_log(StepLog(header, probe, []), "now")
    before, _ = fit_from_step_log(StepLog(header, without, []), "before")
    print(f"now:    {now.model.describe()}")
    print(f"before: {before.model.describe()}\n")
    max_prompt = fidelity_max_prompt(int(header["max_model_len"]))
    specs = fidelity_workload(run["num_requests"], run["rate"], seed=run["seed"], max_prompt=max_prompt)
    print("| policy | model | " + " | ".join(f"{m} err" for m in METRICS) + " |")
    print("|---|---|" + "---:|" * len(METRICS))
    for policy, reqs in segs:
        by = {r.get("client_id"): r for r in reqs}
        if any(s.request_id not in by for s in specs):
            print(f"| {policy} | (segment lacks the workload's requests; wrong --rate/--num-requests?) |")
            continue
        eng = [by[s.request_id] for s in specs]
        added = [float(e["added"]) for e in eng]
        real = stats([e["first_token"] - e["added"] for e in eng], [e["finish"] - e["added"] for e in eng])
        for label, fit, from_arrival in (("before", before, True), ("now", now, False)):
            sim = simulate_replay(added, specs, policy, fit.model, header, from_arrival=from_arrival)
            st = stats([t for t, _ in sim], [e for _, e in sim])
            cells = " | ".join(f"{relative_error(st[m], real[m]):+.1%}" for m in METRICS)
            print(f"| {policy} | {label} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
