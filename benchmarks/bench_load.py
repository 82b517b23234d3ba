"""Bounded load test: N requests at a fixed rate through a gateway to the stub backend.

Starts a stub backend and a gateway (and, with --replicas > 1, a redis-server and that
many gateway replicas sharing it, the load spread round-robin) as subprocesses on
127.0.0.1, sends ``--num-requests`` requests open-loop at ``--rate`` per second (2% not
JSON, 1% with a wrong key, 1% oversized, 20% streamed) and counts every request's
terminal answer: completed, rejected by reason, lost (must be 0). Cross-checks the
gateway's own counters (finished + rejections == sent) and the stub's (each completed
request generated once). Writes ``benchmarks/results/load_<N>.md`` and ``.json``
(``load_<N>_<R>replicas`` with ``--replicas R`` above 1).

Usage: python benchmarks/bench_load.py [--num-requests 10000] [--rate 50] [--replicas 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from headway._files import write_atomic
from headway.serve import hash_api_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test harnesses live with the tests
from harness.cluster import Cluster
from harness.loadtest import LoadConfig, gateway_counters, run_load

KEYS = ("sk-load-a", "sk-load-b")
ADMIN = "sk-load-admin"
RESULTS = Path(__file__).resolve().parent / "results"


def gateway_config(stub_url: str, concurrency: int, max_queue: int, ttl: float) -> dict:
    return {
        "policy": "sjf-oracle",
        "max_queue_len": max_queue,
        "queue_ttl_s": ttl,
        "max_body_bytes": 65536,
        "backends": [{"url": stub_url, "max_concurrency": concurrency}],
        "tenants": [
            {"name": "a", "tier": "premium", "api_key_sha256": [hash_api_key(KEYS[0])]},
            {"name": "b", "tier": "batch", "api_key_sha256": [hash_api_key(KEYS[1])]},
        ],
        "admin_api_key_sha256": [hash_api_key(ADMIN)],
    }


async def _load_many(urls: list[str], cfg: LoadConfig):
    import asyncio
    from dataclasses import replace

    from harness.loadtest import LoadResult

    k, rate = len(urls), cfg.rate / len(urls)
    sizes = [cfg.num_requests // k + (i < cfg.num_requests % k) for i in range(k)]
    per = [replace(cfg, url=u, num_requests=sizes[i], rate=rate, seed=cfg.seed + i) for i, u in enumerate(urls)]
    parts = await asyncio.gather(*(run_load(c) for c in per))
    total = LoadResult()
    for p in parts:
        total.sent += p.sent
        total.outcomes.update(p.outcomes)
        total.reasons.update(p.reasons)
        total.kinds.update(p.kinds)
        total.latencies += p.latencies
        total.duration_s = max(total.duration_s, p.duration_s)
        total.achieved_rate += p.achieved_rate
        total.max_lag_s = max(total.max_lag_s, p.max_lag_s)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--backend-concurrency", type=int, default=8)
    ap.add_argument("--token-delay", type=float, default=0.01)
    ap.add_argument("--max-queue", type=int, default=50)
    ap.add_argument("--queue-ttl", type=float, default=5.0)
    ap.add_argument("--out", default=None, help="result file stem (default results/load_<N>, or load_<N>_<R>replicas)")
    args = ap.parse_args()

    import asyncio

    tmp = tempfile.mkdtemp(prefix="bench_load_")
    cluster = Cluster(Path(tmp))
    try:
        stub = cluster.stub(token_delay_s=args.token_delay)
        conf = gateway_config(stub.url, args.backend_concurrency, args.max_queue, args.queue_ttl)
        redis_url = cluster.redis().redis_url if args.replicas > 1 else None
        gws = [cluster.gateway([], redis_url=redis_url, config=conf) for _ in range(args.replicas)]
        cfg = LoadConfig(gws[0].url, num_requests=args.num_requests, rate=args.rate, api_keys=KEYS,
                         oversize_bytes=65536, seed=0, timeout_s=120.0)  # fmt: skip
        t0 = time.time()
        res = asyncio.run(_load_many([g.url for g in gws], cfg))
        wall = time.time() - t0
        finished = rejected = 0.0
        rejections: dict[str, float] = {}
        for g in gws:
            text = httpx.get(g.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
            c = gateway_counters(text)
            finished += sum(c["finished"].values())
            rejected += sum(c["rejections"].values())
            for k, v in c["rejections"].items():
                rejections[k] = rejections.get(k, 0) + v
        stats = httpx.get(stub.url + "/stub/stats").json()
    finally:
        cluster.close()

    d = res.to_dict()
    d.update(
        {
            "config": vars(args),
            "gateway_finished": finished,
            "gateway_rejections": rejections,
            "gateway_terminal_outcomes": finished + rejected,
            "stub_started": stats["started"],
            "stub_completed": stats["completed"],
            "stub_aborted": stats["aborted"],
            "wall_s": round(wall, 1),
        }
    )
    checks = {
        "lost == 0": res.lost == 0,
        "every request answered once (client)": res.answered == res.sent,
        "gateway finished + rejected == sent": finished + rejected == res.sent,
        "stub completed == client completed": stats["completed"] == res.outcomes["completed"],
    }
    d["checks"] = checks
    if all(checks.values()):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"checks failed: process logs kept in {tmp}", file=sys.stderr)
    suffix = f"_{args.replicas}replicas" if args.replicas > 1 else ""
    stem = args.out or str(RESULTS / f"load_{args.num_requests}{suffix}")
    write_atomic(Path(stem + ".json"), json.dumps(d, indent=2) + "\n")
    lines = [
        f"# Load test: {res.sent} requests at {args.rate:g}/s "
        f"({args.replicas} gateway replica{'s' if args.replicas > 1 else ''}, stub backend)",
        "",
        f"Command: `python benchmarks/bench_load.py --num-requests {args.num_requests} --rate {args.rate:g} "
        f"--replicas {args.replicas}` (backend concurrency {args.backend_concurrency}, token delay "
        f"{args.token_delay:g} s, max queue {args.max_queue}, queue TTL {args.queue_ttl:g} s; 2 shared CPU cores).",
        "",
        "| outcome | requests |",
        "|---|---:|",
        *(f"| {k} | {v} |" for k, v in d["outcomes"].items()),
        f"| **lost** | **{res.lost}** |",
        f"| accepted into the queue (completed + 408/502/stream errors) | {res.accepted} |",
        f"| total answered / sent | {res.answered} / {res.sent} |",
        "",
        "Rejections by reason (status:code, client side):",
        "",
        "| reason | requests |",
        "|---|---:|",
        *(f"| {k} | {v} |" for k, v in d["reasons"].items()),
        "",
        f"Sent as: {d['kinds']}. Achieved send rate {d['achieved_rate']} req/s (worst send lag "
        f"{d['max_lag_s']} s); run took {d['duration_s']} s. Completed latency p50 "
        f"{d['completed_latency_p50_s']} s, p99 {d['completed_latency_p99_s']} s.",
        "",
        f"Gateway counters: finished {finished:g} + rejections {rejected:g} = {finished + rejected:g} "
        f"(by reason {rejections}). Stub: started {stats['started']}, completed {stats['completed']}, "
        f"aborted {stats['aborted']}.",
        "",
        "Checks: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items()),
        "",
    ]
    write_atomic(Path(stem + ".md"), "\n".join(lines))
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_load"))
