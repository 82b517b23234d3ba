"""Online learning replay: an offline predictor (trained on alpaca_eval) serves the arena_hard_v2 stream
of one model and learns from each finished request; Kendall tau_b on later requests vs completions seen.

For each of ``--permutations`` seeded orders of the model's prompts, the last ``--test`` prompts are the
later requests; the learner observes the first N (``--steps``) and ranks the later ones. Writes a
Markdown table (mean and standard deviation over orders) and a PNG plot.

    python benchmarks/predictor_online_replay.py            # the alpaca_eval-only pack, Sky-T1-32B
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from headway._files import save_figure, write_atomic
from headway.predict.online import OnlineConfig, OnlineLearner
from headway.workload import find_data_dir

FILES = {"sky-t1-32b": "sky-t1-32b.jsonl", "o3-mini": "o3-mini-2025-01-31.jsonl"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(FILES), default="sky-t1-32b")
    ap.add_argument("--permutations", type=int, default=10)
    ap.add_argument("--test", type=int, default=58, help="later requests ranked at each step")
    ap.add_argument("--steps", default="0,25,50,100,150,200,250,300")
    defaults = OnlineConfig()
    ap.add_argument("--window", type=int, default=defaults.window)
    ap.add_argument("--alpha", type=float, default=defaults.alpha, help="ridge penalty on the features")
    ap.add_argument(
        "--prior-alpha", type=float, default=defaults.prior_alpha, help="ridge penalty on the offline score and size"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="default benchmarks/results/predictor_online_replay_MODEL.md")
    ap.add_argument("--png", help="default benchmarks/results/predictor_online_replay_MODEL.png")
    args = ap.parse_args()
    args.out = args.out or f"benchmarks/results/predictor_online_replay_{args.model}.md"
    args.png = args.png or f"benchmarks/results/predictor_online_replay_{args.model}.png"

    from headway.predict.shipped import ALPACA_PREDICTOR, ShippedPredictor, shipped_predictor_path

    path = find_data_dir() / "arena_hard_v2" / FILES[args.model]
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = [str(r["prompt"]) for r in records]
    lengths = np.array([int(r["output_tokens"]) for r in records], dtype=float)
    steps = [int(s) for s in args.steps.split(",")]
    if max(steps) + args.test > len(prompts):
        raise SystemExit(f"--steps up to {max(steps)} plus --test {args.test} exceed {len(prompts)} prompts")

    # the offline predictor must never have seen arena_hard_v2: the pack trained on alpaca_eval alone
    predictor = ShippedPredictor(shipped_predictor_path(ALPACA_PREDICTOR), threads=args.threads)
    t0 = time.perf_counter()
    table = dict(zip(prompts, predictor.embed(prompts), strict=True))
    embed_s = time.perf_counter() - t0

    def embed(batch: list[str]) -> np.ndarray:
        return np.stack([table[p] for p in batch])

    config = OnlineConfig(
        window=args.window, alpha=args.alpha, prior_alpha=args.prior_alpha, min_observations=25, refit_every=25
    )
    taus = np.zeros((args.permutations, len(steps)))
    for seed in range(args.permutations):
        order = np.random.default_rng(seed).permutation(len(prompts))
        later = order[-args.test :]
        learner = OnlineLearner(embed, predictor.score_embeddings, config, background=False)
        seen = 0
        for j, n in enumerate(steps):
            for i in order[seen:n]:
                learner.observe(prompts[i], int(lengths[i]), args.model)
            seen = n
            scores = learner.score([prompts[i] for i in later], args.model)
            taus[seed, j] = stats.kendalltau(scores, lengths[later], variant="b").statistic
    mean, sd = taus.mean(axis=0), taus.std(axis=0, ddof=1)
    length_tau = np.mean(
        [
            stats.kendalltau([len(prompts[i]) for i in order[-args.test :]], lengths[order[-args.test :]]).statistic
            for order in (np.random.default_rng(s).permutation(len(prompts)) for s in range(args.permutations))
        ]
    )
    command = shlex.join(["python", *sys.argv])
    lines = [
        f"# Online learning replay: alpaca_eval-trained predictor serving arena_hard_v2 `{args.model}`",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"- offline predictor: the packaged {predictor.path.name} (trained on alpaca_eval consensus "
        "lengths alone, never on arena_hard_v2); online head: ridge on [offline score, prompt size, its "
        "pooled features] per model, "
        f"window {args.window}, refit every {config.refit_every}, used from {config.min_observations} "
        f"observations, alpha {args.alpha:g} on the features, {args.prior_alpha:g} on the offline score and "
        "prompt size (chosen on o3-mini and four alpaca_eval models, not on Sky-T1-32B)",
        f"- {len(prompts)} prompts; {args.permutations} seeded orders; in each, the last {args.test} are the "
        "later requests ranked at every step; tau_b mean and standard deviation over orders",
        f"- prompt length (characters) on the same later requests: tau_b {length_tau:.3f}",
        f"- embedding all prompts once: {embed_s:.1f} s",
        "",
        "| completions observed | tau_b mean | sd | gain over 0 |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {m:.3f} | {s:.3f} | {m - mean[0]:+.3f} |" for n, m, s in zip(steps, mean, sd, strict=True)]
    write_atomic(Path(args.out), "\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(steps, mean, yerr=sd, marker="o", capsize=3, label="online (mean, sd over orders)")
    ax.axhline(mean[0], color="grey", linestyle=":", label="offline predictor")
    ax.axhline(length_tau, color="tab:orange", linestyle="--", label="prompt length")
    ax.set_xlabel("completions observed")
    ax.set_ylabel("Kendall tau_b on later requests")
    ax.set_title(f"arena_hard_v2 {args.model}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, args.png, dpi=100)
    print(f"wrote {args.out} and {args.png}")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "predictor_online_replay"))
