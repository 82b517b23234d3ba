"""JSON and CSV export round trips and file-name sanitizing."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import headway.metrics._export
from headway.core import Request
from headway.metrics import (
    GROUP_COLUMNS,
    REQUEST_COLUMNS,
    SUMMARY_COLUMNS,
    read_json,
    read_replica_json,
    request_rows,
    safe_filename,
    summarize,
    summary_row,
    write_groups_csv,
    write_json,
    write_requests_csv,
    write_summary_csv,
)
from headway.metrics._summary import ERROR_MESSAGE_KEY, ITL_KEY


def test_json_round_trip(tmp_path: Path, example_run: list[Request]) -> None:
    a = summarize(example_run, slo="ttft:1500 e2el:4000", name="fcfs")
    b = summarize(example_run[:1], name="ignored")
    path = write_json(tmp_path / "sub" / "summary.json", {"fcfs": a, "sjf:oracle": b})
    doc = json.loads(path.read_text())
    assert doc["format"] == "headway.metrics.summary" and doc["version"] == 1
    assert list(doc["runs"]) == ["fcfs", "sjf:oracle"]
    back = read_json(path)
    assert back["fcfs"].to_dict() == a.to_dict()
    assert back["sjf:oracle"].name == "sjf:oracle"  # the mapping key names the run
    assert back["sjf:oracle"].to_dict()["e2e"] == b.to_dict()["e2e"]


def test_json_keeps_per_replica_summaries(tmp_path: Path, example_run: list[Request]) -> None:
    whole = summarize(example_run, name="fcfs")
    r0, r1 = summarize(example_run[:1], name="fcfs@r0"), summarize(example_run[1:], name="fcfs@r1")
    path = write_json(tmp_path / "s.json", {"fcfs": whole}, replicas={"fcfs": {"r0": r0, "r1": r1}})
    back = read_replica_json(path)
    assert list(back) == ["fcfs"] and list(back["fcfs"]) == ["r0", "r1"]
    assert back["fcfs"]["r1"].to_dict() == r1.to_dict()
    assert read_json(path)["fcfs"].to_dict() == whole.to_dict()  # the runs read as before
    assert read_replica_json(write_json(tmp_path / "single.json", whole)) == {}
    with pytest.raises(KeyError, match="sjf"):
        write_json(tmp_path / "bad.json", {"fcfs": whole}, replicas={"sjf": {"r0": r0}})


def test_json_is_strict_with_undefined_values(tmp_path: Path, mk_aborted: Callable[..., Request]) -> None:
    s = summarize([mk_aborted("x", 0.0)], name="all-aborted")
    path = write_json(tmp_path / "s.json", s)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = read_json(path)["all-aborted"]
    assert back.e2e.count == 0 and math.isnan(back.e2e.mean) and math.isnan(back.jain_fairness)


def test_read_json_rejects_other_files(tmp_path: Path) -> None:
    p = tmp_path / "other.json"
    p.write_text('{"runs": {}}')
    with pytest.raises(ValueError, match="not a headway metrics summary"):
        read_json(p)


def _parse(cell: str) -> object:
    return None if cell == "" else cell


def test_requests_csv_round_trip(tmp_path: Path, example_run: list[Request]) -> None:
    example_run[3].extra[ERROR_MESSAGE_KEY] = "This model's maximum context length is 16 tokens, 'quoted', too"
    example_run[0].extra[ERROR_MESSAGE_KEY] = "a finished request's stale message is not written"
    path = write_requests_csv(tmp_path / "requests.csv", example_run, slo="ttft:1500 e2el:4000")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == REQUEST_COLUMNS
        rows = list(reader)
    expected = request_rows(example_run, slo="ttft:1500 e2el:4000")
    assert len(rows) == len(expected) == 5
    for got, want in zip(rows, expected, strict=True):
        for col in REQUEST_COLUMNS:
            w = want[col]
            if w is None:
                assert got[col] == "", col
            elif isinstance(w, bool):
                assert got[col] == ("true" if w else "false")
            elif isinstance(w, float):
                assert float(got[col]) == w, col  # repr round-trips exactly
            else:
                assert got[col] == str(w), col
    a, b, c, d, e = rows
    assert (a["state"], a["slo_met"], b["slo_met"], c["slo_met"]) == ("finished", "true", "false", "true")
    assert float(b["tpot"]) == 0.5 and float(b["normalized_latency"]) == 0.8 and c["tpot"] == ""
    assert (d["state"], d["abort_reason"]) == ("aborted", "client_gone")
    assert (d["slo_met"], d["e2e_latency"]) == ("false", "")
    assert e["abort_reason"] == "unknown" and a["abort_reason"] == ""
    assert d["abort_message"] == "This model's maximum context length is 16 tokens, 'quoted', too"
    assert a["abort_message"] == e["abort_message"] == ""
    assert (c["tier"], a["num_preemptions"], a["num_recomputed_tokens"]) == ("premium", "1", "8")


def test_requests_csv_without_slo(tmp_path: Path, example_run: list[Request]) -> None:
    path = write_requests_csv(tmp_path / "r.csv", example_run)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(r["slo_met"] == "" for r in rows)


def test_the_prefix_cache_hit_rate_can_be_recomputed_from_the_csv_files(
    tmp_path: Path, example_run: list[Request]
) -> None:
    # the hit rate is in summary.json: the per-request CSV must carry what it is made of, and
    # summary.csv the rate itself, or neither file lets a reader check it
    example_run[0].num_cached_tokens = 8  # example_run[4] never reached the engine: None
    for r in example_run[1:4]:
        r.num_cached_tokens = 0
    example_run[2].num_cached_tokens = 5
    summary = summarize(example_run, name="fcfs")
    requests_csv = write_requests_csv(tmp_path / "requests.csv", example_run)
    summary_csv = write_summary_csv(tmp_path / "summary.csv", {"fcfs": summary})
    with requests_csv.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["num_cached_tokens"] != ""]
    assert len(rows) == 4
    recomputed = sum(int(r["num_cached_tokens"]) for r in rows) / sum(int(r["num_prompt_tokens"]) for r in rows)
    assert summary.prefix_cache_hit_rate == pytest.approx(recomputed)
    with summary_csv.open(newline="") as fh:
        [row] = list(csv.DictReader(fh))
    assert float(row["prefix_cache_hit_rate"]) == summary.prefix_cache_hit_rate
    no_cache = write_summary_csv(tmp_path / "none.csv", {"x": summarize(example_run[4:])})
    with no_cache.open(newline="") as fh:
        assert next(csv.DictReader(fh))["prefix_cache_hit_rate"] == ""


def test_summary_csv_one_row_per_run(tmp_path: Path, example_run: list[Request]) -> None:
    runs = {"fcfs": summarize(example_run, slo="tpot:600"), "srpt-oracle": summarize(example_run[:3])}
    path = write_summary_csv(tmp_path / "summary.csv", runs)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == SUMMARY_COLUMNS
        rows = list(reader)
    assert [r["name"] for r in rows] == ["fcfs", "srpt-oracle"]
    first = rows[0]
    assert first["aborted_by_reason"] == "client_gone=1;unknown=1"
    assert float(first["e2e_mean"]) == runs["fcfs"].e2e.mean
    assert float(first["ttft_p90"]) == pytest.approx(1.8)
    assert (first["slo"], first["num_slo_met"], float(first["slo_attainment"])) == ("tpot:600", "2", 0.4)
    assert rows[1]["slo"] == "" and rows[1]["goodput"] == ""
    assert summary_row(runs["fcfs"])["normalized_latency_p50"] == pytest.approx(1.0)


def test_summary_csv_has_itl_columns(tmp_path: Path, example_run: list[Request]) -> None:
    example_run[0].extra[ITL_KEY] = [0.5, 1.5, 1.0]  # a streamed request's gaps between tokens
    runs = {"streamed": summarize(example_run), "simulated": summarize(example_run[1:])}
    path = write_summary_csv(tmp_path / "summary.csv", runs)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert (rows[0]["itl_count"], float(rows[0]["itl_mean"]), float(rows[0]["itl_max"])) == ("3", 1.0, 1.5)
    assert rows[1]["itl_count"] == "0" and rows[1]["itl_mean"] == ""  # nothing streamed: undefined, empty


def test_groups_csv_one_row_per_tenant_and_tier(tmp_path: Path, example_run: list[Request]) -> None:
    runs = {"fcfs": summarize(example_run, slo="e2el:3000"), "no-slo": summarize(example_run)}
    path = write_groups_csv(tmp_path / "groups.csv", runs)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == GROUP_COLUMNS
        rows = list(reader)
    keys = [(r["run"], r["group_kind"], r["group"]) for r in rows]
    assert keys[:4] == [("fcfs", "tenant", "a"), ("fcfs", "tenant", "b"), ("fcfs", "tier", "premium"),
                        ("fcfs", "tier", "standard")]  # fmt: skip
    assert len(keys) == 8 and keys[4][0] == "no-slo"
    s = runs["fcfs"]
    by = {(r["group_kind"], r["group"]): r for r in rows if r["run"] == "fcfs"}
    # only C (tenant b, premium: e2e 2 s) meets e2e <= 3 s; A and B took 4 s
    assert by["tenant", "b"]["num_slo_met"] == "1" and by["tenant", "a"]["num_slo_met"] == "0"
    assert float(by["tenant", "b"]["goodput"]) == pytest.approx(1 / s.makespan)
    assert float(by["tier", "premium"]["goodput"]) == pytest.approx(s.goodput)
    assert float(by["tenant", "a"]["e2e_mean"]) == pytest.approx(4.0)
    assert by["tenant", "a"]["num_requests"] == "3" and by["tenant", "a"]["num_aborted"] == "1"
    no_slo = next(r for r in rows if r["run"] == "no-slo")
    assert no_slo["goodput"] == "" and no_slo["num_slo_met"] == ""


def test_summary_csv_rejects_duplicate_names(tmp_path: Path, example_run: list[Request]) -> None:
    s = summarize(example_run, name="same")
    with pytest.raises(ValueError, match="two summaries"):
        write_summary_csv(tmp_path / "x.csv", [s, s])


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("fcfs", "fcfs"),
        ("sjf:oracle", "sjf_oracle"),
        ("pars-v2 (k=3)", "pars-v2_k_3_"),
        ("a/b\\c", "a_b_c"),
        ("../etc", "_etc"),
        ("...", "run"),
        ("", "run"),
        ("ü", "_"),
    ],
)
def test_safe_filename(name: str, stem: str) -> None:
    assert safe_filename(name) == stem


def test_a_per_request_csv_interrupted_mid_row_keeps_the_earlier_one(
    tmp_path: Path, mk_finished: Callable[..., Request], monkeypatch: pytest.MonkeyPatch
) -> None:
    reqs = [mk_finished(f"r{i}", i * 0.5, ttft=0.1, e2e=1.0, n_out=10) for i in range(20)]
    path = write_requests_csv(tmp_path / "requests_fcfs.csv", reqs)
    before = path.read_bytes()
    real_rows = headway.metrics._export.request_rows

    def rows_then_ctrl_c(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from list(real_rows(*args, **kwargs))[:5]
        raise KeyboardInterrupt

    monkeypatch.setattr(headway.metrics._export, "request_rows", rows_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_requests_csv(path, reqs[:10])
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
