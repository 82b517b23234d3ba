"""Simulator speed: simulated requests per wall-clock second on the Azure conv trace.

    python benchmarks/bench_simulator.py [--num-requests N] [--repeat K]

Runs headway's simulator (FCFS and oracle SJF; fast-forward and exact step-by-step
mode) on ``splitwise_conv.csv`` (19,366 requests, Llama-3-8B on A100 preset). When
``VIDUR_PATH`` names a microsoft/vidur checkout and ``VIDUR_PYTHON`` its interpreter
(a virtualenv with Vidur's requirements), the same script runs Vidur's event loop on
the same requests (Llama-3-8B, A100, Sarathi) through ``benchmarks/vidur_runner.py``
and reports the ratio. Times are the event loops only (workload building and Vidur's
execution-time-model training excluded), best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from headway.sim import SchedulerConfig, simulate
from headway.workload import Workload, read_vidur_trace

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("HEADWAY_DATA_DIR", HERE.parent.parent / "shared" / "data"))


def bench(workload: Workload, policy: str, exact: bool, repeat: int) -> dict[str, float]:
    sched = SchedulerConfig(max_steps_per_event=1) if exact else SchedulerConfig()
    best = None
    for _ in range(repeat):
        res = simulate(workload, policy, scheduler=sched)
        if best is None or res.wall_time < best.wall_time:
            best = res
    assert best is not None
    return {
        "wall_s": best.wall_time,
        "requests_per_s": len(workload) / best.wall_time,
        "events_per_s": best.num_events / best.wall_time,
        "num_events": best.num_events,
        "num_steps": best.num_steps,
    }


def run_vidur(num_requests: int) -> dict[str, float] | None:
    path, python = os.environ.get("VIDUR_PATH"), os.environ.get("VIDUR_PYTHON")
    if not path or not python:
        return None
    cmd = [python, str(HERE / "vidur_runner.py"), "--vidur-path", path, "--num-requests", str(num_requests),
           "--trace", str(DATA / "vidur_traces" / "splitwise_conv.csv")]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    data: dict[str, float] = json.loads(line)
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, nargs="+", default=[1000, 19366])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    trace = DATA / "vidur_traces" / "splitwise_conv.csv"
    print(f"trace {trace}")
    print(f"{'N':>6} {'policy':12} {'mode':6} {'wall s':>8} {'req/s':>10} {'events/s':>10} {'steps':>8}")
    for n in args.num_requests:
        wl = read_vidur_trace(trace, limit=n)
        rows = {}
        for policy in ("fcfs", "sjf-oracle"):
            for exact in (False, True):
                r = bench(wl, policy, exact, args.repeat)
                rows[(policy, exact)] = r
                print(f"{n:>6} {policy:12} {'exact' if exact else 'fast':6} {r['wall_s']:8.3f} "
                      f"{r['requests_per_s']:10,.0f} {r['events_per_s']:10,.0f} {r['num_steps']:8}")
        fast, exact_r = rows[("fcfs", False)], rows[("fcfs", True)]
        print(f"       fast-forward vs exact (fcfs): {exact_r['wall_s'] / fast['wall_s']:.2f}x")
        vidur = run_vidur(n)
        if vidur is None:
            print("       (set VIDUR_PATH and VIDUR_PYTHON to run Vidur side by side)")
            continue
        print(f"{n:>6} {'vidur-sarathi':12} {'':6} {vidur['run_seconds']:8.3f} "
              f"{vidur['requests_per_second']:10,.0f} {vidur['events_per_second']:10,.0f}")
        for policy in ("fcfs", "sjf-oracle"):
            ratio = rows[(policy, False)]["requests_per_s"] / vidur["requests_per_second"]
            print(f"       headway {policy} / Vidur: {ratio:,.0f}x simulated requests per wall second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
