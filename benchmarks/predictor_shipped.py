"""Pack a trained checkpoint as low-rank deltas (the shipped predictor) and compare it with the checkpoint:
held-out tau_b (alpaca_eval prompt-disjoint test split, seed 0) against the consensus lengths and four
models, size, and scoring speed (all 805 alpaca_eval instructions in one call, torch-free). With
``--sources``, also tau_b on the held-out split of every shared-data source (italic: a source the
checkpoint was trained on); ``--compare NPZ`` adds rows for an existing pack (e.g. the one shipped now).

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
from typing import Any

import numpy as np
from scipy import stats

from headway._files import write_atomic
from headway.predict.data import load_dataset, split_by_prompt

MODELS = ("gpt4", "claude-2", "vicuna-13b-v1.3", "llama-2-70b-chat-hf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--ranks", default="16,32,64")
    ap.add_argument("--install", type=int, help="copy this rank's pack into src/headway/predict/weights/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--int8", action="store_true", help="also measure each pack's int8-quantized graph")
    ap.add_argument("--sources", action="store_true", help="also tau_b on every shared source's held-out split")
    ap.add_argument("--compare", metavar="NPZ", help="also evaluate this existing pack (float and, with --int8, int8)")
    ap.add_argument("--out", default="benchmarks/results/predictor_shipped.md")
    args = ap.parse_args()

    from headway.predict._paths import file_sha256
    from headway.predict.model import read_checkpoint_meta
    from headway.predict.score import Scorer
    from headway.predict.shipped import ShippedPredictor, pack_checkpoint, shipped_predictor_path

    meta = read_checkpoint_meta(args.checkpoint)
    trained_on = _trained_on(meta)
    sources = _held_out_sources() if args.sources else []
    compare = ""
    compare_trained: list[str] = []
    if args.compare:
        cmp_path = Path(args.compare)
        compare = f"`{cmp_path.name}` (sha256 {file_sha256(cmp_path)[:16]}, {cmp_path.stat().st_size / 1e6:.2f} MB)"
        compare_trained = ShippedPredictor(cmp_path, threads=args.threads).trained_on

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
    by_source: list[tuple[str, list[float]]] = []

    def measure(name: str, size: str, fn: object) -> None:
        rows.append((name, size, evaluate(fn), speed(fn)))
        if sources:
            by_source.append((name, [_source_tau(src, fn) for src in sources]))

    torch_scorer = Scorer.from_checkpoint(args.checkpoint, "torch", threads=args.threads, cache_size=0)
    measure("checkpoint (torch)", "-", torch_scorer.score)
    tmp = Path(tempfile.mkdtemp())
    packs = {}
    pack_meta = {"trained_on": trained_on, **({"recipe": meta["finetune"]["recipe"]} if "finetune" in meta else {})}
    for rank in [int(r) for r in args.ranks.split(",")]:
        path = tmp / f"rank{rank}.npz"
        header = pack_checkpoint(args.checkpoint, path, rank=rank, meta={**pack_meta, "rank": rank})
        packs[rank] = path
        size = f"{header['bytes'] / 1e6:.2f} MB"
        measure(f"packed, rank {rank} (ONNX Runtime)", size, ShippedPredictor(path, threads=args.threads).score)
        if args.int8:
            q = ShippedPredictor(path, threads=args.threads, int8=True)
            measure(f"packed, rank {rank}, int8 (ONNX Runtime)", size, q.score)
    if args.compare:
        size = f"{Path(args.compare).stat().st_size / 1e6:.2f} MB"
        name = Path(args.compare).name
        measure(f"compared: {name} (ONNX Runtime)", size, ShippedPredictor(args.compare, threads=args.threads).score)
        if args.int8:
            q = ShippedPredictor(args.compare, threads=args.threads, int8=True)
            measure(f"compared: {name}, int8 (ONNX Runtime)", size, q.score)
    lines = [
        "# A fine-tuned checkpoint packed as low-rank deltas over the bundled MiniLM (the shipped predictor's format)",
        "",
        "Command:",
        "",
        "```",
        shlex.join(["python", *sys.argv]),
        "```",
        "",
        f"- checkpoint: {_describe(meta)}; trained on {', '.join(trained_on)}; alpaca_eval held-out = the "
        f"prompt-disjoint test split ({len(consensus)} prompts), which no checkpoint here trained on",
        *([f"- compared: {compare}, the pack given to --compare as it was when this ran"] if compare else []),
        "- speed: all 805 alpaca_eval instructions in one call, batches of 32, "
        f"{args.threads} threads, on the shared 2-core machine (other jobs running)",
        "",
        "| predictor | size | tau_b consensus | " + " | ".join(MODELS) + " | prompts/s |",
        "|---|---:|---:|" + "---:|" * len(MODELS) + "---:|",
    ]
    for name, size, taus, ps in rows:
        lines.append(f"| {name} | {size} | " + " | ".join(f"{t:.3f}" for t in taus) + f" | {ps:.0f} |")
    if sources:
        lines += _source_table(sources, by_source, trained_on, compare_trained)
    write_atomic(Path(args.out), "\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.install:
        dst = shipped_predictor_path()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(packs[args.install], dst)
        print(f"installed rank {args.install} as {dst}")
    print("mean tau_b over the models:", {n: round(float(np.mean(t[1:])), 3) for n, _, t, _ in rows})
    return 0


def _trained_on(meta: dict[str, Any]) -> list[str]:
    """The shared-data sources a checkpoint was trained on, from its ``predictor.json``."""
    if isinstance(meta.get("finetune"), dict):
        return [str(s) for s in meta["finetune"]["trained_on"]]
    data = str((meta.get("training") or {}).get("data") or "")
    return [data.partition(":")[0]] if data else []


def _describe(meta: dict[str, Any]) -> str:
    if isinstance(meta.get("finetune"), dict):
        command = meta.get("command", "headway predictor cross-source-finetune --save-checkpoint")
        return f"`{command}` ({meta['finetune']['recipe']})"
    return "`headway predictor train` defaults (alpaca_eval consensus lengths, full fine-tuning)"


def _held_out_sources() -> list[Any]:
    from headway.predict.crosssource import SOURCES, load_source

    return [load_source(name) for name in SOURCES]


def _source_tau(src: Any, fn: Any) -> float:
    """Mean over the source's models of tau_b on its held-out split (prompt-disjoint, 20 %)."""
    from headway.predict.crosssource import _tau

    idx = np.flatnonzero(src.test)
    scores = np.asarray(fn([src.prompts[i] for i in idx]), dtype=np.float64)
    return float(np.mean([_tau(scores, lengths[idx]) for lengths in src.evals.values()]))


def _source_table(
    sources: list[Any], rows: list[tuple[str, list[float]]], trained_on: list[str], compare_trained: list[str]
) -> list[str]:
    lines = [
        "",
        "## Every shared source: tau_b on its held-out split (prompt-disjoint 20 %), mean over its models",
        "",
        "*italic*: a source the predictor was trained on (in-distribution: not a basis for choosing); plain: a "
        f"source it never saw. Trained on: the checkpoint and its packs {', '.join(trained_on)}"
        + (f"; the compared pack {', '.join(compare_trained) or 'not recorded'}" if compare_trained else ""),
        "",
        "| predictor | " + " | ".join(f"{s.name} ({int(s.test.sum())} prompts)" for s in sources) + " |",
        "|---|" + "---:|" * len(sources),
    ]
    for name, taus in rows:
        seen = compare_trained if name.startswith("compared: ") else trained_on
        cells = [f"*{t:.3f}*" if s.name in seen else f"{t:.3f}" for s, t in zip(sources, taus, strict=True)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "predictor_shipped"))
