"""Routing for the prefix cache: which router keeps shared prefixes where they are cached, at what cost in load.

    python benchmarks/bench_prefix_routing.py [--replicas 4] [--out benchmarks/results]

Four ``llama3-8b-a100`` replicas with vLLM's prefix caching (on by default), FCFS on each, and
every router, on workloads whose prompts share prefixes:

- ``sharegpt-sessions``: ShareGPT's conversations turn by turn (a turn's prompt is the
  conversation so far; the next turn comes a think time, 10 s on average, after the answer),
  conversations starting at 2, 6 and 12 per second;
- the synthetic default workload with shared system prompts: 8 of 1,000 tokens at 20 req/s, and 64
  of 2,000 tokens at 24 req/s (more prefixes than the replicas' KV caches hold at once);
- the Azure conversation trace (its first 4,000 requests, retimed to 20 req/s) behind 16 system
  prompts of 1,500 tokens;
- the default workload at 24 req/s without shared prefixes, where a prefix router can only balance.

For each: the share of prompt tokens found cached over the fleet (vLLM's ``prefix_cache_hits`` over
``prefix_cache_queries``), mean and P99 TTFT and E2E latency, preemptions, and how many requests
each replica got. "ideal" is what one unbounded cache would have found (from the block hashes,
requests in arrival order): no router can exceed it. Every figure is a simulation's (seeded,
deterministic), not a wall-clock timing.

Results go to ``benchmarks/results/fleet_prefix.{json,md,png}`` (the figure: one panel per scenario,
each router's share found cached against its mean E2E).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from headway._files import save_figure, write_atomic
from headway.metrics import summarize
from headway.routers import available_routers, get_router_class
from headway.sim import CacheConfig, ideal_prefix_hits, simulate
from headway.sim._prefix import block_keys
from headway.workload import Workload, load_workload

RESULTS = Path(__file__).resolve().parent / "results"

SCENARIOS: list[tuple[str, str, dict[str, Any]]] = [
    ("sessions, 2 conversations/s", "sharegpt-sessions", {"rate": 2.0}),
    ("sessions, 6 conversations/s", "sharegpt-sessions", {"rate": 6.0}),
    ("sessions, 12 conversations/s", "sharegpt-sessions", {"rate": 12.0}),
    (
        "8 system prompts x 1,000 tokens, 20 req/s",
        "default",
        {"rate": 20.0, "system_prompts": 8, "system_prompt_tokens": 1000},
    ),
    (
        "64 system prompts x 2,000 tokens, 24 req/s",
        "default",
        {"rate": 24.0, "system_prompts": 64, "system_prompt_tokens": 2000},
    ),
    (
        "Azure conv, 16 system prompts x 1,500 tokens, 20 req/s",
        "azure-conv",
        {"rate": 20.0, "system_prompts": 16, "system_prompt_tokens": 1500},
    ),
    ("no shared prefix (default workload), 24 req/s", "default", {"rate": 24.0}),
]


def ideal_hit_rate(w: Workload, block_size: int) -> float:
    """Hits of one unbounded cache over the prompt tokens, requests in arrival order."""
    specs = sorted(w.requests, key=lambda s: s.arrival_time)
    keyed = [
        (
            block_keys(s.block_hashes, s.hash_block_size, s.num_prompt_tokens, block_size, s.hashed_tokens),
            s.num_prompt_tokens,
        )
        for s in specs
    ]
    total = sum(s.num_prompt_tokens for s in specs)
    return ideal_prefix_hits(keyed, block_size) / total if total else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    routers = args.routers.split(",") if args.routers else available_routers()
    cache = CacheConfig()
    scenarios = []
    for label, name, opts in SCENARIOS:
        w = load_workload(name, num_requests=args.num_requests, seed=args.seed, **opts)
        ideal = ideal_hit_rate(w, cache.block_size)
        print(f"{label}: {len(w)} requests over {w.duration:.0f} s; ideal hit rate {ideal:.1%}", flush=True)
        rows = []
        for router in routers:
            rkw = {"seed": args.seed} if get_router_class(router).randomized else {}
            res = simulate(w, args.policy, preset=args.preset, num_replicas=args.replicas, router=router,
                           router_kwargs=rkw, cache=cache)  # fmt: skip
            s = summarize(res.requests)
            row = {
                "router": router,
                "hit_rate": s.prefix_cache_hit_rate or 0.0,
                "ttft_mean": s.ttft.mean,
                "ttft_p99": s.ttft.p99,
                "e2e_mean": s.e2e.mean,
                "e2e_p99": s.e2e.p99,
                "preemptions": s.num_preemptions,
                "replica_requests": [r.num_requests for r in res.replicas],
            }
            if row["hit_rate"] > ideal + 1e-12:
                raise SystemExit(f"{label} {router}: hit rate {row['hit_rate']} above the ideal {ideal}")
            rows.append(row)
            print(
                f"  {router:18s} hit {row['hit_rate']:6.1%}  TTFT {row['ttft_mean']:7.3f} / {row['ttft_p99']:7.3f} s"
                f"  E2E {row['e2e_mean']:7.2f} / {row['e2e_p99']:7.2f} s  preempted {row['preemptions']:4d}"
                f"  {row['replica_requests']}",
                flush=True,
            )
        scenarios.append(
            {"label": label, "workload": name, "options": opts, "num_requests": len(w), "ideal_hit_rate": ideal,
             "rows": rows}
        )  # fmt: skip
    return {
        "replicas": args.replicas,
        "preset": args.preset,
        "policy": args.policy,
        "seed": args.seed,
        "block_size": cache.block_size,
        "scenarios": scenarios,
    }


def to_markdown(data: dict[str, Any], command: str) -> str:
    out = [
        f"# Routing for the prefix cache: {data['replicas']} x {data['preset']}, {data['policy']} on each",
        "",
        f"Command: `{command}`",
        "",
        f"Prefix caching on ({data['block_size']}-token blocks), vLLM's engine rules. Cells: the share of "
        "prompt tokens found cached over the fleet; TTFT and E2E latency, mean / P99 (s); "
        "preemptions; requests per replica. Best per scenario in bold. *ideal*: one unbounded cache, "
        "requests in arrival order (no router can exceed it). Simulated, seeded: every figure is a "
        "decision's outcome, not a timing.",
        "",
    ]
    for sc in data["scenarios"]:
        rows = sc["rows"]
        best = {
            "hit_rate": max(r["hit_rate"] for r in rows),
            "ttft_mean": min(r["ttft_mean"] for r in rows),
            "e2e_mean": min(r["e2e_mean"] for r in rows),
            "e2e_p99": min(r["e2e_p99"] for r in rows),
        }

        def bold(row: dict[str, Any], key: str, text: str, best: dict[str, float] = best) -> str:
            return f"**{text}**" if row[key] == best[key] else text

        out += [
            f"## {sc['label']}",
            "",
            f"`{sc['workload']}`, {sc['num_requests']:,} requests; ideal hit rate {sc['ideal_hit_rate']:.1%}",
            "",
            "| router | found cached | TTFT mean / P99 (s) | E2E mean / P99 (s) | preemptions | requests per replica |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            reqs = r["replica_requests"]
            out.append(
                f"| {r['router']} | {bold(r, 'hit_rate', format(r['hit_rate'], '.1%'))} "
                f"| {bold(r, 'ttft_mean', format(r['ttft_mean'], '.3f'))} / {r['ttft_p99']:.3f} "
                f"| {bold(r, 'e2e_mean', format(r['e2e_mean'], '.2f'))} / "
                f"{bold(r, 'e2e_p99', format(r['e2e_p99'], '.2f'))} "
                f"| {r['preemptions']:,} | {min(reqs):,}-{max(reqs):,} |"
            )
        out.append("")
    return "\n".join(out)


def plot(data: dict[str, Any], path: Path) -> None:
    """One panel per scenario: each router's share found cached against its mean E2E latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = data["scenarios"]
    cols = 4
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 3.4 * rows), squeeze=False)
    routers = [r["router"] for r in scenarios[0]["rows"]]
    markers = dict(zip(routers, "osD^v<>pPX*h", strict=False))
    colors = {r: plt.get_cmap("tab10")(i % 10) for i, r in enumerate(routers)}
    for ax, sc in zip(axes.flat, scenarios, strict=False):
        for r in sc["rows"]:
            ax.scatter(100 * r["hit_rate"], r["e2e_mean"], marker=markers[r["router"]], color=colors[r["router"]],
                       s=45, label=r["router"])  # fmt: skip
        ax.axvline(100 * sc["ideal_hit_rate"], color="grey", linestyle=":", linewidth=1)
        if not sc["ideal_hit_rate"]:
            ax.set_xlim(-1.0, 5.0)  # nothing can be found cached
        ax.set_title(sc["label"], fontsize=9)
        ax.set_xlabel("prompt tokens found cached (%)", fontsize=8)
        ax.set_ylabel("mean E2E (s)", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(scenarios) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", fontsize=8, title="router (dotted: one unbounded cache)",
               title_fontsize=8)  # fmt: skip
    fig.suptitle(
        f"Routing for the prefix cache: {data['replicas']} x {data['preset']}, {data['policy']} "
        "(right and low is better)",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=4000, help="requests (turns) per scenario")
    p.add_argument("--preset", default="llama3-8b-a100")
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--routers", default="", help="comma-separated (default: every registered router)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    command = " ".join(["python benchmarks/bench_prefix_routing.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    data = run(args)
    write_atomic((args.out / "fleet_prefix.json"), json.dumps(data, indent=1) + "\n")
    md = to_markdown(data, command)
    write_atomic((args.out / "fleet_prefix.md"), md)
    plot(data, args.out / "fleet_prefix.png")
    print(md)
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "bench_prefix_routing"))
