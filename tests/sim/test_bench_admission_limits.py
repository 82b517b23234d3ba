"""The watermark benchmark (``benchmarks/bench_admission_limits.py``) on the trace's first requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from factories import load_script


def test_a_table_per_policy_and_cache_size_and_the_limits_reach_the_engine(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(data_dir))
    bench = load_script("benchmarks/bench_admission_limits.py")
    assert bench.main(["--num-requests", "1500", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "admission_limits.md").read_text()
    assert "Command: `python benchmarks/bench_admission_limits.py --num-requests 1500" in md
    watermark, queued = md.split("\n## vLLM's API server's max_num_queued_tokens")
    tables = watermark.split("\n### ")[1:]
    assert [t.splitlines()[0] for t in tables] == [
        f"{p}, {b:,} blocks" for b in bench.BLOCKS for p in bench.POLICIES
    ]
    for table in tables:
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| 0")]
        assert [r[0] for r in rows] == [f"| {w:g}" for w in bench.WATERMARKS]
        assert rows[0][-2] == "+0.0%"  # the change is against no watermark
    # a small KV cache preempts FCFS; the largest watermark admits so few that it preempts less
    fcfs = [line.split(" | ") for line in tables[0].splitlines() if line.startswith("| 0")]
    preemptions = [int(r[1].replace(",", "")) for r in fcfs]
    assert preemptions[0] > 0 and preemptions[-1] < preemptions[0]
    # the token limit: a table per policy, a row per limit; a tighter limit turns more away and the
    # admitted start sooner
    limits = queued.split("\n### ")[1:]
    assert [t.splitlines()[0] for t in limits] == [f"{p}, the preset's KV cache" for p in bench.POLICIES]
    for table in limits:
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
        assert [r[0] for r in rows] == ["| none", *(f"| {q:,}" for q in bench.QUEUED_TOKENS[1:])]
        turned_away = [float(r[1].rstrip("%")) for r in rows]
        ttft_p99 = [float(r[2].split(" / ")[1]) for r in rows]
        assert turned_away[0] == 0.0 and turned_away[-1] > 0.0 and turned_away == sorted(turned_away)
        assert ttft_p99[-1] < ttft_p99[0]
    assert (tmp_path / "admission_limits.png").stat().st_size > 10_000
