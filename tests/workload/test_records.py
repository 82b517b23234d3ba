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


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("trace.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\r\n', "mooncake"),
        ("log.jsonl.gz", '{"prompt": "p", "output_tokens": 3}\n', "jsonl"),
        ("sharegpt.json", '[{"id": "a", "prompt": "some prompt", "response": "its answer"}]', "sharegpt"),
        ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,2\n", "azure"),
    ],
)
def test_a_utf8_byte_order_mark_is_read_past_in_every_format(
    write_text: TextWriter, tmp_path: Path, name: str, text: str, fmt: str
) -> None:
    # Windows tools (PowerShell 5's Out-File, Excel's "CSV UTF-8") start UTF-8 files with U+FEFF:
    # the CSV readers stepped over it, the JSON ones failed at line 1 ("Unexpected UTF-8 BOM")
    from headway.workload import load_workload

    path = write_text(tmp_path / name, "\ufeff" + text)
    w = load_workload(str(path))
    assert len(w) == 1 and w.meta["format"] == fmt
