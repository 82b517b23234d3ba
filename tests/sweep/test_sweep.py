"""Sweeps: grid files, Ray vs in-process equality, failures kept with their parameters."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from headway.cli import main
from headway.sweep import Grid, load_grid, run_sweep

SMALL = Grid(policies=("fcfs", "sjf-oracle"), rates=(5.0, 7.0), seeds=(0, 1), num_requests=120)


def test_grid_enumerates_every_combination_in_order() -> None:
    tasks = SMALL.tasks()
    assert len(tasks) == 2 * 2 * 2
    assert [t.index for t in tasks] == list(range(8))
    assert {(t.policy, t.rate, t.seed) for t in tasks} == {
        (p, r, s) for p in ("fcfs", "sjf-oracle") for r in (5.0, 7.0) for s in (0, 1)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policies = 'fcfs'", "policies must be a list"),
        ("rates = [1.0]", "needs a 'policies' list"),
        ("policies = ['fcfs']\nrates = [-1.0]", "rates must be > 0"),
        ("policies = ['fcfs']\ncolour = 1", "unknown grid keys"),
        ("policies = ['fcfs'\n", "not valid TOML"),
        ("policies = ['fcfs']\n[policy_args.pars]\ntau = 0.5", "policy_args for policies not in the grid"),
    ],
)
def test_bad_grid_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_grid(path)


def _numbers(results: list) -> list:  # type: ignore[type-arg]
    # repr() is exact for floats and makes NaN compare equal to NaN
    return [(r.task.params(), repr(r.metrics)) for r in results]


@pytest.mark.slow
def test_ray_gives_identical_numbers_to_in_process() -> None:
    local = run_sweep(SMALL, use_ray=False)
    on_ray = run_sweep(SMALL, use_ray=True, num_cpus=2)
    assert all(r.error is None for r in local)
    assert _numbers(local) == _numbers(on_ray)  # float-for-float identical


def test_failed_task_is_reported_and_others_kept() -> None:
    grid = Grid(policies=("fcfs",), workloads=("default", "no-such-workload"), num_requests=50)
    results = run_sweep(grid, use_ray=False)
    ok, bad = results
    assert ok.error is None and ok.metrics is not None and ok.metrics["completed"] == 50
    assert bad.metrics is None and "no-such-workload" in (bad.error or "")
    assert bad.task.params()["workload"] == "no-such-workload"


def test_sweep_cli_writes_report_and_fails_loudly(tmp_path: Path) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs', 'nope']\nrates = [5.0]\nnum_requests = 40\n")
    out = tmp_path / "out"
    code = main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)])
    assert code == 1  # one task failed: unknown policy
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and "Unknown policy 'nope'" in rows[2]
    assert (out / "curves.png").stat().st_size > 0
    agg = (out / "aggregate.csv").read_text()
    assert "fcfs" in agg and not math.isnan(float(agg.splitlines()[1].split(",")[6]))
