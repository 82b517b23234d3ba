"""vLLM's admission limits under overload: its watermark on a KV cache too small for the load
(preemptions against latency), and its API server's ``max_num_queued_tokens`` (TTFT against the
requests turned away).

    python benchmarks/bench_admission_limits.py [--out benchmarks/results]

The Azure conversation trace (19,366 requests, ``llama3-8b-a100``) with the KV cache cut to 2,000
and 4,000 blocks of 16 tokens (the preset's own size holds the load without preemptions), FCFS and
oracle SJF, and vLLM's ``--watermark`` from 0 (vLLM's default) to 0.1: a waiting request is
admitted only if that share of the block pool stays free after it while another request runs. For
each: preemptions, prompt and output tokens computed again after them, mean and P99 TTFT and E2E
latency, and engine steps. Every figure is a simulation's (seeded, deterministic), not a wall-clock
timing; the simulator makes vLLM's decisions with a watermark (``bench_fidelity_steps.py``'s
``sim_admission_limits``).

Then the same trace on the preset's own KV cache, FCFS and oracle SJF, with vLLM's API server's
``--max-num-queued-tokens`` from none to 4,096: a request arriving while the requests without a first
token hold that many prompt tokens is turned away (HTTP 503 there; vLLM's "TTFT QoS" limit). For
each: the share turned away, the admitted requests' mean and P99 TTFT and mean E2E latency (the
simulator turns away the requests vLLM's own ``check_admission`` does: ``sim_api_limits``).

Results go to ``benchmarks/results/admission_limits.{md,png}`` (the figure: preemptions and mean E2E
against the watermark, one line per cache size and policy; the admitted requests' P99 TTFT against
the share turned away, one point per token limit).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from headway._files import save_figure, write_atomic
from headway.metrics import summarize
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import load_workload

RESULTS = Path(__file__).resolve().parent / "results"
WATERMARKS = (0.0, 0.01, 0.02, 0.05, 0.1)
BLOCKS = (2000, 4000)
POLICIES = ("fcfs", "sjf-oracle")
QUEUED_TOKENS = (None, 1_048_576, 262_144, 65_536, 16_384, 4_096)


def run(
    workload: Any, policy: str, blocks: int | None, watermark: float = 0.0, queued: int | None = None
) -> dict[str, float]:
    sched = SchedulerConfig(watermark=watermark, max_num_queued_tokens=queued)
    res = simulate(workload, policy, scheduler=sched, cache=CacheConfig(num_gpu_blocks=blocks))
    s = summarize(res.requests)
    turned_away = sum(n for why, n in s.aborted_by_reason.items() if why.startswith("rejected: "))
    return {
        "preemptions": s.num_preemptions,
        "recomputed": s.num_recomputed_tokens,
        "ttft_mean": s.ttft.mean,
        "ttft_p99": s.ttft.p99,
        "e2e_mean": s.e2e.mean,
        "e2e_p99": s.e2e.p99,
        "steps": res.num_steps,
        "rejected": turned_away / s.num_requests,
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
    limited: dict[str, list[dict[str, float]]] = {}
    for policy in POLICIES:
        limited[policy] = []
        for queued in QUEUED_TOKENS:
            r = run(workload, policy, None, queued=queued)
            limited[policy].append(r)
            print(f"{policy}, max_num_queued_tokens {queued}: {r['rejected']:.1%} turned away, "
                  f"TTFT P99 {r['ttft_p99']:.1f} s", flush=True)  # fmt: skip
    command = shlex.join(["python", "benchmarks/bench_admission_limits.py", *(argv or sys.argv[1:])])
    lines = [
        "# vLLM's admission limits under overload",
        "",
        f"Command: `{command}`",
        "",
        f"`azure-conv`, {len(workload):,} requests on `llama3-8b-a100`, whose load overloads it; vLLM's other "
        "settings at their defaults. Simulated, seeded: every figure is a decision's outcome, not a timing.",
        "",
        "## vLLM's watermark on a KV cache too small for the load",
        "",
        "The KV cache cut to "
        f"{' and '.join(f'{b:,}' for b in BLOCKS)} blocks of 16 tokens. *watermark*: the share of the "
        "block pool (its null block counted) a waiting request must leave free to be admitted while "
        "another runs. Change: mean E2E against the same policy without a watermark.",
        "",
    ]
    for (policy, blocks), rs in rows.items():
        base = rs[0]["e2e_mean"]
        lines += _table(
            f"{policy}, {blocks:,} blocks",
            ("watermark", "preemptions", "tokens recomputed", "TTFT mean / P99 (s)", "E2E mean / P99 (s)", "change",
             "engine steps"),
            [(f"{wm:g}", f"{r['preemptions']:,}", f"{r['recomputed']:,}", f"{r['ttft_mean']:.1f} / {r['ttft_p99']:.1f}",
              f"{r['e2e_mean']:.1f} / {r['e2e_p99']:.1f}", f"{r['e2e_mean'] / base - 1:+.1%}", f"{r['steps']:,}")
             for wm, r in zip(WATERMARKS, rs, strict=True)],
        )  # fmt: skip
    lines += [
        "## vLLM's API server's max_num_queued_tokens",
        "",
        "The preset's own KV cache. *max_num_queued_tokens*: a request arriving while "
        "the requests without a first token hold that many prompt tokens or more is turned away (HTTP 503 "
        "in vLLM); latencies are the admitted requests'.",
        "",
    ]
    for policy, rs in limited.items():
        lines += _table(
            f"{policy}, the preset's KV cache",
            ("max_num_queued_tokens", "turned away", "TTFT mean / P99 (s)", "E2E mean / P99 (s)", "preemptions"),
            [("none" if q is None else f"{q:,}", f"{r['rejected']:.1%}", f"{r['ttft_mean']:.1f} / {r['ttft_p99']:.1f}",
              f"{r['e2e_mean']:.1f} / {r['e2e_p99']:.1f}", f"{r['preemptions']:,}")
             for q, r in zip(QUEUED_TOKENS, rs, strict=True)],
        )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "admission_limits.md"
    write_atomic(md, "\n".join(lines).rstrip("\n") + "\n")
    png = args.out / "admission_limits.png"
    plot(rows, limited, png)
    print(f"wrote {md} and {png}")
    return 0


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A markdown section: ``### title`` and a right-aligned table."""
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def plot(
    rows: dict[tuple[str, int], list[dict[str, float]]], limited: dict[str, list[dict[str, float]]], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, third) = plt.subplots(1, 3, figsize=(15, 4))
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
    left.set_title("--watermark, KV cache cut down", fontsize=10)
    right.set_title("--watermark, KV cache cut down", fontsize=10)
    for policy, rs in limited.items():
        xs = [100 * r["rejected"] for r in rs]
        fcfs = policy == "fcfs"
        third.plot(xs, [r["ttft_p99"] for r in rs], marker="o", linestyle="-" if fcfs else "--", label=policy)
        for q, x, r in zip(QUEUED_TOKENS, xs, rs, strict=True):  # the limit, in Ki tokens
            third.annotate("none" if q is None else f"{q // 1024}Ki", (x, r["ttft_p99"]), fontsize=7,
                           textcoords="offset points", xytext=(5, -9) if fcfs else (5, 4))  # fmt: skip
    third.set_yscale("log")
    third.set_xlabel("requests turned away (%)")
    third.set_ylabel("P99 TTFT of the admitted (s)")
    third.set_title("--max-num-queued-tokens, the preset's KV cache", fontsize=10)
    third.grid(alpha=0.3)
    third.legend(fontsize=8)
    fig.suptitle("azure-conv on llama3-8b-a100: vLLM's admission limits")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "bench_admission_limits"))
