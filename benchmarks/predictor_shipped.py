"""Pack a trained checkpoint as low-rank deltas (the shipped predictor) and compare it with the checkpoint:
held-out tau_b (alpaca_eval prompt-disjoint test split, seed 0) against the consensus lengths and four
models, size, and scoring speed (all 805 alpaca_eval instructions in one call, torch-free).

    python benchmarks/predictor_shipped.py --checkpoint DIR --ranks 16,32,64 \
        --install 32   # copies the rank-32 pack into the package
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from headway.predict.data import load_dataset, split_by_prompt

MODELS = ("gpt4", "claude-2", "vicuna-13b-v1.3", "llama-2-70b-chat-hf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--ranks", default="16,32,64")
    ap.add_argument("--install", type=int, help="copy this rank's pack into src/headway/predict/weights/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--int8", action="store_true", help="also measure each pack's int8-quantized graph")
    ap.add_argument("--out", default="benchmarks/results/predictor_shipped.md")
    args = ap.parse_args()

    from headway.predict.score import Scorer
    from headway.predict.shipped import ShippedPredictor, pack_checkpoint, shipped_predictor_path

    consensus = split_by_prompt(load_dataset("alpaca_eval:mean"), 0.2, 0.1, 0).test
    per_model = split_by_prompt(load_dataset("alpaca_eval:" + ",".join(MODELS)), 0.2, 0.1, 0).test
    all_prompts = load_dataset("alpaca_eval:gpt4").prompts()

    def evaluate(score: object) -> list[float]:
        fn = score  # a callable prompts -> scores
        out = [stats.kendalltau(fn(consensus.prompts()), consensus.lengths()).statistic]  # type: ignore[operator]
        for m in MODELS:
            sub = [e for e in per_model.examples if e.model == m]
            s = fn([e.prompt for e in sub])  # type: ignore[operator]
            out.append(stats.kendalltau(s, [e.length for e in sub]).statistic)
        return [float(x) for x in out]

    def speed(fn: object) -> float:
        fn(all_prompts[:32])  # type: ignore[operator]
        t = time.perf_counter()
        fn(all_prompts)  # type: ignore[operator]
        return len(all_prompts) / (time.perf_counter() - t)

    rows = []
    torch_scorer = Scorer.from_checkpoint(args.checkpoint, "torch", threads=args.threads, cache_size=0)
    rows.append(("checkpoint (torch)", "-", evaluate(torch_scorer.score), speed(torch_scorer.score)))
    tmp = Path(tempfile.mkdtemp())
    packs = {}
    for rank in [int(r) for r in args.ranks.split(",")]:
        path = tmp / f"rank{rank}.npz"
        header = pack_checkpoint(args.checkpoint, path, rank=rank, meta={"source": "alpaca_eval:mean", "rank": rank})
        packs[rank] = path
        shipped = ShippedPredictor(path, threads=args.threads)
        size = f"{header['bytes'] / 1e6:.2f} MB"
        rows.append((f"packed, rank {rank} (ONNX Runtime)", size, evaluate(shipped.score), speed(shipped.score)))
        if args.int8:
            q = ShippedPredictor(path, threads=args.threads, int8=True)
            rows.append((f"packed, rank {rank}, int8 (ONNX Runtime)", size, evaluate(q.score), speed(q.score)))
    lines = [
        "# The shipped predictor: a fine-tuned checkpoint packed as low-rank deltas over the bundled MiniLM",
        "",
        "Command:",
        "",
        "```",
        shlex.join(["python", *sys.argv]),
        "```",
        "",
        f"- checkpoint: `headway predictor train` defaults (alpaca_eval consensus lengths, full fine-tuning); "
        f"held-out = its prompt-disjoint test split ({len(consensus)} prompts)",
        "- speed: all 805 alpaca_eval instructions in one call, batches of 32, "
        f"{args.threads} threads, on the shared 2-core machine (other jobs running)",
        "",
        "| predictor | size | tau_b consensus | " + " | ".join(MODELS) + " | prompts/s |",
        "|---|---:|---:|" + "---:|" * len(MODELS) + "---:|",
    ]
    for name, size, taus, ps in rows:
        lines.append(f"| {name} | {size} | " + " | ".join(f"{t:.3f}" for t in taus) + f" | {ps:.0f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.install:
        dst = shipped_predictor_path()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(packs[args.install], dst)
        print(f"installed rank {args.install} as {dst}")
    print("mean tau_b over the models:", {n: round(float(np.mean(t[1:])), 3) for n, _, t, _ in rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
