"""What the ``headway predictor`` subcommands share: the command line a result file records, progress
lines, the table options, and packed predictors named on the command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from headway.predict._errors import PredictError

__all__ = ["_add_table_options", "_check_table_out", "_command_line", "_packed_file", "_packed_predictor", "_say"]


def _command_line() -> str:
    argv0 = Path(sys.argv[0]).name if sys.argv else "headway"
    prog = "python -m headway.predict" if argv0 == "__main__.py" else "headway"
    return shlex.join([*prog.split(), *sys.argv[1:]])


def _say(msg: str) -> None:
    print(msg, flush=True)


def _add_table_options(p: argparse.ArgumentParser) -> None:
    """The options the cross-source tables share: ShareGPT's extra training prompts, threads, the output file."""
    p.add_argument(
        "--sharegpt-extra",
        type=int,
        metavar="N",
        help="at most N of ShareGPT's training-only prompts (default all, 12,759; 0 for none)",
    )
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--out", metavar="FILE.md", help="also write the markdown tables here")


def _check_table_out(out: str | None) -> None:
    """``--out FILE.md`` checked before the run (it is written when the run ends, minutes later):
    PredictError when it is a folder or its folder cannot be made or written."""
    from headway._help import unwritable

    if out is None:
        return
    path = Path(out)
    if not out or path.is_dir():
        raise PredictError(f"--out {out!r}: is a folder; give the Markdown file's path")
    if (bad := unwritable(path.parent)) is not None:
        raise PredictError(f"--out {out}: {bad[0]} {bad[1]}")


def _packed_predictor(value: str, flag: str, **settings: Any) -> Any:
    """``shipped`` (the default pack) or ``FILE.npz`` (a file, or a packaged one's name), loaded with
    ``settings``; None for anything else (a checkpoint directory)."""
    if value != "shipped" and not value.endswith(".npz"):
        return None
    from headway.predict.shipped import ShippedPredictor

    return ShippedPredictor(None if value == "shipped" else _packed_file(value, flag), **settings)


def _packed_file(value: str, flag: str = "--checkpoint") -> Path:
    """``FLAG FILE.npz``: a packed predictor file, or the name of one that ships (``pars-minilm-alpaca.npz``)."""
    from headway.predict.shipped import shipped_predictor_path

    path = Path(value)
    if not path.is_file() and path.name == value:
        path = shipped_predictor_path(value)
    if not path.is_file():
        raise PredictError(f"{flag} {value}: no such packed predictor (a file, or the name of a packaged one)")
    return path
