"""What the ``headway predictor`` subcommands share: the command line a result file records, progress lines."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["_add_table_options", "_check_table_out", "_command_line", "_say"]


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
    from headway.predict._errors import PredictError

    if out is None:
        return
    path = Path(out)
    if not out or path.is_dir():
        raise PredictError(f"--out {out!r}: is a folder; give the Markdown file's path")
    if (bad := unwritable(path.parent)) is not None:
        raise PredictError(f"--out {out}: {bad[0]} {bad[1]}")
