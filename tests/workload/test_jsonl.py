"""The JSONL prompt-log format (``headway.workload._jsonl``): what a malformed log is told."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from headway.workload import WorkloadFormatError, load_workload

JsonlWriter = Callable[[Path, Sequence[object]], Path]  # the write_jsonl fixture (conftest.py)


def test_a_log_with_arrival_times_on_some_lines_only_is_refused_naming_the_first_without(
    write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    # read as untimed, it would replay as one burst at t = 0 and drop the times the other lines give
    records = [{"prompt": f"p{i}", "output_tokens": 5, "arrival_time": float(i)} for i in range(5)]
    del records[2]["arrival_time"]
    path = write_jsonl(tmp_path / "log.jsonl", records)
    with pytest.raises(WorkloadFormatError, match="arrival_time") as info:
        load_workload(str(path))
    assert info.value.line == 3 and "4 of the 5 lines" in str(info.value)


def test_a_log_with_arrival_times_on_every_line_or_none_is_read(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    timed = write_jsonl(tmp_path / "timed.jsonl", [{"prompt": "p", "output_tokens": 5, "arrival_time": 1.5}] * 2)
    assert load_workload(str(timed)).meta["timed"] is True
    untimed = write_jsonl(tmp_path / "untimed.jsonl", [{"prompt": "p", "output_tokens": 5}] * 2)
    assert load_workload(str(untimed)).meta["timed"] is False


@pytest.mark.parametrize("field", ["output_tokens", "prompt_tokens"])
def test_a_token_count_given_as_a_string_is_refused_as_the_predictors_reader_does(
    field: str, write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    from headway.predict.data import DataError, load_jsonl

    record: dict[str, object] = {"prompt": "p", "output_tokens": 5, "prompt_tokens": 7}
    record[field] = "120"
    path = write_jsonl(tmp_path / "log.jsonl", [record])
    with pytest.raises(WorkloadFormatError, match=f"{field}.*a JSON number"):
        load_workload(str(path))
    if field == "output_tokens":  # one file reads the same in both (the predictors read no prompt_tokens)
        with pytest.raises(DataError, match="must be an integer"):
            load_jsonl(path)
    assert load_workload(str(write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "p", "output_tokens": 120.0}])))


def test_a_timed_log_spanning_more_than_ten_years_is_refused_as_the_traces_are(
    write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    # 1e15 s (a timestamp in microseconds, say) was replayed: one request 30 million years after the
    # first, whose clock then counts in steps of 0.125 s
    records = [{"prompt": "p", "output_tokens": 5, "arrival_time": t} for t in (0.5, 1e15, 2.0)]
    path = write_jsonl(tmp_path / "log.jsonl", records)
    with pytest.raises(WorkloadFormatError, match=r"log\.jsonl:2: arrival_time: .*\(line 1\).*days") as info:
        load_workload(str(path))
    assert info.value.line == 2


def test_a_logs_own_request_ids_are_kept(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    # a log's ids were dropped for <file>-<k>: a run's per-request results could not be joined back to it
    records: list[dict[str, object]] = [
        {"id": "chatcmpl-9", "prompt": "p", "output_tokens": 5, "arrival_time": 2.0},
        {"id": 17, "prompt": "q", "output_tokens": 6, "arrival_time": 0.0},
        {"prompt": "r", "output_tokens": 7, "arrival_time": 1.0},
        {"id": "chatcmpl-9", "prompt": "s", "output_tokens": 8, "arrival_time": 3.0},
    ]
    path = write_jsonl(tmp_path / "log.jsonl", records)
    w = load_workload(str(path))
    assert [(r.request_id, r.num_output_tokens) for r in w.requests] == [
        ("17", 6),
        ("log-2", 7),
        ("chatcmpl-9", 5),
        ("chatcmpl-9@4", 8),
    ]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": ["x"], "prompt": "p", "output_tokens": 5}])
    with pytest.raises(WorkloadFormatError, match=r"bad\.jsonl:1: id: expected a string or an integer"):
        load_workload(str(bad))


def test_a_blank_prompt_is_refused_as_the_predictors_reader_does(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    # a prompt of white space only was read (1 token) and sent as it was; the predictors' reader refuses it
    from headway.predict.data import DataError, load_jsonl

    path = write_jsonl(
        tmp_path / "log.jsonl", [{"prompt": "p", "output_tokens": 5}, {"prompt": " \n", "output_tokens": 5}]
    )
    with pytest.raises(WorkloadFormatError, match=r"log\.jsonl:2: prompt: missing or empty prompt") as info:
        load_workload(str(path))
    assert info.value.line == 2
    with pytest.raises(DataError, match="empty prompt"):
        load_jsonl(path)


def test_a_bad_limit_is_refused_as_the_other_readers_do(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    from headway.workload import read_azure_trace
    from headway.workload._jsonl import read_jsonl_workload

    path = write_jsonl(tmp_path / "log.jsonl", [{"prompt": "p", "output_tokens": 5}])
    for read in (read_jsonl_workload, read_azure_trace):  # (-1 was taken as 0: "no requests")
        with pytest.raises(ValueError, match="limit must be a non-negative integer or None, got -1"):
            read(path, limit=-1)
