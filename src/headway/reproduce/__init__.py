"""``headway reproduce``: re-run the anchor papers' experiments in simulation.

Each reproduction prints and writes a table of *claim / paper value / measured / ratio /
reproduced*, plus tables and plots, as ``<out>/<name>.md``. A claim that does not
reproduce is reported as such, with the numbers that show why; scenarios are fixed in
code (see each module's setup lines), not tuned until they agree.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from headway.reproduce._common import ClaimRow, Experiment, print_rows, write_report

__all__ = ["EXPERIMENTS", "ClaimRow", "Experiment", "add_reproduce_parser", "run_reproduction"]

EXPERIMENTS: tuple[str, ...] = ("pars", "uniboost", "driftsched")


def _runner(name: str) -> Callable[..., Experiment]:
    if name == "pars":
        from headway.reproduce.pars import run as run_pars

        return run_pars
    if name == "uniboost":
        from headway.reproduce.uniboost import run as run_uniboost

        return run_uniboost
    if name == "driftsched":
        from headway.reproduce.driftsched import run as run_driftsched

        return run_driftsched
    raise ValueError(f"unknown reproduction {name!r}; choose one of {', '.join(EXPERIMENTS)} or 'all'")


def run_reproduction(
    name: str,
    out_dir: str | Path,
    quick: bool = False,
    *,
    predictor: str | None = None,
    seed: int = 0,
    echo: bool = True,
    command: str | None = None,
) -> list[ClaimRow]:
    """Run reproduction ``name`` (or ``"all"``), write ``<out_dir>/<name>.md`` and return its claim rows.

    ``predictor`` (PARS only): a ``headway.predict`` checkpoint directory whose scores
    replace the noisy oracle for the ``pars`` policy.
    """
    names = list(EXPERIMENTS) if name == "all" else [name]
    for n in names:
        _runner(n)  # validate every name before running anything
    out = Path(out_dir)
    rows: list[ClaimRow] = []
    for n in names:
        kwargs: dict[str, Any] = {"quick": quick, "seed": seed}
        if n == "pars" and predictor is not None:
            kwargs["predictor"] = predictor
        exp = _runner(n)(out, **kwargs)
        cmd = command or f"headway reproduce {n} --out {out}" + (" --quick" if quick else "")
        write_report(exp, out, cmd)
        if echo:
            print_rows(exp.rows, f"{exp.title} ({exp.wall_time:.1f} s)")
        rows += exp.rows
    return rows


def _main(args: argparse.Namespace) -> int:
    from headway._help import CLIError, prepare_out_dir

    if args.seed < 0:
        raise CLIError(f"--seed must be >= 0, got {args.seed}")
    if args.predictor is not None and args.experiment not in ("pars", "all"):
        raise CLIError(f"--predictor scores prompts for pars only, not {args.experiment}")
    if not args.out:
        raise CLIError("--out: empty path; give the report folder")
    prepare_out_dir(args.out)  # before any simulation
    command = "headway " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else None
    rows = run_reproduction(
        args.experiment, args.out, args.quick, predictor=args.predictor, seed=args.seed, command=command
    )
    print(f"{sum(r.reproduced for r in rows)} of {len(rows)} claims reproduced; report in {args.out}/")
    return 0


def add_reproduce_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``reproduce`` to an argparse subparsers object; sets ``func`` to the handler.

    ``headway reproduce pars|uniboost|driftsched|all [--out DIR] [--quick] [--predictor DIR] [--seed N]``
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "reproduce",
        help="re-run the PARS / UniBoost / DriftSched experiments in simulation",
        description=__doc__,
    )
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    p.add_argument("--out", default="reproduce-out", help="report folder (default: reproduce-out)")
    p.add_argument("--quick", action="store_true", help="smaller runs (< 60 s each), for CI")
    p.add_argument(
        "--predictor",
        default=None,
        metavar="DIR",
        help="PARS: a headway.predict checkpoint to score prompts instead of the noisy oracle",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m headway.reproduce EXPERIMENT ...``, as ``headway reproduce EXPERIMENT ...`` (a
    leading ``reproduce``, as older command lines have it, is accepted too)."""
    from headway.cli import main as headway_main

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["reproduce"]:
        args = args[1:]
    return headway_main(["reproduce", *args])
