"""Reproduce PARS (Tao et al., 2025): SJF by a pairwise-ranked prompt score on alpaca_eval."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from headway.policies import kendall_tau, noisy_oracle_scores
from headway.reproduce._common import (
    ClaimRow,
    Experiment,
    Timer,
    fmt,
    mean,
    pct,
    run_policy,
    save_figure,
    throughput,
    with_scores,
)
from headway.sim import SimResult
from headway.workload import RequestSpec, burst_arrivals, find_data_dir, poisson_arrivals, read_alpaca_eval

__all__ = ["PARS_MODEL", "TAU", "run"]

PARS_MODEL = "Meta-Llama-3-8B-Instruct"
"""Whose output lengths answer the alpaca_eval prompts (the served model of the preset)."""

TAU: dict[str, float] = {"pars": 0.75, "listwise": 0.62, "pointwise": 0.50}
"""Kendall tau of each predictor's scores with true lengths.

Assumed, not measured here: the PARS paper reports its pairwise predictor ahead of
listwise (LTR, Fu et al., whose OPT ranker reached tau ~0.6 on chat data) and pointwise
regressors; its per-dataset table was not available offline. ``--predictor DIR``
replaces the noisy oracle with a trained ``headway.predict`` checkpoint.
"""

POLICIES = ("fcfs", "sjf-oracle", "pars", "sjf-listwise", "sjf-pointwise")


def _per_token(res: SimResult) -> list[float]:
    return [r.e2e_latency / r.num_output_tokens for r in res.requests if r.e2e_latency is not None]


def _specs(n: int, seed: int) -> list[RequestSpec]:
    d = find_data_dir()
    wl = read_alpaca_eval(
        d / "alpaca_eval" / "instructions.jsonl", d / "alpaca_eval" / "output_lengths_long.csv.gz", PARS_MODEL
    )
    base = list(wl.requests)
    idx = np.random.default_rng(seed).integers(0, len(base), n)
    return [replace(base[i], request_id=f"{base[i].request_id}-{k}") for k, i in enumerate(idx)]


def _predictor_scores(predictor: str, specs: Sequence[RequestSpec]) -> np.ndarray:
    mod: Any = importlib.import_module("headway.predict.score")
    scorer = mod.Scorer.from_checkpoint(predictor)
    return np.asarray(scorer.score([s.prompt or "" for s in specs]), dtype=float)


def _run_all(specs: list[RequestSpec], scores: dict[str, Any]) -> dict[str, SimResult]:
    out: dict[str, SimResult] = {}
    out["fcfs"] = run_policy(with_scores(specs, None), "fcfs")
    out["sjf-oracle"] = run_policy(with_scores(specs, None), "sjf-oracle")
    out["pars"] = run_policy(with_scores(specs, list(scores["pars"])), "pars")
    out["sjf-listwise"] = run_policy(with_scores(specs, list(scores["listwise"])), "sjf-score")
    out["sjf-pointwise"] = run_policy(with_scores(specs, list(scores["pointwise"])), "sjf-score")
    return out


def run(out_dir: Path, quick: bool = False, predictor: str | None = None, seed: int = 0) -> Experiment:
    timer = Timer()
    n = 800 if quick else 2000
    specs = _specs(n, seed)
    lengths = np.array([s.num_output_tokens for s in specs])
    scores = {k: noisy_oracle_scores(lengths, t, seed=seed + i) for i, (k, t) in enumerate(TAU.items())}
    if predictor is not None:
        scores["pars"] = _predictor_scores(predictor, specs)
    measured_tau = {k: kendall_tau(v, lengths) for k, v in scores.items()}
    exp = Experiment("pars", "PARS: prompt-aware ranking scheduler")
    exp.setup = [
        f"{n} alpaca_eval prompts (sampled with replacement from 805) with {PARS_MODEL}'s output "
        f"lengths (mean {lengths.mean():.0f} tokens); simulated vLLM V1 engine, preset llama3-8b-a100.",
        "Scores: "
        + ", ".join(f"{k} tau={measured_tau[k]:.3f}" for k in scores)
        + (
            f" (pars from the checkpoint {predictor})"
            if predictor
            else " (noisy oracle at assumed taus, see headway.reproduce.pars.TAU)"
        ),
        "Per-token latency = TTLT / output tokens. Starvation threshold 120 s (PARS default).",
    ]

    # ---- burst at t = 0
    burst = [replace(s, arrival_time=float(t)) for s, t in zip(specs, burst_arrivals(n), strict=True)]
    res = _run_all(burst, scores)
    ptl = {k: _per_token(v) for k, v in res.items()}
    m = {k: mean(v) for k, v in ptl.items()}
    p90 = {k: pct(v, 90) for k, v in ptl.items()}
    thr = {k: throughput(v) for k, v in res.items()}
    exp.tables.append(
        (
            "Burst: per-token latency (s/token) and throughput",
            ["policy", "mean", "p90", "throughput (tok/s)", "preemptions"],
            [[k, fmt(m[k]), fmt(p90[k]), fmt(thr[k], 4), str(v.replicas[0].num_preemptions)] for k, v in res.items()],
        )
    )
    speed = m["fcfs"] / m["pars"]
    exp.rows += [
        ClaimRow(
            "pars",
            f"burst of {n}: mean per-token latency, FCFS / PARS ('up to 15.7x')",
            15.7,
            speed,
            speed >= 1.5,
            "PARS at least 1.5x better than FCFS (the 15.7x is a best case)",
            "x",
        ),
        ClaimRow(
            "pars",
            "burst: p90 per-token latency, FCFS / PARS",
            15.7,
            p90["fcfs"] / p90["pars"],
            p90["fcfs"] / p90["pars"] >= 1.5,
            "at least 1.5x",
            "x",
        ),
        ClaimRow(
            "pars",
            "burst: PARS close to oracle SJF (mean per-token latency, PARS / SJF)",
            1.0,
            m["pars"] / m["sjf-oracle"],
            m["pars"] / m["sjf-oracle"] <= 1.5,
            "within 1.5x of the oracle",
            "x",
        ),
        ClaimRow(
            "pars",
            "burst: PARS beats listwise- and pointwise-predictor SJF (best baseline / PARS)",
            1.0,
            min(m["sjf-listwise"], m["sjf-pointwise"]) / m["pars"],
            m["pars"] < min(m["sjf-listwise"], m["sjf-pointwise"]),
            "PARS lowest of the three",
            "x",
            note="follows from the assumed taus: the simulation isolates ranking quality",
        ),
        ClaimRow(
            "pars",
            "burst: throughput kept (PARS / FCFS output tokens/s)",
            1.0,
            thr["pars"] / thr["fcfs"],
            thr["pars"] / thr["fcfs"] >= 0.95,
            "within 5% of FCFS",
            "x",
        ),
    ]

    # ---- Poisson arrivals at fractions of the burst capacity
    # capacity: FCFS burst completions per second (a saturated engine for most of the run)
    capacity = n / max(r.finish_time or 0.0 for r in res["fcfs"].requests)
    fractions = [1.2] if quick else [0.8, 1.0, 1.2]
    curve: dict[str, list[float]] = {k: [] for k in POLICIES}
    rate_rows: list[list[str]] = []
    for f in fractions:
        rate = f * capacity
        times = poisson_arrivals(n, rate, seed=seed + 17)
        pspecs = [replace(s, arrival_time=float(t)) for s, t in zip(specs, times, strict=True)]
        rr = _run_all(pspecs, scores)
        pm = {k: mean(_per_token(v)) for k, v in rr.items()}
        p9 = {k: pct(_per_token(v), 90) for k, v in rr.items()}
        for k in POLICIES:
            curve[k].append(pm[k])
        rate_rows.append([f"{rate:.2f} ({f:.0%})"] + [f"{fmt(pm[k])} / {fmt(p9[k])}" for k in POLICIES])
        sp = pm["fcfs"] / pm["pars"]
        exp.rows.append(
            ClaimRow(
                "pars",
                f"Poisson {rate:.1f} req/s ({f:.0%} of capacity): mean per-token latency FCFS / PARS",
                15.7,
                sp,
                sp > 1.1,
                "PARS better than FCFS by > 10%",
                "x",
            )
        )
    exp.tables.append(
        ("Poisson arrivals: mean / p90 per-token latency (s/token)", ["rate (req/s)", *POLICIES], rate_rows)
    )

    def draw_burst(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        x = np.arange(len(POLICIES))
        ax.bar(x - 0.2, [m[k] for k in POLICIES], 0.4, label="mean")
        ax.bar(x + 0.2, [p90[k] for k in POLICIES], 0.4, label="p90")
        ax.set_xticks(x, POLICIES, rotation=15)
        ax.set_ylabel("per-token latency (s/token)")
        ax.set_title(f"Burst of {n} requests")
        ax.legend()

    def draw_rates(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for k in POLICIES:
            ax.plot([f * capacity for f in fractions], curve[k], marker="o", label=k)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("mean per-token latency (s/token)")
        ax.ticklabel_format(axis="y", useOffset=False)  # near-equal values are not magnified by an offset
        ax.legend()

    exp.figures.append((save_figure(out_dir, "pars_burst.png", draw_burst), "Burst: per-token latency by policy"))
    exp.figures.append((save_figure(out_dir, "pars_rates.png", draw_rates), "Poisson arrivals: latency vs rate"))
    exp.notes.append(
        f"Capacity estimated from the FCFS burst: {capacity:.2f} req/s. Below it, continuous batching "
        "with 256 sequence slots absorbs Poisson arrivals without a waiting queue, so no ordering "
        "policy can matter; the rates therefore go up to 1.2x capacity (finite runs, growing queue)."
    )
    if any(not r.reproduced for r in exp.rows if r.claim.startswith("Poisson")):
        at = [[curve[k][i] for k in POLICIES] for i in range(len(fractions))]
        same = [f for f, v in zip(fractions, at, strict=True) if max(v) - min(v) <= 1e-3 * max(v)]  # within 0.1 %
        over = [f for f in same if f > 1.0]
        exp.notes.append(
            "Why some Poisson rates do not reproduce: where all policies give latencies within 0.1 % (table "
            "above: " + ", ".join(f"{f:.0%}" for f in same) + " of capacity), the waiting queue is empty when "
            "a slot frees up; ordering only matters once requests queue."
            + (
                " Here that holds even above the estimated capacity: this run is too short for a queue to build there."
                if over
                else ""
            )
        )
    exp.wall_time = timer.elapsed()
    return exp
