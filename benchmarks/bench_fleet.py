"""Fleet benchmarks: which router helps which policy, and how fast fleets simulate.

Two parts (both by default)::

    python benchmarks/bench_fleet.py matrix   # routers x policies on a bursty trace, 4 replicas
    python benchmarks/bench_fleet.py speed    # simulated requests per wall-clock second, 1 vs 8 replicas

**matrix.** The Splitwise/Azure conversation trace (``vidur-conv``: real prompt and
output lengths, first ``--num-requests``) with bursty Gamma arrivals (``vllm bench
serve --burstiness``) over 4 ``llama3-8b-a100`` replicas, in two ``--scenarios``:
burstiness 0.1 (inter-arrival CV 3.2) at 16 req/s in total (4 per replica: bursts
queue, the mean load does not) and burstiness 0.25 (CV 2) at 24 req/s (near
saturation). For each router and policy: mean and P99 E2E latency, and goodput for
``--slo`` (milliseconds, ``vllm bench serve --goodput`` semantics). Policies:
``fcfs``, ``pars`` with the noisy oracle (Kendall ``--tau``, log-length mean/std of
the trace) and ``uniboost``. Routers that weigh lengths get the policy's estimate
where it has one (PARS: its score), else the prompt length.

**speed.** The same trace replayed at ``--speed-rate`` requests/s per replica: one
replica at that rate, and 8 replicas with the trace time-compressed x8 (each replica
sees the same load). Each configuration runs ``--repeat`` times interleaved; the best
wall time and the best CPU time (``SimResult.cpu_time``, robust on a shared machine)
count. The goal: 8 replicas within 2x of one replica's simulated requests per second.

Results go to ``benchmarks/results/fleet_<part>.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from headway._files import write_atomic
from headway.core import available_policies
from headway.metrics import summarize
from headway.routers import available_routers, get_router_class
from headway.sim import simulate
from headway.sim._fleet import fleet_summaries
from headway.workload import Workload, load_workload

RESULTS = Path(__file__).resolve().parent / "results"


def _policies(w: Workload, tau: float) -> dict[str, tuple[str, dict[str, Any]]]:
    logs = np.log([s.num_output_tokens for s in w.requests])
    pars = {
        "scorer": "noisy-oracle",
        "tau": tau,
        "seed": 0,
        "log_mean": float(logs.mean()),
        "log_std": float(logs.std()),
    }
    table = {"fcfs": ("fcfs", {}), f"pars(tau={tau:g})": ("pars", pars), "uniboost": ("uniboost", {})}
    known = set(available_policies())
    return {label: spec for label, spec in table.items() if spec[0] in known}


def _scenarios(spec: str) -> list[tuple[float, float]]:
    out = []
    for item in spec.split(","):
        burstiness, _, rate = item.strip().partition("@")
        out.append((float(burstiness), float(rate)))
    return out


def matrix(args: argparse.Namespace) -> dict[str, Any]:
    routers = args.routers.split(",") if args.routers else available_routers()
    scenarios = []
    for burstiness, rate in _scenarios(args.scenarios):
        w = load_workload(
            args.workload,
            num_requests=args.num_requests,
            arrivals="gamma",
            burstiness=burstiness,
            rate=rate,
            seed=args.seed,
        )
        policies = _policies(w, args.tau)
        rows: list[dict[str, Any]] = []
        print(
            f"{w.name}: {len(w)} requests over {w.duration:.0f} s (Gamma burstiness {burstiness}, "
            f"{rate} req/s) on {args.replicas} x {args.preset}; SLO {args.slo}",
            flush=True,
        )
        for label, (policy, kw) in policies.items():
            for router in routers:
                rkw = {"seed": args.seed} if get_router_class(router).randomized else {}
                res = simulate(
                    w,
                    policy,
                    preset=args.preset,
                    num_replicas=args.replicas,
                    router=router,
                    router_kwargs=rkw,
                    policy_kwargs=kw,
                )
                sums = fleet_summaries(res, slo=args.slo, name=label)
                fleet = sums["fleet"]
                row = {
                    "policy": label,
                    "router": router,
                    "e2e_mean": fleet.e2e.mean,
                    "e2e_p99": fleet.e2e.p99,
                    "ttft_p99": fleet.ttft.p99,
                    "tpot_p99": fleet.tpot.p99,
                    "queueing_mean": fleet.queueing_delay.mean,
                    "goodput": fleet.goodput,
                    "slo_attainment": fleet.slo_attainment,
                    "throughput": fleet.request_throughput,
                    "replica_requests": [r.num_requests for r in res.replicas],
                    "replica_e2e_mean": [s.e2e.mean for k, s in sums.items() if k != "fleet"],
                    "preemptions": sum(r.num_preemptions for r in res.replicas),
                    "wall_s": res.wall_time,
                }
                rows.append(row)
                print(
                    f"  {label:14s} {router:18s} E2E mean {row['e2e_mean']:7.2f} s  "
                    f"P99 {row['e2e_p99']:7.2f} s  goodput {row['goodput']:6.2f} req/s  "
                    f"(replicas {row['replica_requests']}, {row['wall_s']:.2f} s wall)",
                    flush=True,
                )
        scenarios.append(
            {"workload": w.name, "num_requests": len(w), "rate": rate, "burstiness": burstiness, "rows": rows}
        )
    return {
        "replicas": args.replicas,
        "preset": args.preset,
        "slo": args.slo,
        "tau": args.tau,
        "seed": args.seed,
        "scenarios": scenarios,
    }


def _matrix_md(data: dict[str, Any], command: str) -> str:
    out = [
        f"# Routers x policies on {data['replicas']} x {data['preset']}",
        "",
        f"Reproduce: `{command}`",
        "",
        f"Cells: E2E mean / P99 (s) and goodput (req/s) for SLO `{data['slo']}` "
        "(`vllm bench serve --goodput` semantics). Best per policy in bold. PARS uses the "
        f"noisy oracle with Kendall tau {data['tau']}; its score is also the routers' length "
        "estimate, the others' is the prompt length.",
        "",
    ]
    for sc in data["scenarios"]:
        rows = sc["rows"]
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        routers = list(dict.fromkeys(r["router"] for r in rows))
        cell = {(r["policy"], r["router"]): r for r in rows}
        out += [
            f"## {sc['workload']}: {sc['num_requests']} requests, Gamma burstiness {sc['burstiness']} "
            f"at {sc['rate']} req/s",
            "",
        ]
        out.append("| router | " + " | ".join(policies) + " |")
        out.append("|---|" + "---|" * len(policies))
        best: dict[str, dict[str, float]] = {}
        for p in policies:
            cells = [cell[(p, r)] for r in routers if (p, r) in cell]
            best[p] = {
                "mean": min(c["e2e_mean"] for c in cells),
                "p99": min(c["e2e_p99"] for c in cells),
                "goodput": max(c["goodput"] for c in cells),
            }

        def fmt(v: float, b: float, spec: str) -> str:
            s = format(v, spec)
            return f"**{s}**" if format(b, spec) == s else s

        for r in routers:
            parts = []
            for p in policies:
                c = cell.get((p, r))
                if c is None:
                    parts.append("-")
                    continue
                b = best[p]
                parts.append(
                    f"{fmt(c['e2e_mean'], b['mean'], '.2f')} / {fmt(c['e2e_p99'], b['p99'], '.1f')}"
                    f" / {fmt(c['goodput'], b['goodput'], '.2f')}"
                )
            out.append(f"| {r} | " + " | ".join(parts) + " |")
        out.append("")
    return "\n".join(out)


def _compress(w: Workload, factor: float) -> Workload:
    specs = tuple(dataclasses.replace(s, arrival_time=s.arrival_time / factor) for s in w.requests)
    return Workload(f"{w.name}/x{factor:g}", specs, dict(w.meta))


def speed(args: argparse.Namespace) -> dict[str, Any]:
    base = load_workload(args.workload, num_requests=args.speed_requests, rate=args.speed_rate)
    configs: list[tuple[str, int, str | None, dict[str, Any]]] = [("1 replica", 1, None, {})]
    for item in args.speed_routers.split(","):
        router, _, settings = item.partition(":")
        kw = {k: float(v) for k, _, v in (kv.partition("=") for kv in settings.split(";") if kv)}
        configs.append((f"8 replicas, {item}", 8, router, kw))
    wls = {1: base, 8: _compress(base, 8)}
    best: dict[str, tuple[float, float, int]] = {}
    for _ in range(args.repeat):
        for label, n, router, kw in configs:
            res = simulate(
                wls[n], args.speed_policy, preset=args.preset, num_replicas=n, router=router, router_kwargs=kw or None
            )
            prev = best.get(label)
            best[label] = (
                min(res.wall_time, prev[0]) if prev else res.wall_time,
                min(res.cpu_time, prev[1]) if prev else res.cpu_time,
                res.num_events,
            )
    n_req = len(base)
    single_wall, single_cpu = n_req / best["1 replica"][0], n_req / best["1 replica"][1]
    rows = []
    for label, *_ in configs:
        wall, cpu, events = best[label]
        rate, rate_cpu = n_req / wall, n_req / cpu
        rows.append(
            {
                "config": label,
                "wall_s": wall,
                "cpu_s": cpu,
                "events": events,
                "requests_per_s": rate,
                "requests_per_cpu_s": rate_cpu,
                "slowdown_vs_1": single_wall / rate,
                "cpu_slowdown_vs_1": single_cpu / rate_cpu,
            }
        )
        print(
            f"  {label:34s} {rate:9,.0f} simulated req/s wall, {rate_cpu:9,.0f} per CPU s "
            f"(best of {args.repeat}: {wall:.2f} s wall, {cpu:.2f} s CPU; {events} events)  "
            f"slowdown vs 1 replica: {single_wall / rate:.2f}x wall, {single_cpu / rate_cpu:.2f}x CPU",
            flush=True,
        )
    s = summarize(simulate(base, args.speed_policy, preset=args.preset).requests)
    return {
        "workload": base.name,
        "num_requests": n_req,
        "rate_per_replica": args.speed_rate,
        "policy": args.speed_policy,
        "preset": args.preset,
        "repeat": args.repeat,
        "single_replica_e2e_mean": s.e2e.mean,
        "rows": rows,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _speed_md(data: dict[str, Any], command: str) -> str:
    out = [
        f"# Fleet simulation speed: {data['workload']}, {data['num_requests']} requests, "
        f"{data['rate_per_replica']} req/s per replica, policy {data['policy']}",
        "",
        f"Reproduce: `{command}`",
        "",
        "8 replicas replay the same trace time-compressed x8 (the same load per replica). "
        f"Best of {data['repeat']} interleaved runs on a shared machine.",
        "",
        "| configuration | simulated req/s (wall) | per CPU s | wall s | events | slowdown vs 1 replica (wall / CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        out.append(
            f"| {r['config']} | {r['requests_per_s']:,.0f} | {r['requests_per_cpu_s']:,.0f} | "
            f"{r['wall_s']:.2f} | {r['events']} | {r['slowdown_vs_1']:.2f}x / "
            f"{r['cpu_slowdown_vs_1']:.2f}x |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("part", nargs="?", choices=["matrix", "speed", "all"], default="all")
    p.add_argument("--workload", default="vidur-conv")
    p.add_argument("--preset", default="llama3-8b-a100")
    p.add_argument("--seed", type=int, default=0)
    m = p.add_argument_group("matrix")
    m.add_argument("--num-requests", type=int, default=5000)
    m.add_argument(
        "--scenarios", default="0.1@16,0.25@24", help="comma-separated BURSTINESS@RATE (Gamma shape, total req/s)"
    )
    m.add_argument("--replicas", type=int, default=4)
    m.add_argument("--routers", default="", help="comma-separated (default: all)")
    m.add_argument("--tau", type=float, default=0.6, help="Kendall tau of PARS's noisy oracle")
    m.add_argument("--slo", default="ttft:1000 tpot:100 e2el:30000")
    s = p.add_argument_group("speed")
    s.add_argument("--speed-requests", type=int, default=None, help="default: the whole trace")
    s.add_argument("--speed-rate", type=float, default=4.0, help="req/s per replica")
    s.add_argument("--speed-policy", default="fcfs")
    s.add_argument(
        "--speed-routers",
        default="round-robin,least-outstanding,power-of-two,length-aware,length-aware:separation=1",
        help="comma-separated NAME[:KEY=VALUE;...]",
    )
    s.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    command = " ".join(["python benchmarks/bench_fleet.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part in ("matrix", "all"):
        data = matrix(args)
        write_atomic((args.out / "fleet_matrix.json"), json.dumps(data, indent=1) + "\n")
        md = _matrix_md(data, command)
        write_atomic((args.out / "fleet_matrix.md"), md)
        print(md)
    if args.part in ("speed", "all"):
        data = speed(args)
        write_atomic((args.out / "fleet_speed.json"), json.dumps(data, indent=1) + "\n")
        md = _speed_md(data, command)
        write_atomic((args.out / "fleet_speed.md"), md)
        print(md)
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "bench_fleet"))
