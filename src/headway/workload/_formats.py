"""The public file formats :func:`~headway.workload.load_workload` reads, and how it tells them apart.

A file's format is told from its first non-blank line (JSON keys, or a CSV header's columns), or
given (``format=``, ``--format``); a folder holding ``instructions.jsonl`` is alpaca_eval's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from headway.workload._datasets import TokenCounter, read_alpaca_eval, read_alpaca_eval_outputs, read_sharegpt
from headway.workload._errors import WorkloadFormatError
from headway.workload._jsonl import JSONL_KEYS, read_jsonl_workload
from headway.workload._records import reading
from headway.workload._spec import Workload
from headway.workload._traces import read_azure_trace, read_burstgpt_trace, read_mooncake_trace, read_vidur_trace

__all__ = ["DEFAULT_ALPACA_MODEL", "MODEL_FORMATS", "available_formats", "is_format", "read_file"]

DEFAULT_ALPACA_MODEL = "Meta-Llama-3-8B-Instruct"
"""The alpaca_eval model whose output lengths a workload takes when none is named."""

Reader = Callable[[Path, str | None, TokenCounter | None], Workload]
"""A format's reader: the file, the answering model (formats that hold several), a token counter."""


def _read_alpaca(path: Path, model: str | None, count_tokens: TokenCounter | None) -> Workload:
    folder = path if path.is_dir() else path.parent
    instructions = path if path.is_file() else folder / "instructions.jsonl"
    lengths = folder / "output_lengths_long.csv.gz"
    if not lengths.exists() and (folder / "output_lengths_long.csv").exists():
        lengths = folder / "output_lengths_long.csv"
    return read_alpaca_eval(instructions, lengths, model or DEFAULT_ALPACA_MODEL, count_tokens=count_tokens)


_FORMATS: dict[str, Reader] = {
    "azure": lambda path, model, count: read_azure_trace(path),
    "vidur": lambda path, model, count: read_vidur_trace(path),
    "mooncake": lambda path, model, count: read_mooncake_trace(path),
    "burstgpt": lambda path, model, count: read_burstgpt_trace(path),
    "sharegpt": lambda path, model, count: read_sharegpt(path, count_tokens=count),
    "alpaca-eval": _read_alpaca,
    "alpaca-eval-outputs": lambda path, model, count: read_alpaca_eval_outputs(path, model=model, count_tokens=count),
    "jsonl": lambda path, model, count: read_jsonl_workload(path, count_tokens=count),
}
MODEL_FORMATS = frozenset({"alpaca-eval", "alpaca-eval-outputs"})
"""Formats whose ``model`` option picks the answering model."""

_JSON_KEYS: tuple[tuple[frozenset[str], str], ...] = (
    (JSONL_KEYS, "jsonl"),
    (frozenset({"timestamp", "input_length", "output_length"}), "mooncake"),
    (frozenset({"conversations"}), "sharegpt"),
    (frozenset({"prompt", "response"}), "sharegpt"),
    (frozenset({"instruction", "output"}), "alpaca-eval-outputs"),
    (frozenset({"idx", "instruction"}), "alpaca-eval"),
)
_CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TIMESTAMP", "azure"),
    ("num_prefill_tokens", "vidur"),
    ("Response tokens", "burstgpt"),
)


_SNIFF_CHARS = 1 << 20
"""How much of a JSON list is read to find its first record's keys."""


def available_formats() -> list[str]:
    """File formats :func:`~headway.workload.load_workload` reads (``format=``)."""
    return sorted(_FORMATS)


def is_format(name: str) -> bool:
    """Whether ``name`` is a format :func:`read_file` reads."""
    return name in _FORMATS


def _sniff_format(path: Path) -> str:
    """Tell a file's format from its first non-blank line."""
    if path.is_dir():
        if (path / "instructions.jsonl").exists():
            return "alpaca-eval"
        raise FileNotFoundError(2, "no instructions.jsonl (alpaca_eval) in workload folder", str(path))
    with reading(path) as f:
        first = ""
        for line in f:
            if line.strip():
                first = line.strip()
                break
        head = first + f.read(_SNIFF_CHARS) if first.startswith("[") else ""
    if not first:  # every reader would find no requests in it
        raise WorkloadFormatError(path, None, "empty file (no line but blank ones): no requests", show_value=False)
    hint = f"pass format= (--format) one of {', '.join(available_formats())}"
    if first.startswith("["):  # a JSON list: the keys of its first record, when it is short enough to read
        try:
            record, _ = json.JSONDecoder().raw_decode(head, head.index("{"))
            keys = set(record)
        except (ValueError, TypeError):
            return "sharegpt"
        return next((fmt for needed, fmt in _JSON_KEYS if needed <= keys), "sharegpt")
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            raise WorkloadFormatError(
                path, None, f"cannot tell the format: first line is not JSON; {hint}", show_value=False
            ) from None
        for needed, fmt in _JSON_KEYS:
            if needed <= keys:
                return fmt
        raise WorkloadFormatError(
            path, None, f"cannot tell the format from JSON keys {sorted(keys)}; {hint}", show_value=False
        )
    header = {h.strip().lstrip("\ufeff") for h in first.split(",")}
    for column, fmt in _CSV_COLUMNS:
        if column in header:
            return fmt
    raise WorkloadFormatError(
        path, 1, f"cannot tell the format from the first line; {hint}", field="header", value=first[:200]
    )


def read_file(
    path: Path, fmt: str | None = None, *, model: str | None = None, count_tokens: TokenCounter | None = None
) -> Workload:
    """The workload in ``path``, of format ``fmt`` (None: told from the file)."""
    if not path.exists():
        raise FileNotFoundError(2, "workload file not found", str(path))
    return _FORMATS[fmt or _sniff_format(path)](path, model, count_tokens)
