"""The record readers shared by the trace formats (``headway.workload._records``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from headway.workload import WorkloadFormatError
from headway.workload._records import jsonl_records

TextWriter = Callable[[Path, str], Path]  # the write_text fixture (conftest.py)


@pytest.mark.parametrize("end", ["\n", "\r\n", ""])
def test_a_jsonl_line_cut_short_is_told_at_its_end(write_text: TextWriter, tmp_path: Path, end: str) -> None:
    # the line break is no part of the record: a line cut off after '"b": ' fails where it ends
    # (column 15), not at column 1 of a line after it
    path = write_text(tmp_path / "log.jsonl", '{"a": 1}\n{"a": 1, "b": ' + end)
    with pytest.raises(WorkloadFormatError, match=r"log\.jsonl:2: invalid JSON \(Expecting value; column 15\)"):
        list(jsonl_records(path))
