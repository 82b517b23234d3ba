"""Command-line pieces shared by headway's subcommands: help formatting, user-facing errors,
report folders."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

__all__ = [
    "CLIError",
    "CLIParser",
    "HelpFormatter",
    "add_shared_prefix_args",
    "default_out_dir",
    "describe_error",
    "fail",
    "key_value",
    "name_flags",
    "plain_text",
    "prepare_out_dir",
    "refuse_abbreviations",
    "unwritable",
]


def plain_text(doc: str) -> str:
    """A docstring's text without its reST markup (``x``, :class:`~a.B`, *emphasis*), for a terminal."""
    doc = re.sub(r":\w+:`~(?:[\w.]*\.)?([^`]+)`", r"\1", doc)  # :class:`~a.B`: B, as Sphinx shows it
    doc = re.sub(r":\w+:`([^`]+)`", r"\1", doc)
    doc = re.sub(r"\*\*?([^*\s][^*]*)\*\*?", r"\1", doc)  # *emphasis* and **strong**
    return doc.replace("``", "")


def add_shared_prefix_args(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The workload options that give requests shared prefixes (``headway simulate`` and ``headway
    bench serve``): ``--system-prompts``, ``--system-prompt-tokens``, ``--think-time``."""
    group.add_argument(
        "--system-prompts",
        type=int,
        default=None,
        metavar="K",
        help="put one of K shared system prompts before every prompt (their KV blocks are shared: prefix caching)",
    )
    group.add_argument(
        "--system-prompt-tokens", type=int, default=None, help="length of each system prompt (default 1000)"
    )
    group.add_argument(
        "--think-time",
        type=float,
        default=None,
        help="sharegpt-sessions: mean seconds between an answer and the next turn (default 10)",
    )


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def name_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` (a library's error) told with a command's flags: each setting name in ``flags``
    becomes its flag (``rate must be a positive finite number`` -> ``--rate must be ...``)."""
    return re.sub(r"(?<![\w-])[a-z][a-z_]*(?![\w-])", lambda m: flags.get(m[0], m[0]), message)


def describe_error(exc: BaseException) -> str:
    """An error's message for the user: an OSError as ``path: what`` (not ``[Errno 2] ...``),
    a truncated compressed file as such."""
    if isinstance(exc, OSError) and (exc.strerror or exc.filename is not None):
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, EOFError):
        return f"a compressed input ended early ({exc})"
    return str(exc)


def fail(message: str) -> int:
    """A CLI error: ``headway: error: ...`` on stderr; returns the exit status 2."""
    print(f"headway: error: {message}", file=sys.stderr)
    return 2


def nonempty(text: str) -> str:
    """argparse ``type`` of a name or path flag: an empty value is an error, not "the default" (an
    empty path would read as the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type`` for ``KEY=VALUE`` arguments: ``(KEY, VALUE)``, KEY not empty."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def default_out_dir(kind: str) -> Path:
    """``headway-out/<kind>-<time>``, with ``-2``, ``-3``... when a run in the same second has it."""
    base = Path("headway-out") / time.strftime(f"{kind}-%Y%m%d-%H%M%S")
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def unwritable(directory: Path) -> tuple[Path, str] | None:
    """Why files cannot be made in ``directory`` (which may not exist yet): its nearest existing
    ancestor (itself included) and ``"is not a directory"`` or ``"is not writable"``; None when
    they can."""
    top = directory
    while not top.exists() and top.parent != top:
        top = top.parent
    if not top.is_dir():
        return top, "is not a directory"
    if not os.access(top, os.W_OK | os.X_OK):
        return top, "is not writable"
    return None


def prepare_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create the report folder ``path`` (and its parents) now, so that a path that cannot hold
    one fails before any work is done: CLIError naming ``flag`` and the path."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CLIError(f"{flag} {p}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"{flag} {p}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {p}: the folder is not writable")
    return p


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help only where it adds something: not when the
    default is unset, ``False`` or empty (an optional value, a flag, a repeatable option), nor
    when the help already states its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default in ("", [], ()) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


class CLIParser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line and a pointer to ``--help``, instead of the
    whole usage block first (thirty lines for ``headway simulate``). Subcommands' parsers are of
    this class too (argparse makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the options)\n")


def refuse_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Refuse a flag cut short, in every (sub)command: argparse would take ``--policy`` for
    ``--policy-arg``, ``--preset`` for ``--preset-dir`` or ``--mode`` for ``--model`` where the
    full flag is another one, and fail on the value, or worse, accept it."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                refuse_abbreviations(child)
