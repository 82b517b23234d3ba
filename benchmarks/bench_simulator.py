"""Simulator speed: simulated requests per wall-clock second on the Azure conv trace.

    python benchmarks/bench_simulator.py [--num-requests N] [--repeat K] [--policies P ...] [--rounds R] [--out F]

Runs headway's simulator (FCFS and oracle SJF in fast-forward and exact step-by-step
mode, FCFS also without prefix caching; the ``--policies`` given, preemptive ones in their
declared displacement mode, fast-forward) on ``splitwise_conv.csv`` (19,366 requests,
Llama-3-8B on A100 preset). Prefix caching is on (vLLM's default) unless a row says
``no-apc``; the trace has no block hashes, so it costs bookkeeping and finds only evicted
requests' own blocks. When
``VIDUR_PATH`` names a microsoft/vidur checkout and ``VIDUR_PYTHON`` its interpreter
(a virtualenv with Vidur's requirements), the same script runs Vidur's event loop on
the same requests (Llama-3-8B, A100, Sarathi) through ``benchmarks/vidur_runner.py``
(extra runner flags in ``VIDUR_ARGS``, e.g. ``--quick-train --cache-dir DIR``) and reports
the ratio; ``--rounds R`` adds R rounds that alternate the two (headway FCFS, then one Vidur
process) with each round's ratio, since a shared machine's speed drifts within minutes. Times are
the event loops only (workload building and Vidur's
execution-time-model training excluded), best of ``--repeat``; the ratio is computed on
CPU seconds as well as wall seconds, since CPU time is steadier on a shared machine.
Both sides should run on one Python installation (``VIDUR_PYTHON`` a virtualenv over the
interpreter that runs this script): builds of the same version differ in speed, and not alike
for both simulators, so each side's interpreter is printed and a mismatch is flagged.
``--out`` also writes what it printed to a Markdown file, with the command (Vidur's paths
elided), the machine and Vidur's setup (``benchmarks/results/simulator.md``, overwritten).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from headway._files import write_atomic
from headway.policies import noisy_oracle_defaults
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import Workload, read_vidur_trace

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("HEADWAY_DATA_DIR", HERE.parent.parent / "shared" / "data"))


def bench(workload: Workload, policy: str, exact: bool, repeat: int, apc: bool = True) -> dict[str, float]:
    sched = SchedulerConfig(max_steps_per_event=1) if exact else SchedulerConfig()
    kwargs = noisy_oracle_defaults(policy, None, tau=0.75, seed=0)
    best = None
    for _ in range(repeat):
        res = simulate(
            workload, policy, scheduler=sched, cache=CacheConfig(enable_prefix_caching=apc), policy_kwargs=kwargs
        )
        if best is None or res.wall_time < best.wall_time:
            best = res
    assert best is not None
    return {
        "wall_s": best.wall_time,
        "cpu_s": best.cpu_time,
        "requests_per_cpu_s": len(workload) / best.cpu_time,
        "requests_per_s": len(workload) / best.wall_time,
        "events_per_s": best.num_events / best.wall_time,
        "num_events": best.num_events,
        "num_steps": best.num_steps,
    }


def long_output_workload(n: int = 2000, seed: int = 0) -> Workload:
    """Reasoning-style outputs (lognormal, median 600 tokens, capped at 16k), 500-token prompts,
    Poisson at 3 requests/s: decode stretches are long, so the closed-form fast-forward matters."""
    import numpy as np

    from headway.workload import RequestSpec

    rng = np.random.default_rng(seed)
    outs = np.clip(rng.lognormal(np.log(600), 1.0, n), 1, 16000).astype(int)
    times = np.cumsum(rng.exponential(1 / 3.0, n))
    specs = [RequestSpec(str(i), float(times[i]), 500, int(outs[i]), max_tokens=16384) for i in range(n)]
    return Workload.from_specs("long-output", specs)


def run_vidur(num_requests: int, *extra: str) -> dict[str, float] | None:
    """Vidur on the first ``num_requests`` (``extra`` runner flags after ``VIDUR_ARGS``, so they win)."""
    path, python = os.environ.get("VIDUR_PATH"), os.environ.get("VIDUR_PYTHON")
    if not path or not python:
        return None
    cmd = [
        python,
        str(HERE / "vidur_runner.py"),
        "--vidur-path",
        path,
        "--num-requests",
        str(num_requests),
        "--trace",
        str(DATA / "vidur_traces" / "splitwise_conv.csv"),
        *shlex.split(os.environ.get("VIDUR_ARGS", "")),
        *extra,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    data: dict[str, float] = json.loads(line)
    return data


def vidur_cpu_seconds(result: dict[str, float]) -> float:
    """Vidur's event loop in CPU seconds (wall seconds from a runner that did not report them)."""
    return float(result.get("run_cpu_seconds", result["run_seconds"]))


