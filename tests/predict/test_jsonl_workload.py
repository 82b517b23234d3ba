"""The predictor's JSONL is also a workload format (``headway simulate`` / ``headway bench serve``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headway.predict.data import load_dataset
from headway.workload import WorkloadFormatError, load_workload

RECORDS = [
    {"prompt": "Write a poem.", "output_tokens": 120, "model": "m1", "arrival_time": 0.5, "tenant": "a"},
    {"prompt": "Say hi.", "output_tokens": 3, "model": "m1", "arrival_time": 0.0},
    {"prompt": "Prove it.", "output_tokens": 900, "model": "m2", "arrival_time": 2.0, "prompt_tokens": 42},
]


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_timed_log_replays_as_recorded(tmp_path: Path) -> None:
    w = load_workload(str(_write(tmp_path / "log.jsonl", RECORDS)))
    assert w.meta["format"] == "jsonl" and w.meta["timed"] is True
    assert w.meta["models"] == {"m1": 2, "m2": 1}
    by_prompt = {r.prompt: r for r in w.requests}
    assert [r.prompt for r in w.requests] == ["Say hi.", "Write a poem.", "Prove it."]
    assert by_prompt["Write a poem."].arrival_time == 0.5 and by_prompt["Write a poem."].tenant_id == "a"
    assert by_prompt["Prove it."].num_prompt_tokens == 42 and by_prompt["Prove it."].num_output_tokens == 900
    assert by_prompt["Say hi."].tenant_id == "default"


def test_an_untimed_log_gets_generated_arrivals(tmp_path: Path) -> None:
    records = [{k: v for k, v in r.items() if k != "arrival_time"} for r in RECORDS]
    path = str(_write(tmp_path / "log.jsonl", records))
    burst = load_workload(path, arrivals="burst")
    assert [r.arrival_time for r in burst.requests] == [0.0, 0.0, 0.0]
    paced = load_workload(path, arrivals="poisson", rate=2.0, seed=1)
    assert paced.meta["timed"] is False and max(r.arrival_time for r in paced.requests) > 0.0
    assert sorted(r.num_output_tokens for r in paced.requests) == [3, 120, 900]


def test_the_same_file_is_predictor_data(tmp_path: Path) -> None:
    data = load_dataset(str(_write(tmp_path / "log.jsonl", RECORDS)))
    assert [e.length for e in data.examples] == [120, 3, 900]
    assert [e.model for e in data.examples] == ["m1", "m1", "m2"]


def test_a_logged_timeout_is_the_clients(tmp_path: Path) -> None:
    records = [{**RECORDS[0], "timeout": 1.5}, RECORDS[1]]
    path = str(_write(tmp_path / "log.jsonl", records))
    assert [r.timeout for r in load_workload(path).requests] == [None, 1.5]
    assert [r.timeout for r in load_workload(path, client_timeout=9.0).requests] == [9.0, 9.0]


@pytest.mark.parametrize(
    ("record", "field"),
    [({"prompt": "x", "output_tokens": 0}, "output_tokens"), ({"prompt": "", "output_tokens": 5}, "prompt"),
     ({"prompt": "x", "output_tokens": 5, "timeout": -1}, "timeout")],
)  # fmt: skip
def test_a_bad_line_is_named(tmp_path: Path, record: dict[str, object], field: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [RECORDS[0], record])
    with pytest.raises(WorkloadFormatError, match=field) as info:
        load_workload(str(path), format="jsonl")
    assert ":2" in str(info.value)


def test_reasoning_tokens_count_in_the_output_as_the_predictors_count_them(tmp_path: Path) -> None:
    # the predictors' reader takes output_tokens as the answer and adds reasoning_tokens (the engine
    # generates both); the simulator had read output_tokens alone, 10 tokens for a 410-token generation
    records = [
        {"prompt": "Think hard.", "output_tokens": 10, "reasoning_tokens": 400},
        {"prompt": "Answer.", "output_tokens": 20, "reasoning_tokens": 0},
        {"prompt": "Plain.", "output_tokens": 30},
    ]
    path = _write(tmp_path / "log.jsonl", records)
    assert [e.length for e in load_dataset(str(path)).examples] == [410, 20, 30]
    by_prompt = {r.prompt: r.num_output_tokens for r in load_workload(str(path)).requests}
    assert by_prompt == {"Think hard.": 410, "Answer.": 20, "Plain.": 30}


@pytest.mark.parametrize("value", [-1, "400", 2.5])
def test_a_bad_reasoning_tokens_is_named(tmp_path: Path, value: object) -> None:
    path = _write(tmp_path / "bad.jsonl", [RECORDS[0], {"prompt": "x", "output_tokens": 5, "reasoning_tokens": value}])
    with pytest.raises(WorkloadFormatError, match=r"bad\.jsonl:2: reasoning_tokens"):
        load_workload(str(path))


def test_a_byte_order_mark_reads_the_same_in_both(tmp_path: Path) -> None:
    # a log saved by a Windows tool starts with U+FEFF: both readers step over it
    path = tmp_path / "log.jsonl"
    path.write_text("\ufeff" + "".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    assert [e.length for e in load_dataset(str(path)).examples] == [120, 3, 900]
    assert sorted(r.num_output_tokens for r in load_workload(str(path)).requests) == [3, 120, 900]
