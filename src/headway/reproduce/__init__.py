"""``headway reproduce``: re-run the anchor papers' experiments in simulation.

Each reproduction prints and writes one claims table per paper, as
``<out>/reproduce-<name>.md`` with its plots beside it (default ``headway-out/reproduce-<time>``,
as ``simulate`` and ``sweep`` do; the documentation's pages are written with ``--out
docs/results``). A row holds the paper's claim, the setting headway ran, the mean over seeds with
its spread, and a verdict from a rule fixed in code before the run (see
:mod:`headway.reproduce._claims`): reproduced, direction only, or not reproduced with the measured
reason. Scenarios are fixed in code (see each module's setup lines), not tuned until they agree.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from headway._help import plain_text
from headway.reproduce._claims import ClaimRow, Rule, Verdict, band_rule
from headway.reproduce._common import Experiment, counting_runs
from headway.reproduce._report import print_rows, write_report

__all__ = [
    "EXPERIMENTS",
    "ClaimRow",
    "Experiment",
    "Rule",
    "Verdict",
    "add_reproduce_parser",
    "band_rule",
    "run_reproduction",
]

EXPERIMENTS: tuple[str, ...] = ("pars", "uniboost", "driftsched")
DEFAULT_NUM_SEEDS = 3
MAX_NUM_SEEDS = 1000
"""The most --seeds takes (each seed runs every simulation of an experiment once more: minutes)."""


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
    num_seeds: int = DEFAULT_NUM_SEEDS,
    echo: bool = True,
    command: str | None = None,
) -> list[ClaimRow]:
    """Run reproduction ``name`` (or ``"all"``) over seeds ``seed .. seed + num_seeds - 1``, write
    ``<out_dir>/reproduce-<name>.md`` and return its claim rows.

    ``predictor`` (PARS only): a ``headway.predict`` checkpoint directory that scores both
    sources' bursts in the headline rows instead of each source's own pairwise head.
    """
    if num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
    names = list(EXPERIMENTS) if name == "all" else [name]
    for n in names:
        _runner(n)  # validate every name before running anything
    out = Path(out_dir)
    rows: list[ClaimRow] = []
    written: list[Path] = []
    for n in names:
        kwargs: dict[str, Any] = {"quick": quick, "seeds": tuple(range(seed, seed + num_seeds))}
        if n == "pars" and predictor is not None:
            kwargs["predictor"] = predictor
        if echo:  # (an experiment prints its claims when it ends: minutes later without --quick)
            seeds = f"seed {seed}" if num_seeds == 1 else f"seeds {seed}-{seed + num_seeds - 1}"
            print(f"reproducing {n} ({seeds}{', quick' if quick else ''}) ...", file=sys.stderr, flush=True)
        try:
            with _progress(n, echo and sys.stderr.isatty()):
                exp = _runner(n)(out, **kwargs)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say which reports are kept (written as each ended)
            if echo:
                kept = f"; kept: {', '.join(map(str, written))}" if written else ""
                print(f"interrupted in {n}: its report is not written{kept}", file=sys.stderr, flush=True)
            raise
        cmd = command or f"headway reproduce {n} --out {out} --seed {seed} --seeds {num_seeds}" + (
            " --quick" if quick else ""
        )
        written.append(write_report(exp, out, cmd))
        if echo:
            print_rows(exp.rows, f"{exp.title} ({exp.wall_time:.1f} s)")
        rows += exp.rows
    return rows


@contextlib.contextmanager
def _progress(name: str, show: bool) -> Iterator[None]:
    """While an experiment runs, when ``show``: a line on stderr that counts its simulations, names the
    last one's policy and the time so far (an experiment runs for minutes and prints when it ends)."""
    if not show:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}: {task.completed:.0f} simulations{task.fields[last]}"))
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(name, total=None, last="")

        def on_run(policy: str) -> None:
            bar.update(task, advance=1, last=f" (last: {policy})")

        with counting_runs(on_run):
            yield


def _main(args: argparse.Namespace) -> int:
    from headway._help import CLIError, default_out_dir, prepare_out_dir

    if args.seed < 0:
        raise CLIError(f"--seed must be >= 0, got {args.seed}")
    if args.seeds < 1:
        raise CLIError(f"--seeds must be >= 1, got {args.seeds}")
    if args.seeds > MAX_NUM_SEEDS:
        raise CLIError(f"--seeds must be at most {MAX_NUM_SEEDS:,}, got {args.seeds}")
    if args.predictor is not None and args.experiment not in ("pars", "all"):
        raise CLIError(f"--predictor scores prompts for pars only, not {args.experiment}")
    if args.predictor is not None:  # before the predictors pars trains or loads first (minutes)
        from headway.predict.model import read_checkpoint_meta

        try:
            read_checkpoint_meta(args.predictor)
        except ValueError as exc:
            raise CLIError(f"--predictor: {exc}") from None
    if args.out == "":
        raise CLIError("--out: empty path; give the report folder")
    out = prepare_out_dir(args.out or default_out_dir("reproduce"))  # before any simulation
    command = getattr(args, "command_line", None)
    rows = run_reproduction(
        args.experiment,
        out,
        args.quick,
        predictor=args.predictor,
        seed=args.seed,
        num_seeds=args.seeds,
        command=command,
    )
    counts = {v: sum(r.verdict is v for r in rows) for v in Verdict}
    print(
        f"{counts[Verdict.REPRODUCED]} of {len(rows)} claims reproduced, {counts[Verdict.DIRECTION_ONLY]} "
        f"direction only, {counts[Verdict.NOT_REPRODUCED]} not reproduced; report in {out}/"
    )
    return 0


def add_reproduce_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``reproduce`` to an argparse subparsers object; sets ``func`` to the handler.

    ``headway reproduce pars|uniboost|driftsched|all [--out DIR] [--quick] [--predictor DIR] [--seed N]
    [--seeds K]``
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "reproduce",
        help="re-run the PARS / UniBoost / DriftSched experiments in simulation",
        description=plain_text(__doc__ or ""),
    )
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"], help="which paper's experiments (all: each in turn)")
    p.add_argument(
        "--out",
        default=None,
        help="report folder (default: headway-out/reproduce-<time>; the documentation's pages: docs/results)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller runs, for CI (pars trains its predictors first, once: minutes)"
    )
    p.add_argument(
        "--predictor",
        default=None,
        metavar="DIR",
        help="PARS: a checkpoint that scores both sources' bursts in the headline rows (default: each source's "
        "own pairwise head, trained on the source's training split as the paper trains it)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_NUM_SEEDS,
        help=f"number of seeds, at most {MAX_NUM_SEEDS:,}; each row is their mean with its spread "
        f"(default {DEFAULT_NUM_SEEDS})",
    )
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