def interpreter() -> str:
    """This process's Python: version and installation (a virtualenv's base)."""
    return f"{platform.python_version()} ({sys.base_prefix})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, nargs="+", default=[1000, 19366])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", nargs="*", default=["srpt-oracle", "trail-oracle", "trail", "ltr", "uniboost-base"])
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="with Vidur: also this many interleaved rounds (headway FCFS best of --repeat, then one Vidur "
        "process) and each round's ratio, so the spread shows how far the machine moved (default: none)",
    )
    ap.add_argument("--out", type=Path, help="also write the report to this Markdown file (overwritten)")
    args = ap.parse_args(argv)
    if args.rounds < 0:
        ap.error(f"--rounds must be >= 0, got {args.rounds}")
    lines: list[str] = []
    vidur_setup: dict[str, object] = {}
    load_before = os.getloadavg()[0]

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    trace = DATA / "vidur_traces" / "splitwise_conv.csv"
    say(f"trace {trace}")
    say(f"headway's python {interpreter()}")
    say(
        f"{'N':>6} {'policy':13} {'mode':6} {'wall s':>8} {'cpu s':>8} {'req/s':>10} {'req/cpu-s':>10} "
        f"{'events/s':>10} {'steps':>8}"
    )
    for n in args.num_requests:
        wl = read_vidur_trace(trace, limit=n)
        rows = {}
        for policy in ("fcfs", "sjf-oracle"):
            for exact in (False, True):
                r = bench(wl, policy, exact, args.repeat)
                rows[(policy, exact)] = r
                say(
                    f"{n:>6} {policy:13} {'exact' if exact else 'fast':6} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} "
                    f"{r['requests_per_s']:10,.0f} {r['requests_per_cpu_s']:10,.0f} "
                    f"{r['events_per_s']:10,.0f} {r['num_steps']:8}"
                )
        fast, exact_r = rows[("fcfs", False)], rows[("fcfs", True)]
        say(f"       fast-forward vs exact (fcfs): {exact_r['wall_s'] / fast['wall_s']:.2f}x")
        extra = [("fcfs", "no-apc")] + [(p, "fast") for p in args.policies]
        for policy, mode in extra:
            r = bench(wl, policy, False, args.repeat, apc=mode != "no-apc")
            say(
                f"{n:>6} {policy:13} {mode:6} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} "
                f"{r['requests_per_s']:10,.0f} {r['requests_per_cpu_s']:10,.0f} "
                f"{r['events_per_s']:10,.0f} {r['num_steps']:8}"
            )
        vidur = run_vidur(n)
        if vidur is None:
            say("       (set VIDUR_PATH and VIDUR_PYTHON to run Vidur side by side)")
            continue
        v_cpu = vidur_cpu_seconds(vidur)
        config = vidur.get("config", {})
        vidur_setup = {"vidur_commit": vidur.get("vidur_commit"), **(config if isinstance(config, dict) else {})}
        v_python = f"{config.get('python')} ({config.get('python_base_prefix')})"
        say(f"       Vidur's python {v_python}")
        if v_python != interpreter():
            say("       NOTE: the two ran on different Python installations; the ratio includes their speeds")
        say(
            f"{n:>6} {'vidur-sarathi':13} {'':6} {vidur['run_seconds']:8.3f} {v_cpu:8.3f} "
            f"{vidur['requests_per_second']:10,.0f} {n / v_cpu:10,.0f} {vidur['events_per_second']:10,.0f}"
        )
        for policy in ("fcfs", "sjf-oracle"):
            wall = rows[(policy, False)]["requests_per_s"] / vidur["requests_per_second"]
            cpu = rows[(policy, False)]["requests_per_cpu_s"] / (n / v_cpu)
            say(f"       headway {policy} / Vidur: {cpu:,.0f}x per CPU second, {wall:,.0f}x per wall second")
        ratios = []
        for _ in range(args.rounds):
            ours = bench(wl, "fcfs", False, args.repeat)
            theirs = run_vidur(n, "--repeat", "1")
            assert theirs is not None
            ratios.append(ours["requests_per_cpu_s"] / (n / vidur_cpu_seconds(theirs)))
        if ratios:
            say(
                f"       interleaved rounds, headway fcfs / Vidur per CPU second: "
                f"{', '.join(f'{r:,.0f}x' for r in ratios)} (median {statistics.median(ratios):,.0f}x)"
            )
    wl = long_output_workload()
    fast, exact_r = bench(wl, "fcfs", False, args.repeat), bench(wl, "fcfs", True, args.repeat)
    say(
        f"long outputs (2,000 requests, median 600 output tokens): fcfs fast {fast['cpu_s']:.3f} cpu s, "
        f"{fast['num_events']} events; exact {exact_r['cpu_s']:.3f} cpu s, {exact_r['num_events']} events "
        f"({exact_r['cpu_s'] / fast['cpu_s']:.2f}x)"
    )
    if args.out:
        write_report(args.out, argv, lines, vidur_setup, load_before)
        print(f"wrote {args.out}")
    return 0


