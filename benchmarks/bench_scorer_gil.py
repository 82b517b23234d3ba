"""Scoring beside a busy event loop: the predictor in a thread of the gateway's process vs in a worker process.

The gateway scores prompts off its event loop. In a thread, the scorer still shares the GIL with the loop:
it holds it between its model's runs (tokenizing, padding, collecting scores), so while the loop is busy
(receiving a burst, relaying tokens) each batch waits for it too. ``--scorer-process`` moves the scorer
into a worker process (``headway.serve._scorer.ProcessScoreFn``).

This times batches of alpaca_eval instructions (two joined per prompt, so that no prompt repeats and the
scorer's cache never answers; cut to ``--max-length`` tokens) with the scorer in a thread and in a
worker process, on an idle process and beside a thread that runs Python without pause (standing in for
a busy event loop). Rounds alternate the placements, so drift in the machine's speed hits both alike.

    python benchmarks/bench_scorer_gil.py --out benchmarks/results/scorer_gil.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

from headway._files import write_atomic
from headway.predict._paths import default_data_dir


def _prompts(data_dir: Path, n: int, seed: int) -> list[str]:
    import json

    path = data_dir / "alpaca_eval" / "instructions.jsonl"
    with path.open(encoding="utf-8") as fh:
        texts = [json.loads(line)["instruction"] for line in fh if line.strip()]
    rng = random.Random(seed)
    return [f"{rng.choice(texts)}\n{rng.choice(texts)}" for _ in range(n)]


class _Spinner:
    """A thread running Python without pause (it holds the GIL for its switch interval at a time)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        x = 0
        while not self._stop.is_set():
            for i in range(1000):
                x += i * i

    def __enter__(self) -> _Spinner:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scorer", default="default:onnx-int8", help="gateway --scorer spec (default default:onnx-int8)")
    ap.add_argument("--max-length", type=int, default=64, help="prompt tokens scored (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="scorer threads (default 2)")
    ap.add_argument("--sizes", default="5,32", help="comma list of batch sizes (default 5,32)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds; each times every batch size once per case")
    ap.add_argument("--data-dir", help="shared data (default $HEADWAY_DATA_DIR or ../shared/data)")
    ap.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = ap.parse_args(argv)
    from headway.serve._scorer import ProcessScoreFn, load_score_fn

    sizes = [int(s) for s in args.sizes.split(",") if s]
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    per_round = 2 * 2 * sum(sizes)  # (idle, busy) x (thread, process)
    prompts = iter(_prompts(data_dir, per_round * (args.rounds + 1), seed=0))
    opts = {"threads": args.threads, "max_length": args.max_length}
    in_thread = load_score_fn(args.scorer, **opts)
    in_proc = ProcessScoreFn(args.scorer, **opts)
    placements = {"thread": in_thread, "process": in_proc}
    times: dict[tuple[str, str, int], list[float]] = {}
    try:
        for rnd in range(args.rounds + 1):  # round 0 warms both up, unrecorded
            order = list(placements.items()) if rnd % 2 else list(placements.items())[::-1]
            for loop in ("idle", "busy"):
                with _Spinner() if loop == "busy" else contextlib.nullcontext():
                    for name, fn in order:
                        for n in sizes:
                            batch = [next(prompts) for _ in range(n)]
                            t0 = time.perf_counter()
                            fn(batch)
                            if rnd:
                                times.setdefault((loop, name, n), []).append((time.perf_counter() - t0) * 1e3)
            print(f"round {rnd} done", file=sys.stderr)
    finally:
        in_proc.close()
    lines = [
        "# The scorer beside a busy event loop: in a thread vs in a worker process",
        "",
        f"`python benchmarks/bench_scorer_gil.py {shlex.join(argv if argv is not None else sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} ({platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}); scorer `{args.scorer}`, "
        f"{args.threads} threads, prompts cut to {args.max_length} tokens. Median ms per batch over "
        f"{args.rounds} rounds (min-max):",
        "",
        "| process | batch | scorer in a thread | in a worker process | thread / process |",
        "|---|---:|---:|---:|---:|",
    ]
    for loop in ("idle", "busy"):
        for n in sizes:
            t, p = times[(loop, "thread", n)], times[(loop, "process", n)]
            what = "idle" if loop == "idle" else "a thread spinning in Python"
            lines.append(
                f"| {what} | {n} | {statistics.median(t):.1f} ({min(t):.0f}-{max(t):.0f}) | "
                f"{statistics.median(p):.1f} ({min(p):.0f}-{max(p):.0f}) | "
                f"{statistics.median(t) / statistics.median(p):.2f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "bench_scorer_gil"))
