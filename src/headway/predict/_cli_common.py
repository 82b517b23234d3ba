"""What the ``headway predictor`` subcommands share: the command line a result file records, progress lines."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

__all__ = ["_command_line", "_say"]


def _command_line() -> str:
    argv0 = Path(sys.argv[0]).name if sys.argv else "headway"
    prog = "python -m headway.predict" if argv0 == "__main__.py" else "headway"
    return shlex.join([*prog.split(), *sys.argv[1:]])


def _say(msg: str) -> None:
    print(msg, flush=True)