def write_report(
    out: Path, argv: list[str] | None, lines: list[str], vidur: dict[str, object], load_before: float
) -> None:
    """The report of one run: its command (paths elided), the machine, Vidur's setup, what it printed."""
    args = sys.argv[1:] if argv is None else argv
    env = ""
    if os.environ.get("VIDUR_PATH"):
        vidur_args = " ".join("..." if a.startswith("/") else a for a in shlex.split(os.environ.get("VIDUR_ARGS", "")))
        env = f'VIDUR_PATH=... VIDUR_PYTHON=... VIDUR_ARGS="{vidur_args}" '
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=HERE)
    rev = (commit.stdout.strip() or "unknown") + (" with uncommitted changes to src/" if dirty.stdout.strip() else "")
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    md = [
        "# Simulator speed vs Vidur",
        "",
        f"Command: `{env}python benchmarks/bench_simulator.py {shlex.join(args)}`",
        "",
        f"Run at headway {rev} on {time.strftime('%Y-%m-%d %H:%M')}: {cpu}, {os.cpu_count()} cores, "
        f"1-minute load average {load_before:.2f} before and {os.getloadavg()[0]:.2f} after. Times are CPU seconds "
        "and wall seconds of the event loops alone; the machine's speed drifts within minutes, so the interleaved "
        "rounds' spread says how far.",
        "",
    ]
    if vidur:
        keys = ("vidur_commit", "attention_profile", "python", "numpy", "pandas", "scikit_learn", "cache_was_warm")
        facts = {**vidur, "vidur_commit": vidur.get("vidur_commit") or "unknown (not a git checkout)"}
        md += ["Vidur: " + ", ".join(f"{k} {facts[k]}" for k in keys if k in facts) + ".", ""]
    else:
        md += ["Vidur did not run (VIDUR_PATH and VIDUR_PYTHON unset): headway's rows only.", ""]
    md += ["```text", *lines, "```", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, "\n".join(md))


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_simulator"))
