"""Fixtures for workload tests: small trace-file writers (the shared data folder: tests/conftest.py)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def _write_text(path: Path, text: str) -> Path:
    """Write ``text`` (gzip-compressed when the name ends in .gz)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def _write_jsonl(path: Path, records: Sequence[object]) -> Path:
    """One JSON document per line (gzip-compressed when the name ends in .gz)."""
    return _write_text(path, "".join(json.dumps(r) + "\n" for r in records))


TextWriter = Callable[[Path, str], Path]
JsonlWriter = Callable[[Path, Sequence[object]], Path]


@pytest.fixture(scope="session")
def write_text() -> TextWriter:
    """Write a small text file (gzipped when its name ends in .gz); session-scoped for hypothesis."""
    return _write_text


@pytest.fixture(scope="session")
def write_jsonl() -> JsonlWriter:
    """Write records as JSONL (gzipped when the name ends in .gz); session-scoped for hypothesis."""
    return _write_jsonl
