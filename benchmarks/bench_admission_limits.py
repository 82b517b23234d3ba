"""vLLM's watermark on a KV cache too small for the load: preemptions against latency.

    python benchmarks/bench_admission_limits.py [--out benchmarks/results]

The Azure conversation trace (19,366 requests, ``llama3-8b-a100``) with the KV cache cut to 2,000
and 4,000 blocks of 16 tokens (the preset's own size holds the load without preemptions), FCFS and
oracle SJF, and vLLM's ``--watermark`` from 0 (vLLM's default) to 0.1: a waiting request is
admitted only if that share of the block pool stays free after it while another request runs. For
each: preemptions, prompt and output tokens computed again after them, mean and P99 TTFT and E2E
latency, and engine steps. Every figure is a simulation's (seeded, deterministic), not a wall-clock
timing; the simulator makes vLLM's decisions with a watermark (``bench_fidelity_steps.py``'s
``sim_admission_limits``).

Results go to ``benchmarks/results/admission_limits.{md,png}`` (the figure: preemptions and mean E2E
against the watermark, one line per cache size and policy).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from headway.metrics import summarize
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import load_workload

RESULTS = Path(__file__).resolve().parent / "results"
WATERMARKS = (0.0, 0.01, 0.02, 0.05, 0.1)
BLOCKS = (2000, 4000)
POLICIES = ("fcfs", "sjf-oracle")


def run(workload: Any, policy: str, blocks: int, watermark: float) -> dict[str, float]:
    res = simulate(
        workload, policy, scheduler=SchedulerConfig(watermark=watermark), cache=CacheConfig(num_gpu_blocks=blocks)
    )
    s = summarize(res.requests)
    return {
        "preemptions": s.num_preemptions,
        "recomputed": s.num_recomputed_tokens,
        "ttft_mean": s.ttft.mean,
        "ttft_p99": s.ttft.p99,
        "e2e_mean": s.e2e.mean,
        "e2e_p99": s.e2e.p99,
        "steps": res.num_steps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for admission_limits.{md,png}")
    ap.add_argument("--num-requests", type=int, default=None, help="the trace's first N requests (default: all)")
    args = ap.parse_args(argv)
    options = {} if args.num_requests is None else {"num_requests": args.num_requests}
    workload = load_workload("azure-conv", **options)
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    for blocks in BLOCKS:
        for policy in POLICIES:
            rows[(policy, blocks)] = []
            for wm in WATERMARKS:
                r = run(workload, policy, blocks, wm)
                rows[(policy, blocks)].append(r)
                print(f"{blocks} blocks, {policy}, watermark {wm:g}: {r['preemptions']:,} preemptions, "
                      f"E2E {r['e2e_mean']:.1f} s", flush=True)  # fmt: skip
    command = shlex.join(["python", "benchmarks/bench_admission_limits.py", *(argv or sys.argv[1:])])
    lines = [
        "# vLLM's watermark on a KV cache too small for the load",
        "",
        f"Command: `{command}`",
        "",
        f"`azure-conv`, {len(workload):,} requests on `llama3-8b-a100` with its KV cache cut to "
        f"{' and '.join(f'{b:,}' for b in BLOCKS)} blocks of 16 tokens; vLLM's other settings at their "
        "defaults. *watermark*: the share of the block pool (its null block counted) a waiting request "
        "must leave free to be admitted while another runs. Simulated, seeded: every figure is a "
        "decision's outcome, not a timing. Change: mean E2E against the same policy without a watermark.",
        "",
    ]
    for (policy, blocks), rs in rows.items():
        base = rs[0]["e2e_mean"]
        lines += [
            f"## {policy}, {blocks:,} blocks",
            "",
            "| watermark | preemptions | tokens recomputed | TTFT mean / P99 (s) | E2E mean / P99 (s) | change | "
            "engine steps |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {wm:g} | {r['preemptions']:,} | {r['recomputed']:,} | {r['ttft_mean']:.1f} / {r['ttft_p99']:.1f} | "
            f"{r['e2e_mean']:.1f} / {r['e2e_p99']:.1f} | {r['e2e_mean'] / base - 1:+.1%} | {r['steps']:,} |"
            for wm, r in zip(WATERMARKS, rs, strict=True)
        ]
        lines.append("")
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "admission_limits.md"
    md.write_text("\n".join(lines).rstrip("\n") + "\n")
    png = args.out / "admission_limits.png"
    plot(rows, png)
    print(f"wrote {md} and {png}")
    return 0


def plot(rows: dict[tuple[str, int], list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for (policy, blocks), rs in rows.items():
        style = {"linestyle": "-" if policy == "fcfs" else "--", "marker": "o"}
        label = f"{policy}, {blocks:,} blocks"
        left.plot(WATERMARKS, [max(r["preemptions"], 0.5) for r in rs], label=label, **style)  # type: ignore[arg-type]
        right.plot(WATERMARKS, [r["e2e_mean"] for r in rs], label=label, **style)  # type: ignore[arg-type]
    left.set_yscale("log")
    left.set_ylabel("preemptions (0 drawn at 0.5)")
    right.set_ylabel("mean E2E latency (s)")
    for ax in (left, right):
        ax.set_xlabel("watermark (share of the KV block pool)")
        ax.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    fig.suptitle("azure-conv on llama3-8b-a100, KV cache cut down: vLLM's --watermark")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
