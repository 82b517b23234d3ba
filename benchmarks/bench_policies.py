"""Policy decision cost: enqueue + pick next at 100, 1,000 and 10,000 waiting requests.

    python benchmarks/bench_policies.py [--sizes 100 1000 10000] [--ops 5000] [--out FILE.md]

For each policy a :class:`~headway.core.PolicyQueue` is filled with ``n`` waiting
requests, then ``ops`` decisions are timed at that steady size; one decision is
``on_arrival`` + ``add`` of a new request and ``pop`` of the best one (O(log n) heap
operations; keys are computed once per add and cached); the popped request is marked running, as
an engine starts it. Scores are precomputed
(``request.score``), as a gateway does when it batch-scores arrivals; oracle policies
get an O(1) length lookup. Target: <= 10 us per decision at 10,000 waiting.

No policy re-sorts the queue on a clock: PARS/LTR starvation promotions are a single
timer re-key per request (``rekey_at_time``), aging is keyed as ``tier + rate x
arrival`` and Boost keys as boosted arrival times (time-invariant), attained-work keys
change only at announced token thresholds, and the global re-keys of gamma-Ada and
rank-boost (``key_epoch``: O(n) heapify) are rate-limited to one per 100 / 50 finishes;
that amortized cost is measured separately below ("epoch re-key").
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import numpy as np

from headway._files import write_atomic
from headway.core import PolicyQueue, Request, RequestState, Tier, available_policies, make_policy

KWARGS: dict[str, dict[str, object]] = {}

RESORTING = (
    "No policy re-sorts the queue on a clock. PARS and LTR starvation promotions are one timer "
    "re-key per request (`rekey_at_time`); tenant-aging is keyed as `tier + rate x arrival` and the "
    "Boost family as boosted arrival times, both time-invariant; attained-work keys (UniBoost, "
    "MemGuard) change only at announced token thresholds (`rekey_after_tokens`). Only gamma-Ada "
    "(`uniboost`) and rank-boost change every key at once (`key_epoch`: one O(n) heapify, last "
    "column), rate-limited to one per 100 / 50 finishes and, for gamma-Ada, only when gamma moves "
    "by more than 5 %."
)


def _requests(n: int, seed: int = 0) -> tuple[list[Request], dict[Request, int]]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(5.0, 1.0, n).astype(int), 1)
    reqs = []
    for i in range(n):
        reqs.append(
            Request(
                request_id=f"b{i}",
                arrival_time=i * 1e-3,
                num_prompt_tokens=int(rng.integers(16, 2048)),
                max_tokens=8192,
                tier=Tier(i % 3),
                score=float(np.log(lens[i]) + rng.normal()),
                prompt="Summarize this" if i % 4 == 0 else "What is up?",
                seq=i,
            )
        )
    return reqs, {r: int(x) for r, x in zip(reqs, lens, strict=True)}


def bench(name: str, n: int, ops: int) -> tuple[float, float]:
    reqs, truth = _requests(n + ops)
    pol = make_policy(name, **KWARGS.get(name, {}))
    if pol.oracle:
        pol.bind_oracle(truth.__getitem__)
    q = PolicyQueue(pol)
    for r in reqs[:n]:
        pol.on_arrival(r, r.arrival_time)
        q.add(r, r.arrival_time)
    new = reqs[n:]
    gc.disable()
    t0 = time.perf_counter()
    running = RequestState.RUNNING
    for r in new:
        now = r.arrival_time
        pol.on_arrival(r, now)
        q.add(r, now)
        q.pop().state = running  # started, as an engine would (bands keeps only waiting requests in its flows)
    dt = (time.perf_counter() - t0) / ops
    # cost of one global re-key (key_epoch bump), for the policies that do it
    pol.key_epoch += 1
    t1 = time.perf_counter()
    q.refresh(new[-1].arrival_time)
    epoch = time.perf_counter() - t1
    gc.enable()
    return dt * 1e6, epoch * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3, help="report the median of this many runs")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    names = available_policies()
    lines = [
        "| policy | "
        + " | ".join(f"us/decision @ {n:,}" for n in args.sizes)
        + f" | epoch re-key @ {args.sizes[-1]:,} (ms) |",
        "|---|" + "---|" * (len(args.sizes) + 1),
    ]
    for name in names:
        cells, epoch = [], 0.0
        for n in args.sizes:
            runs = [bench(name, n, args.ops) for _ in range(args.repeat)]
            us = statistics.median(r[0] for r in runs)
            epoch = statistics.median(r[1] for r in runs)
            cells.append(f"{us:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {epoch:.1f} |")
        print(lines[-1], flush=True)
    worst = max(float(line.split("|")[-3]) for line in lines[2:])
    load_after = os.getloadavg()[0]
    print(
        f"slowest policy at {args.sizes[-1]:,}: {worst:.2f} us/decision; "
        f"load average {load_before:.2f} -> {load_after:.2f}"
    )
    if args.out:
        header = (
            "# Policy decision cost\n\n"
            "Command: `python benchmarks/bench_policies.py "
            f"--ops {args.ops} --repeat {args.repeat} --out {args.out}`\n\n"
            "Microseconds per decision (on_arrival + PolicyQueue.add of a new request + pop of the best, then marked "
            "running as an engine starts it) at a steady queue of n waiting requests, scores precomputed, median of "
            f"{args.repeat} runs; last column: one O(n) re-key after a key_epoch bump. "
            f"1-minute load average {load_before:.2f} before and {load_after:.2f} after the run "
            f"(2-core machine). Slowest policy at {args.sizes[-1]:,} waiting: {worst:.2f} us (target <= 10 us).\n\n"
            f"{RESORTING}\n\n"
        )
        write_atomic(args.out, header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(lambda: main() or 0, "bench_policies"))
