"""``headway predictor cross-source-finetune``: leave-one-source-out folds of the encoder fine-tuned on a
mix of the other sources (:mod:`headway.predict.crossfinetune`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from headway._help import HelpFormatter, nonempty
from headway.predict._cli_common import _add_table_options, _check_table_out, _command_line, _say
from headway.predict._errors import PredictError

__all__ = ["add_finetune_parser"]

_FOLDS = "alpaca_eval,arena_hard_v2,sharegpt,codealpaca"


def _cmd(args: argparse.Namespace, command_line: str, say: Callable[[str], None]) -> int:
    from headway.predict._paths import default_cache_dir
    from headway.predict.crossfinetune import FinetuneRecipe, finetune_all, finetune_fold, fold_table, training_device
    from headway.predict.crosssource import (
        SOURCES,
        cross_source_matrix,
        exclude_shared_prompts,
        left_out_note,
        load_source,
        write_result,
    )
    from headway.predict.model import encoder_config

    _check_table_out(args.out)
    if args.save_checkpoint and args.held_out is not None:
        raise PredictError("--save-checkpoint trains on every source (no fold): leave out --held-out")
    held = [h for h in (args.held_out if args.held_out is not None else _FOLDS).split(",") if h]
    for h in held:
        if h not in SOURCES:
            raise PredictError(f"--held-out: unknown source {h!r}; choose from {', '.join(SOURCES)}")
    if not held:
        raise PredictError(f"--held-out: choose at least one of {', '.join(SOURCES)}")
    if args.sharegpt_extra is not None and args.sharegpt_extra < 0:
        raise PredictError(f"--sharegpt-extra: a count >= 0, got {args.sharegpt_extra}")
    recipe = FinetuneRecipe(
        encoder=args.encoder,
        encoder_layers=args.encoder_layers,
        top_layers=args.top_layers,
        max_length=args.max_length,
        truncation=args.truncation,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        head_lr=args.head_lr,
        weighting=args.weighting,
        head_init=args.head_init,
        dropout=not args.no_dropout,
        ridge_alpha=args.ridge_alpha,
        seed=args.seed,
    )
    training_device(args.device)  # both refused before the data is read
    encoder_config(recipe.encoder, recipe.encoder_layers)
    sources, left_out = exclude_shared_prompts(
        [load_source(name, args.data_dir, max_extra=args.sharegpt_extra) for name in SOURCES]
    )
    baseline = cross_source_matrix(sources, {}, [])
    cache = default_cache_dir() / "lower-states"
    folds = []
    text = ""
    runs: list[str | None] = [None] if args.save_checkpoint else list(held)
    for h in runs:
        if h is None:
            say(f"every source, its held-out split left out ({recipe.label}) -> {args.save_checkpoint}")
            fold = finetune_all(recipe, sources, args.save_checkpoint, cache=cache, threads=args.threads, log=say,
                                meta={"command": command_line}, device=args.device)  # fmt: skip
        else:
            say(f"fold: {h} held out ({recipe.label})")
            fold = finetune_fold(recipe, sources, h, cache=cache, threads=args.threads, log=say, device=args.device)
        folds.append(fold)
        result = fold_table(recipe, sources, folds, baseline)
        result.command = command_line
        result.notes += [
            f"recipe: {recipe.label}; PARS margin ranking loss (margin {recipe.margin:g}) on pairs of one source "
            f"x model whose lengths differ by a relative {recipe.delta:g} or more; head lr {recipe.head_lr:g}, "
            f"seed {recipe.seed}; the lower layers frozen, their outputs computed once and cached",
            ("training set: every source's training prompts (its 20 % held-out split left out, scored in italic) "
             if args.save_checkpoint else
             "training sets: the other sources' training prompts (their 20 % held-out split left out) ")
            + (f"and up to {args.sharegpt_extra} of ShareGPT's training-only prompts" if args.sharegpt_extra is not None
               else "and all of ShareGPT's training-only prompts"),
            left_out_note(left_out),
        ]  # fmt: skip
        result.notes += [
            f"{_run_name(f.held_out)}: {f.steps} steps, {f.pairs_seen} pairs, loss {f.loss_first:.3f} -> "
            f"{f.loss_last:.3f}, training {f.train_seconds / 60:.1f} min, lower-layer cache {f.lower_seconds:.0f} s "
            f"({args.threads} threads" + (f", on {args.device}" if args.device != "cpu" else "") + ")"
            for f in folds
        ]
        if args.save_checkpoint:
            result.notes.append(
                "no source held out: every cell is in-source (italic), so the held-out columns read n/a; the "
                "recipe's tau_b on sources it never saw is measured by the leave-one-source-out folds (run "
                "without --save-checkpoint)"
            )
        result.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}; the machine was shared")
        text = result.to_markdown(recipe.label)
        if args.out:
            write_result(result, args.out, recipe.label)
            say(f"wrote {args.out} ({len(folds)} of {len(runs)} runs)")
    if args.save_checkpoint:
        say(f"wrote the checkpoint {args.save_checkpoint} (pack it with benchmarks/predictor_shipped.py)")
    print(text)
    return 0


def _run_name(held_out: str | None) -> str:
    return f"fold {held_out} held out" if held_out else "every source"


def add_finetune_parser(sub: Any, guarded: Callable[[Callable[[argparse.Namespace], int]], Any]) -> None:
    """Register ``cross-source-finetune`` under the predictor's sub-commands."""
    from headway.predict._finetune_recipe import HEAD_INITS, TRUNCATIONS, WEIGHTINGS, FinetuneRecipe

    d = FinetuneRecipe()
    p = sub.add_parser(
        "cross-source-finetune",
        help="fine-tune the encoder's top layers on a mix of sources, evaluate on the held-out source",
        description="Leave-one-source-out folds: for each --held-out source, the top --top-layers layers of the "
        "encoder and a linear head are fine-tuned with PARS's margin ranking loss on the other sources (balanced "
        "mix, pairs inside one source x model), the lower layers' outputs computed once and cached; Kendall "
        "tau_b is measured on the held-out source (all prompts, every model). The table is rewritten after "
        "each fold.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--held-out",
        help=f"sources held out, one fold each, in this order (comma-separated; default {_FOLDS})",
    )
    p.add_argument(
        "--save-checkpoint",
        type=nonempty,
        metavar="DIR",
        help="no folds: train once on every source's training prompts (held-out splits left out and scored, "
        "in-source) and write a predictor checkpoint there (the fine-tuned layers merged into the full encoder)",
    )
    p.add_argument(
        "--encoder", type=nonempty, default=d.encoder, help="packaged encoder (minilm, mpnet) or a local directory"
    )
    p.add_argument(
        "--encoder-layers",
        type=int,
        default=d.encoder_layers,
        metavar="N",
        help="keep only the encoder's first N layers (default: all); scoring takes about N / L of the time",
    )
    p.add_argument("--top-layers", type=int, default=d.top_layers, help="top layers fine-tuned")
    p.add_argument("--max-length", type=int, default=d.max_length, help="prompt tokens kept")
    p.add_argument(
        "--truncation",
        choices=TRUNCATIONS,
        default=d.truncation,
        help="which tokens of a longer prompt are kept: its first, or its first and last halves",
    )
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per fold")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per step, shared among sources")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate of the top layers")
    p.add_argument("--head-lr", type=float, default=d.head_lr, help="learning rate of the head")
    p.add_argument("--weighting", choices=WEIGHTINGS, default=d.weighting, help="share of each source in a step")
    p.add_argument(
        "--head-init",
        choices=HEAD_INITS,
        default=d.head_init,
        help="random, or ridge: start from a ridge head on the untrained encoder's pooled features",
    )
    p.add_argument("--no-dropout", action="store_true", help="train the top layers without their dropout")
    p.add_argument("--ridge-alpha", type=float, default=d.ridge_alpha, help="penalty of the ridge head start")
    p.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="seed of each step's draw, the head's start and dropout: numpy and torch (default %(default)s)",
    )
    p.add_argument("--device", default="cpu", help="where torch trains: cpu, or cuda (a GPU)")
    _add_table_options(p)
    p.add_argument(
        "--data-dir", type=nonempty, metavar="DIR", help="shared data (default $HEADWAY_DATA_DIR or ../shared/data)"
    )

    def run(args: argparse.Namespace) -> int:
        return _cmd(args, _command_line(), _say)

    p.set_defaults(func=guarded(run))
