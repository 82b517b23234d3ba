"""Predictor scoring speed on CPU: prompts/s batched (torch vs ONNX Runtime) and single-prompt latency.

Scores alpaca_eval's 805 instructions (truncated to the checkpoint's max length, 128 by default, or to
each ``--score-max-length``) end to end: tokenization, dynamic padding, the model, with the score cache
disabled. Target: >= 100 prompts/s batched on 2 CPU cores.

    python benchmarks/bench_predictor.py                       # the default checkpoint if trained
    python benchmarks/bench_predictor.py --model DIR --out benchmarks/results/predictor_bench.md
    python benchmarks/bench_predictor.py --model default,DIR --backends onnx-int8   # two checkpoints side by side

Two throughputs: all 805 prompts in one call (the scorer sorts them by length, so its batches hardly
pad), and ``--call-size`` prompts per call in a seeded random order, as a gateway scores what arrived
together (each call's prompts are sorted and batched alone). ``--chunking fixed,padding`` adds rows
with the scorer's batches cut every ``--batch-size`` prompts (as before 2026-11-30) beside its
padding-aware batches, in the same process:

    python benchmarks/bench_predictor.py --backends onnx-int8,torch --score-max-length 64 --chunking fixed,padding

``--model shipped`` scores with the predictor shipped in the package (what ``pars`` uses on a fresh
install: ONNX Runtime only, so its backends are ``onnx`` and ``onnx-int8``), as the canonical result does:

    python benchmarks/bench_predictor.py --model shipped --backends onnx,onnx-int8 --score-max-length 96,64

Without a trained checkpoint ``default`` benchmarks an untrained head on the bundled MiniLM-L6 (the same
compute). The report names the CPU and whether it has the VNNI instructions ONNX Runtime's int8 kernels
use (without them its int8 graph can be slower than the float one).
The machine's load average is printed: on a shared machine other processes slow every number down.
So is the CPU's float32 matrix-multiply rate, before the first row and after each (:func:`matmul_rate`),
and each row's encoder operations per second as a share of the rates around it (:func:`encoder_flops`):
a shared VM's cores can run at different speeds hours apart with the same load average, and the share
says how close the scorer came to what the cores gave at the time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _instructions(data_dir: Path) -> list[str]:
    path = data_dir / "alpaca_eval" / "instructions.jsonl"
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line)["instruction"] for line in fh if line.strip()]


SHIPPED = "shipped"
"""``--model`` for the predictor packed into the package (:class:`~headway.predict.shipped.ShippedPredictor`)."""
SHIPPED_WHAT = "the predictor shipped in the package (ONNX Runtime)"


class _Shipped:
    """The shipped predictor as the benchmark times a scorer: ``score``, ``score_one``, ``meta`` (its
    pack's header, with the encoder it runs on for :func:`_layers`), ``max_length``."""

    def __init__(self, backend: str, *, threads: int, batch_size: int, max_length: int | None) -> None:
        from headway.predict._errors import CheckpointError
        from headway.predict.shipped import ShippedPredictor

        if backend not in ("onnx", "onnx-int8"):
            raise CheckpointError(f"the shipped predictor runs on ONNX Runtime only (onnx, onnx-int8), not {backend}")
        self._p = ShippedPredictor(threads=threads, batch_size=batch_size, max_length=max_length,
                                   int8=backend == "onnx-int8")  # fmt: skip
        encoder: dict[str, Any] = {"path": str(self._p.encoder.model_dir)}
        if "encoder_layers" in self._p.meta:  # packed on the encoder's first layers
            encoder["num_layers"] = int(self._p.meta["encoder_layers"])
        self.meta = {**self._p.meta, "encoder": encoder}
        self.max_length = self._p.max_length

    def score(self, prompts: list[str]) -> Any:
        return self._p.score(prompts)

    def score_one(self, prompt: str) -> float:
        return float(self._p.score([prompt])[0])


def _meta(ckpt: Path, what: str) -> dict[str, Any]:
    """A checkpoint's metadata, or the shipped pack's header (CheckpointError when unreadable)."""
    from headway.predict.model import read_checkpoint_meta
    from headway.predict.shipped import read_pack_header

    return read_pack_header(ckpt) if what == SHIPPED_WHAT else read_checkpoint_meta(ckpt)


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name, its core count, and which of the x86 vector extensions ONNX Runtime's
    kernels use it has (from ``cpuinfo`` on Linux; else the platform's processor name)."""
    name = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    vnni = "with VNNI" if {"avx512_vnni", "avx_vnni"} & flags else "no VNNI (int8 without its dot-product instructions)"
    extra = f"; {', '.join(isa)}; {vnni}" if flags else ""
    return f"{name}, {os.cpu_count()} cores{extra}"


def _checkpoint(model: str | None, max_length: int) -> tuple[Path, str]:
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint
    from headway.predict.shipped import shipped_predictor_path
    from headway.predict.train import default_predictor_dir

    if model == SHIPPED:
        return shipped_predictor_path(), SHIPPED_WHAT
    if model and model != "default":
        return Path(model), "given checkpoint"
    default = default_predictor_dir()
    if (default / "predictor.json").is_file():
        return default, "default trained checkpoint"
    encoder, tokenizer = load_encoder(None)
    out = Path(tempfile.mkdtemp(prefix="headway-bench-")) / "untrained"
    save_checkpoint(LengthPredictor(encoder), tokenizer, out, fine_tuned=True, max_length=max_length)
    return out, "untrained head on bundled MiniLM-L6 (same compute as a trained one)"


def _encoder_config(ckpt: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The config of the encoder a checkpoint runs (its own, fine-tuned; else its source encoder's), with
    ``num_hidden_layers`` set to the layers it keeps of it when its metadata says; empty when none is found."""
    enc = meta.get("encoder", {})
    config: dict[str, Any] = {}
    for path in (ckpt / "encoder" / "config.json", Path(str(enc.get("path", ""))) / "config.json"):
        if path.is_file():
            config = dict(json.loads(path.read_text()))
            break
    if isinstance(enc.get("num_layers"), int):
        config["num_hidden_layers"] = int(enc["num_layers"])
    return config


def _layers(config: dict[str, Any]) -> int | str:
    """Encoder layers a checkpoint runs, from its :func:`_encoder_config` (the layers it keeps of its
    source encoder, else the config's count); ``?`` when neither says."""
    return int(config.get("num_hidden_layers", 0)) or "?"


MATMUL_SHAPE = (4096, 384, 1536)
"""The probe's float32 product ``[m, k] @ [k, n]``: MiniLM's feed-forward shape over 4,096 tokens."""


def matmul_rate(threads: int, repeats: int = 20, shape: tuple[int, int, int] = MATMUL_SHAPE) -> float:
    """This CPU's float32 matrix-multiply rate now, in GFLOP/s: ONNX Runtime's MatMul (the kernel of the
    scorer's dense layers) on ``threads`` threads, the best of ``repeats`` runs."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = shape
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"x": rng.standard_normal((m, k), dtype=np.float32)}
    session.run(["y"], feed)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        session.run(["y"], feed)
        best = min(best, time.perf_counter() - t)
    return 2 * m * k * n / best / 1e9


def encoder_flops(shapes: list[tuple[int, int]], config: dict[str, Any]) -> float:
    """Floating-point operations of a BERT-style encoder's layers over forward passes of ``(batch, tokens)``
    (``config``: ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``): per token and layer the
    four attention projections and the two feed-forward products, ``2 (4 h^2 + 2 h f)``, and per layer
    the attention's two products over each batch's tokens, ``4 b t^2 h``. The embeddings, norms,
    softmax, activations and pooling are left out."""
    layers, h, f = (int(config[k]) for k in ("num_hidden_layers", "hidden_size", "intermediate_size"))
    return float(sum(layers * (b * t * 2 * (4 * h * h + 2 * h * f) + 4 * b * t * t * h) for b, t in shapes))


class _Shapes:
    """Stands in for a scorer's runner (or its ONNX session) and records the ``(batch, tokens)`` of each
    forward pass it runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.shapes: list[tuple[int, int]] = []

    def run(self, *args: Any) -> Any:
        # an ONNX session's run(names, feed) or a runner's run(input_ids, mask)
        ids = args[1]["input_ids"] if isinstance(args[1], dict) else args[0]
        self.shapes.append((int(ids.shape[0]), int(ids.shape[1])))
        return self.inner.run(*args)


def batch_shapes(scorer: Any, prompts: list[str]) -> list[tuple[int, int]]:
    """The ``(batch, tokens)`` of every forward pass the scorer runs to score ``prompts`` in one call."""
    owner, attr = (scorer._p.encoder, "_session") if isinstance(scorer, _Shipped) else (scorer, "runner")
    inner = getattr(owner, attr)
    recorder = _Shapes(inner)
    setattr(owner, attr, recorder)
    try:
        scorer.score(prompts)
    finally:
        setattr(owner, attr, inner)
    return recorder.shapes


def _throughput(scorer: object, prompts: list[str], repeats: int, call: int | None = None) -> list[float]:
    """Prompts/s scoring all ``prompts`` in one call, or ``call`` at a time in a seeded random order
    (a gateway's batches)."""
    import random

    score = scorer.score  # type: ignore[attr-defined]
    order = list(prompts)
    if call is None:
        score(prompts[:64])  # warm-up
    else:
        random.Random(0).shuffle(order)
    step = call or len(order)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for k in range(0, len(order), step):
            score(order[k : k + step])
        rates.append(len(order) / (time.perf_counter() - t))
    return rates


def _fixed_chunks(lengths: Any, max_batch: int, pass_cost: int = 0) -> list[tuple[int, int]]:
    """``--chunking fixed``: a batch every ``max_batch`` prompts, whatever their lengths."""
    return [(k, min(k + max_batch, len(lengths))) for k in range(0, len(lengths), max_batch)]


def _latency_ms(scorer: object, prompts: list[str], n: int) -> list[float]:
    score_one = scorer.score_one  # type: ignore[attr-defined]
    score_one(prompts[0])
    out = []
    for p in prompts[:n]:
        t = time.perf_counter()
        score_one(p)
        out.append((time.perf_counter() - t) * 1000)
    return out


def _heldout_tau(scorer: Any, data_dir: Path) -> float:
    """Kendall tau_b of the scores against gpt4's lengths on the default training split's test prompts."""
    from scipy.stats import kendalltau

    from headway.predict.data import load_alpaca_eval
    from headway.predict.train import TrainConfig

    examples = TrainConfig().split(load_alpaca_eval("gpt4", "tokens", data_dir=data_dir)).test.examples
    return float(kendalltau(scorer.score([e.prompt for e in examples]), [e.length for e in examples]).statistic)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="default",
        help="comma list of checkpoint directories, rows each ('default': the trained default predictor, else "
        "untrained; 'shipped': the predictor shipped in the package)",
    )
    ap.add_argument("--data-dir", help="shared data (default $HEADWAY_DATA_DIR or ../shared/data)")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per forward (default 32)")
    ap.add_argument("--max-length", type=int, default=128, help="for an untrained checkpoint (default 128)")
    ap.add_argument(
        "--score-max-length",
        default="",
        help="comma list of lengths (tokens) to truncate prompts to when scoring, one row each per backend "
        "(default: the checkpoint's); the gateway's --scorer-max-length",
    )
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the 805 prompts (default 3)")
    ap.add_argument("--single", type=int, default=100, help="prompts timed one at a time (default 100)")
    ap.add_argument("--backends", default="torch,onnx,onnx-int8", help="comma-separated (default torch,onnx,onnx-int8)")
    ap.add_argument("--call-size", type=int, default=32, help="prompts per call in arrival order (default 32)")
    ap.add_argument(
        "--chunking",
        default="padding",
        help="comma list: 'padding' (the scorer's padding-aware batches) and/or 'fixed' (a batch every "
        "--batch-size prompts), rows each (default padding)",
    )
    ap.add_argument("--num-prompts", type=int, default=None, help="score only the first N instructions (tests)")
    ap.add_argument("--out", help="write a markdown report here")
    args = ap.parse_args(argv)
    chunkings = [c for c in args.chunking.split(",") if c]
    if not chunkings or set(chunkings) - {"padding", "fixed"}:
        ap.error(f"--chunking: use padding and/or fixed, got {args.chunking!r}")
    if args.call_size < 1:
        ap.error(f"--call-size must be >= 1, got {args.call_size}")
    if args.num_prompts is not None and args.num_prompts < 1:
        ap.error(f"--num-prompts must be >= 1, got {args.num_prompts}")

    import numpy as np
    import onnxruntime
    import torch

    import headway.predict.encoder as encoder_mod
    import headway.predict.score as score_mod
    from headway.predict._errors import CheckpointError
    from headway.predict._paths import default_data_dir
    from headway.predict.score import Scorer

    padding_chunks = score_mod._padding_chunks

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    prompts = _instructions(data_dir)[: args.num_prompts]
    ckpts = [_checkpoint(m, args.max_length) for m in args.model.split(",") if m]
    try:  # every checkpoint is readable before any is timed; its trained length for the report
        trained = {c: int(_meta(c, what).get("max_length", 128)) for c, what in ckpts}
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    probes = [matmul_rate(args.threads)]  # before the first row and after each
    rows = []
    lengths: list[int | None] = [int(x) for x in args.score_max_length.split(",") if x] or [None]
    backends = [b for b in args.backends.split(",") if b]
    refused: list[str] = []
    combos = [(c, b, n, k) for c in ckpts for b in backends for n in lengths for k in chunkings]
    for (ckpt, what), backend, length, chunking in combos:
        chunks = padding_chunks if chunking == "padding" else _fixed_chunks
        score_mod._padding_chunks = encoder_mod._padding_chunks = chunks
        try:
            scorer: Any
            if what == SHIPPED_WHAT:
                scorer = _Shipped(backend, threads=args.threads, batch_size=args.batch_size, max_length=length)
            else:
                scorer = Scorer.from_checkpoint(
                    ckpt,
                    backend,
                    batch_size=args.batch_size,
                    threads=args.threads,
                    cache_size=0,
                    max_length=length,
                )
        except CheckpointError as exc:  # e.g. an int8 copy that does not rank like the float model
            refused.append(f"{ckpt.name} on {backend}: {exc}")
            print(f"{ckpt.name}: {backend:>5}: refused: {exc}", flush=True)
            continue
        rates = _throughput(scorer, prompts, args.repeats)
        calls = _throughput(scorer, prompts, args.repeats, args.call_size)
        lat = _latency_ms(scorer, list(reversed(prompts)), args.single)
        config = _encoder_config(ckpt, scorer.meta)
        flops = encoder_flops(batch_shapes(scorer, prompts), config) if config else None
        row = {
            "checkpoint": ckpt.name,
            "layers": _layers(config),
            "backend": backend,
            "max_length": scorer.max_length,
            "chunking": chunking,
            "calls_per_s_median": statistics.median(calls),
            "heldout_tau": _heldout_tau(scorer, data_dir),
            "prompts_per_s_median": statistics.median(rates),
            "prompts_per_s_best": max(rates),
            "gflops": None if flops is None else flops * statistics.median(rates) / len(prompts) / 1e9,
            "single_p50_ms": float(np.percentile(lat, 50)),
            "single_p90_ms": float(np.percentile(lat, 90)),
        }
        probes.append(matmul_rate(args.threads))
        row["matmul_rate"] = (probes[-2] + probes[-1]) / 2
        rows.append(row)
        print(
            f"{ckpt.name}: {backend:>5} ({scorer.max_length} tokens, {chunking} batches): "
            f"{row['prompts_per_s_median']:7.1f} prompts/s batched "
            f"(best {row['prompts_per_s_best']:.1f}), {row['calls_per_s_median']:.1f} in calls of {args.call_size}, "
            f"single p50 {row['single_p50_ms']:.1f} ms, "
            f"p90 {row['single_p90_ms']:.1f} ms, held-out tau_b vs gpt4 {row['heldout_tau']:.4f}",
            flush=True,
        )
    load_after = os.getloadavg()
    command = shlex.join(["python", "benchmarks/bench_predictor.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# Predictor scoring speed (CPU)",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        *[f"- checkpoint `{c.name}`: {what} (`max_length` {trained[c]} tokens)" for c, what in ckpts],
        f"- prompts: alpaca_eval's {len(prompts)} instructions, cache off, tokenization included, "
        f"batch size {args.batch_size}, dynamic padding (length-sorted batches); 'calls of {args.call_size}': "
        f"{args.call_size} prompts per call in a seeded random order, as a gateway's scoring batches",
        f"- threads: {args.threads}; CPU: {cpu_description()}",
        f"- torch {torch.__version__}, onnxruntime {onnxruntime.__version__}",
        f"- load average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f} "
        "(other processes share these cores)",
        f"- float32 matrix-multiply rate before the first row and after each: "
        f"{', '.join(f'{r:.1f}' for r in probes)} GFLOP/s (ONNX Runtime's MatMul, "
        f"{' x '.join(map(str, MATMUL_SHAPE))}, {args.threads} threads, best of 20); 'encoder GFLOP/s': the "
        "floating-point operations of the encoder's layers on the prompts as padded in the one-call batches, at "
        "the median batched rate, and their share of the mean of the two rates around the row (int8 rows count "
        "the same operations)",
        "",
        "Held-out tau_b: Kendall tau_b against gpt4's lengths on the default split's 154 test prompts",
        "(quality check of each backend's scores; the same for torch and onnx, int8 may differ).",
        "",
        "| checkpoint | encoder layers | backend | prompt tokens (max) | batches | prompts/s batched (median) | best "
        f"| prompts/s in calls of {args.call_size} (median) | single prompt p50 (ms) | p90 (ms) | held-out tau_b "
        "| encoder GFLOP/s (share) |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['checkpoint']} | {r['layers']} | {r['backend']} | {r['max_length']} | {r['chunking']} | "
            f"{r['prompts_per_s_median']:.1f} | {r['prompts_per_s_best']:.1f} | {r['calls_per_s_median']:.1f} | "
            f"{r['single_p50_ms']:.1f} | {r['single_p90_ms']:.1f} | {r['heldout_tau']:.4f} | "
            + ("?" if r["gflops"] is None else f"{r['gflops']:.1f} ({r['gflops'] / r['matmul_rate']:.0%})")
            + " |"
        )
    if refused:
        lines += ["", "Not measured (the scorer refused to load):", "", *[f"- {r}" for r in refused]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from headway._files import write_atomic

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out), text)
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_predictor"))
