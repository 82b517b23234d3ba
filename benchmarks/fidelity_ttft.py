"""Where the simulator's TTFT error comes from, per measured replay of a ``bench_fidelity.py --workdir`` run.

A request's engine-side TTFT is the wait for a batch slot (only when all ``max_num_seqs`` slots are taken)
plus the time from its first schedule to its first token. For each measured replay, this re-fits the preset
from the run's measured probe (as the run did), scales it by the replay's own speed (the diagnostic of
``bench_fidelity.py``'s second table, so the engine's drift is factored out), simulates the replay, and
prints, real and simulated:

- the share of requests that waited for a slot (first scheduled more than ``--wait-ms`` after the
  scheduler first saw them; one engine step is longer than that) and their mean wait;
- the mean time from the first schedule to the first token;
- mean and P90 TTFT.

    python benchmarks/fidelity_ttft.py DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from headway.integrations._client import ReplaySpec
from headway.integrations._probe import (
    calibrate_step_log,
    fidelity_max_prompt,
    fidelity_workload,
    simulated_requests,
)
from headway.sim._calibrate import percentile, scaled, speed_factor, step_samples
from headway.sim._cost import CostModel


def segments(lines: list[str], start: int) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """(policy, steps, request records) per policy segment from line ``start`` on."""
    segs: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    for line in lines[start:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("type") == "policy":
            segs.append((str(row["policy"]), [], []))
        elif segs and row.get("type") == "request":
            segs[-1][2].append(row)
        elif segs and "step" in row:
            segs[-1][1].append(row)
    return segs


def load_run(workdir: Path) -> tuple[dict[str, Any], list[str], dict[str, Any], CostModel, list[ReplaySpec]]:
    """A ``bench_fidelity.py --workdir``'s run.json, step-log lines and header, the preset as the run
    fitted it (on the measured probe, the log as it was then), and the replayed workload."""
    run = json.loads((workdir / "run.json").read_text())
    n0, n1 = run["probe_lines"]
    lines = (workdir / "steps.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    with tempfile.TemporaryDirectory() as tmp:
        upto = Path(tmp) / "steps.jsonl"
        upto.write_text("\n".join(lines[:n1]) + "\n", encoding="utf-8")
        fit, _ = calibrate_step_log(upto, n0, "probe")
    max_prompt = fidelity_max_prompt(int(header["max_model_len"]))
    specs = fidelity_workload(run["num_requests"], run["rate"], seed=run["seed"], max_prompt=max_prompt)
    return run, lines, header, fit.model, specs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path, help="a bench_fidelity.py --workdir (steps.jsonl and run.json)")
    ap.add_argument("--wait-ms", type=float, default=2.0, help="a longer wait counts as waiting for a slot")
    args = ap.parse_args()
    log, meta = args.workdir / "steps.jsonl", args.workdir / "run.json"
    if not log.is_file() or not meta.is_file():
        ap.error(f"{args.workdir}: needs steps.jsonl and run.json from bench_fidelity.py --workdir")
    run, lines, header, preset, specs = load_run(args.workdir)
    print(f"preset fitted on the measured probe: {preset.describe()}\n")
    wait_s = args.wait_ms / 1e3
    print(
        "| policy | speed | waited for a slot, real / sim | their mean wait (ms), real / sim "
        "| first schedule to first token (ms), real / sim | mean TTFT (ms), real / sim | P90 TTFT (ms), real / sim |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for policy, steps, reqs in segments(lines, run["probe_lines"][1]):
        by = {r.get("client_id"): r for r in reqs}
        if any(s.request_id not in by for s in specs):
            continue  # a speed check, or a segment of another workload
        eng = [by[s.request_id] for s in specs]
        added = [float(e["added"]) for e in eng]
        speed = speed_factor(preset, step_samples(steps))
        sim = simulated_requests(added, specs, policy, scaled(preset, speed), header)
        real_wait = [float(e["scheduled"]) - float(e["added"]) for e in eng]
        real_first = [float(e["first_token"]) - float(e["scheduled"]) for e in eng]
        real_ttft = [float(e["first_token"]) - float(e["added"]) for e in eng]
        sim_wait, sim_first, sim_ttft = [], [], []
        for r in sim:
            assert r.queued_time is not None and r.first_scheduled_time is not None and r.first_token_time is not None
            sim_wait.append(r.first_scheduled_time - r.queued_time)
            sim_first.append(r.first_token_time - r.first_scheduled_time)
            sim_ttft.append(r.first_token_time - r.queued_time)
        cells = []
        rw, sw = [w for w in real_wait if w > wait_s], [w for w in sim_wait if w > wait_s]
        cells.append(f"{len(rw) / len(eng):.1%} / {len(sw) / len(sim):.1%}")
        cells.append(f"{_ms(rw)} / {_ms(sw)}")
        cells.append(f"{_ms(real_first)} / {_ms(sim_first)}")
        cells.append(f"{_ms(real_ttft)} / {_ms(sim_ttft)}")
        cells.append(f"{percentile(real_ttft, 90) * 1e3:.1f} / {percentile(sim_ttft, 90) * 1e3:.1f}")
        print(f"| {policy} | x{speed:.2f} | " + " | ".join(cells) + " |")
    return 0


def _ms(xs: list[float]) -> str:
    return f"{statistics.fmean(xs) * 1e3:.1f}" if xs else "-"


if __name__ == "__main__":
    sys.exit(main())
