"""The prefix routing benchmark (``benchmarks/bench_prefix_routing.py``) on a few requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factories import load_script


def test_every_scenario_gets_a_row_per_router_and_nothing_beats_the_unbounded_cache(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(data_dir))
    bench = load_script("benchmarks/bench_prefix_routing.py")
    argv = ["--num-requests", "200", "--routers", "cache-aware,least-outstanding", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "fleet_prefix.json").read_text())
    assert len(data["scenarios"]) == len(bench.SCENARIOS)
    for sc in data["scenarios"]:
        assert [r["router"] for r in sc["rows"]] == ["cache-aware", "least-outstanding"]
        assert all(r["hit_rate"] <= sc["ideal_hit_rate"] + 1e-12 for r in sc["rows"])
        assert sum(sum(r["replica_requests"]) for r in sc["rows"]) == 2 * sc["num_requests"]
    sessions = data["scenarios"][0]["rows"]
    assert sessions[0]["hit_rate"] > sessions[1]["hit_rate"]  # conversations kept where they are cached
    md = (tmp_path / "fleet_prefix.md").read_text()
    assert md.count("| cache-aware |") == len(bench.SCENARIOS)
    assert "Command: `python benchmarks/bench_prefix_routing.py --num-requests 200" in md
    assert (tmp_path / "fleet_prefix.png").stat().st_size > 10_000

    # the guard: a share above the unbounded cache's would be a simulator bug, and stops the run
    monkeypatch.setattr(bench, "ideal_hit_rate", lambda w, block_size: 0.0)
    with pytest.raises(SystemExit, match="above the ideal"):
        bench.main(argv)
