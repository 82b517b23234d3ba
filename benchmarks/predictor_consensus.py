"""Consensus labels and checkpoint ensembles, measured on alpaca_eval (see predictor_eval.md).

1. How well the consensus length (geometric mean over all 227 models) ranks one model's own
   lengths, over all 805 prompts: an upper reference for a predictor trained on the consensus.
2. For each checkpoint given, Kendall tau_b against ``--model``'s lengths on the held-out prompts
   (the default training split), and the tau_b of the average of their z-scored scores.

    python benchmarks/predictor_consensus.py [--model gpt4] [CHECKPOINT_DIR ...]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.stats import kendalltau

from headway.predict.data import load_alpaca_eval, load_alpaca_eval_consensus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt4", help="alpaca_eval model whose lengths are the truth")
    ap.add_argument("checkpoints", nargs="*")
    args = ap.parse_args()
    consensus = {e.prompt: e.length for e in load_alpaca_eval_consensus()}
    truth = load_alpaca_eval(args.model)
    pairs = np.array([(consensus[e.prompt], e.length) for e in truth.examples])
    tau = kendalltau(pairs[:, 0], pairs[:, 1]).statistic
    print(f"consensus vs {args.model}, all {len(pairs)} prompts: Kendall tau_b {tau:.4f}")
    if not args.checkpoints:
        return 0
    from headway.predict.score import Scorer
    from headway.predict.train import TrainConfig

    test = TrainConfig().split(truth).test
    prompts, y = [e.prompt for e in test.examples], np.array([e.length for e in test.examples])
    zs = []
    for ck in args.checkpoints:
        s = np.asarray(Scorer.from_checkpoint(ck).score(prompts), dtype=float)
        zs.append((s - s.mean()) / s.std())
        print(f"{ck}: held-out tau_b vs {args.model} {kendalltau(s, y).statistic:.4f} ({len(y)} prompts)")
    if len(zs) > 1:
        print(f"z-score average of the {len(zs)}: {kendalltau(np.mean(zs, axis=0), y).statistic:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
