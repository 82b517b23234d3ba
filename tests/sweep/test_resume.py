"""``headway sweep --resume``: an interrupted sweep continued from its partial report ends with the
report an uninterrupted run writes, running only the tasks that had not finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import headway
import headway.sweep._runner as runner
from headway.cli import main
from headway.sweep import Grid, run_sweep

GRID = """\
policies = ['fcfs', 'sjf-oracle']
rates = [5.0, 7.0]
seeds = [0, 1]
num_requests = 60
slo = 'ttft:2000'
[limits]
ttft_p99 = 2.0
"""

_FILES = ("results.json", "results.csv", "aggregate.csv", "capacity.csv")


class _Runs:
    """Which tasks ran (their indices), and Ctrl-C in the task after the first ``stop_after``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ran: list[int] = []
        self.stop_after: int | None = None
        real = runner.run_task

        def run_task(task, grid):  # type: ignore[no-untyped-def]
            if self.stop_after is not None and len(self.ran) == self.stop_after:
                raise KeyboardInterrupt
            self.ran.append(task.index)
            return real(task, grid)

        monkeypatch.setattr(runner, "run_task", run_task)

    def sweep(self, grid: Path, out: Path, *flags: str, stop_after: int | None = None) -> int:
        self.ran.clear()
        self.stop_after = stop_after
        return main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out), *flags])


def _report(out: Path) -> dict[str, str]:
    return {name: (out / name).read_text() for name in _FILES if (out / name).exists()}


def _grid_file(tmp_path: Path, text: str = GRID, name: str = "g.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_resumed_sweep_writes_the_report_an_uninterrupted_one_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _Runs(monkeypatch)
    grid = _grid_file(tmp_path)
    assert runs.sweep(grid, tmp_path / "whole") == 0
    whole = _report(tmp_path / "whole")
    assert len(whole) == 4 and json.loads(whole["results.json"])["complete"] is True

    out = tmp_path / "out"
    assert runs.sweep(grid, out, stop_after=3) == 130  # Ctrl-C in the fourth task
    doc = json.loads((out / "results.json").read_text())
    assert (doc["complete"], doc["tasks_finished"]) == (False, 3)
    capsys.readouterr()

    assert runs.sweep(grid, out, "--resume", stop_after=2) == 130  # resumed, and interrupted again
    assert runs.ran == [3, 4]
    text = " ".join(capsys.readouterr().out.split())
    assert f"sweep 8 tasks (in-process): 3 resumed from {out / 'results.json'}, 5 to run" in text
    assert "interrupted: 5 of 8 tasks finished" in text
    assert json.loads((out / "results.json").read_text())["tasks_finished"] == 5

    assert runs.sweep(grid, out, "--resume") == 0
    assert runs.ran == [5, 6, 7]  # only the tasks not finished ran
    text = " ".join(capsys.readouterr().out.split())
    assert "5 resumed from" in text and "3 to run" in text
    assert "simulating (5 resumed)" in text and "8/8" in text  # the bar starts at the resumed count
    assert _report(out) == whole  # results.json, the tables: the uninterrupted run's, to the byte


def test_resuming_a_complete_report_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _Runs(monkeypatch)
    grid = _grid_file(tmp_path)
    out = tmp_path / "out"
    assert runs.sweep(grid, out) == 0
    whole = _report(out)
    capsys.readouterr()
    assert runs.sweep(grid, out, "--resume") == 0
    assert runs.ran == []
    text = " ".join(capsys.readouterr().out.split())
    assert f"all 8 resumed from {out / 'results.json'}: nothing to run" in text
    assert _report(out) == whole


def test_a_sweep_is_resumed_from_the_partial_report_beside_a_complete_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the folder held another sweep's complete report: the interrupted run went to out/interrupted
    runs = _Runs(monkeypatch)
    out = tmp_path / "out"
    other = _grid_file(tmp_path, "policies = ['fcfs']\nnum_requests = 30\n", name="other.toml")
    assert runs.sweep(other, out) == 0
    grid = _grid_file(tmp_path)
    assert runs.sweep(grid, tmp_path / "whole") == 0
    assert runs.sweep(grid, out, stop_after=2) == 130
    assert json.loads((out / "interrupted" / "results.json").read_text())["tasks_finished"] == 2
    capsys.readouterr()
    assert runs.sweep(grid, out, "--resume") == 0
    assert runs.ran == [2, 3, 4, 5, 6, 7]
    assert f"2 resumed from {out / 'interrupted' / 'results.json'}" in " ".join(capsys.readouterr().out.split())
    assert _report(out) == _report(tmp_path / "whole")
    assert not (out / "interrupted").exists()  # its tasks are in the complete report


def test_a_task_that_failed_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-time,1,2\n")
    runs = _Runs(monkeypatch)
    grid = _grid_file(tmp_path, f"policies = ['fcfs']\nworkloads = ['default', {str(bad)!r}]\nnum_requests = 40\n")
    out = tmp_path / "out"
    assert runs.sweep(grid, out) == 1
    first = _report(out)
    assert runs.sweep(grid, out, "--resume") == 1  # (the trace is still malformed)
    assert runs.ran == [1]
    assert _report(out) == first


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda g: g.replace("num_requests = 60", "num_requests = 50"), "num_requests 60 there, 50 now"),
        (lambda g: g.replace("rates = [5.0, 7.0]", "rates = [5.0, 8.0]"), "rates [5.0, 7.0] there, [5.0, 8.0] now"),
        (lambda g: g + "[policy_args.fcfs]\n", 'policy_args {} there, {"fcfs": {}} now'),
        (lambda g: g.replace("slo = 'ttft:2000'\n", ""), 'slo "ttft:2000" there, null now'),
    ],
    ids=["num_requests", "rates", "policy_args", "slo"],
)
def test_resume_refuses_the_report_of_another_grid_and_names_what_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], change: object, said: str
) -> None:
    runs = _Runs(monkeypatch)
    out = tmp_path / "out"
    assert runs.sweep(_grid_file(tmp_path), out, stop_after=3) == 130
    partial = _report(out)
    capsys.readouterr()
    assert runs.sweep(_grid_file(tmp_path, change(GRID)), out, "--resume") == 2  # type: ignore[operator]
    err = " ".join(capsys.readouterr().err.split())
    assert f"--resume: {out / 'results.json'} is another sweep's report: {said}" in err
    assert "Resuming would mix two sweeps' results" in err
    assert runs.ran == [] and _report(out) == partial


def test_resume_takes_new_limits_and_computes_the_capacity_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # limits change no task's result: they decide the capacity table, computed from all the results
    runs = _Runs(monkeypatch)
    tighter = GRID.replace("ttft_p99 = 2.0", "ttft_p99 = 0.5")
    assert runs.sweep(_grid_file(tmp_path, tighter, name="tighter.toml"), tmp_path / "whole") == 0
    out = tmp_path / "out"
    assert runs.sweep(_grid_file(tmp_path), out, stop_after=5) == 130
    assert runs.sweep(_grid_file(tmp_path, tighter), out, "--resume") == 0
    assert runs.ran == [5, 6, 7]
    whole, resumed = _report(tmp_path / "whole"), _report(out)
    assert resumed["capacity.csv"] == whole["capacity.csv"]
    assert json.loads(resumed["results.json"])["capacity"] == json.loads(whole["results.json"])["capacity"]


def test_resume_refuses_a_changed_workload_file_or_another_headway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt": f"q{i}", "output_tokens": 20 + i}) + "\n" for i in range(30)))
    runs = _Runs(monkeypatch)
    grid = _grid_file(tmp_path, f"policies = ['fcfs']\nworkloads = [{str(log)!r}]\nseeds = [0, 1, 2]\n")
    out = tmp_path / "out"
    assert runs.sweep(grid, out, stop_after=1) == 130
    capsys.readouterr()
    monkeypatch.setattr(headway, "__version__", "0.0.0+other")
    assert runs.sweep(grid, out, "--resume") == 2
    assert f"headway {headway.__version__} wrote it" not in (err := capsys.readouterr().err)
    assert "wrote it, this is headway 0.0.0+other" in " ".join(err.split())
    monkeypatch.undo()
    runs = _Runs(monkeypatch)
    with log.open("a") as fh:
        fh.write(json.dumps({"prompt": "one more", "output_tokens": 9}) + "\n")
    assert runs.sweep(grid, out, "--resume") == 2
    assert f"workload file {log} is not what it was (its SHA-256 differs)" in " ".join(capsys.readouterr().err.split())
    assert runs.ran == []


def test_resume_needs_a_report_of_this_sweep_in_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _Runs(monkeypatch)
    grid = _grid_file(tmp_path)
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--resume"]) == 2
    assert "--resume continues the sweep whose report is in --out: name that folder" in capsys.readouterr().err
    out = tmp_path / "out"
    assert runs.sweep(grid, out, "--resume") == 2
    assert f"--resume: {out} holds no sweep report (results.json) to resume" in capsys.readouterr().err
    assert not out.exists()  # nothing made
    out.mkdir()
    before = {"complete": False, "tasks_finished": 0, "tasks_in_grid": 8, "tasks": [], "aggregate": []}
    (out / "results.json").write_text(json.dumps(before))  # a report of a headway without --resume
    assert runs.sweep(grid, out, "--resume") == 2
    assert "it does not record the grid it ran" in capsys.readouterr().err
    (out / "results.json").write_text("{")
    assert runs.sweep(grid, out, "--resume") == 2
    assert f"--resume: {out / 'results.json'} cannot be read" in capsys.readouterr().err
    assert runs.ran == []


def test_run_sweep_runs_only_the_tasks_not_done() -> None:
    grid = Grid(policies=("fcfs",), seeds=(0, 1, 2), num_requests=40)
    whole = run_sweep(grid, use_ray=False)
    seen: list[int] = []
    again = run_sweep(grid, use_ray=False, done=[whole[0], whole[2]], on_result=lambda r: seen.append(r.task.index))
    assert seen == [1] and [(r.task, repr(r.metrics)) for r in again] == [(r.task, repr(r.metrics)) for r in whole]
    with pytest.raises(ValueError, match="not this grid's"):
        run_sweep(Grid(policies=("sjf-oracle",), seeds=(0, 1, 2), num_requests=40), use_ray=False, done=whole[:1])


@pytest.mark.slow
def test_a_sweep_resumed_on_ray_gives_the_numbers_of_one_run_in_process() -> None:
    pytest.importorskip("ray")
    grid = Grid(policies=("fcfs", "sjf-oracle"), rates=(5.0, 7.0), seeds=(0, 1), num_requests=120)
    whole = run_sweep(grid, use_ray=False)
    resumed = run_sweep(grid, use_ray=True, num_cpus=2, done=whole[:5])
    assert [(r.task, repr(r.metrics)) for r in resumed] == [(r.task, repr(r.metrics)) for r in whole]


def test_resume_refuses_a_built_in_workload_whose_data_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a built-in data set is read from the data folder ($HEADWAY_DATA_DIR): another folder, or the same
    # file changed, gives other results, so the report of the earlier run is not resumed from
    data = tmp_path / "data"
    (data / "vidur_traces").mkdir(parents=True)
    trace = data / "vidur_traces" / "splitwise_code.csv"
    rows = "".join(f"{0.5 * i},{100 + 7 * i},{10 + i}\n" for i in range(40))
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(data))
    runs = _Runs(monkeypatch)
    grid_text = "policies = ['fcfs']\nworkloads = ['vidur-code']\nseeds = [0, 1, 2]\nnum_requests = 9\n"
    grid = _grid_file(tmp_path, grid_text)
    out = tmp_path / "out"
    assert runs.sweep(grid, out, stop_after=1) == 130
    with trace.open("a") as fh:
        fh.write("20.5,999,99\n")
    capsys.readouterr()
    assert runs.sweep(grid, out, "--resume") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"workload vidur-code's data ({trace}) is not what it was (its SHA-256 differs)" in err
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(tmp_path / "empty"))  # a data folder without it
    assert runs.sweep(grid, out, "--resume") == 2
    assert f"workload vidur-code's data ({trace}) is not there now" in " ".join(capsys.readouterr().err.split())
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(data))
    assert runs.ran == []
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)  # as it was: resumed
    assert runs.sweep(grid, out, "--resume") == 0
    assert runs.ran == [1, 2]


_PLUGIN_POLICY = """\
from headway.core import Policy


class ResumePlug(Policy):
    def key(self, request, now):
        return (request.arrival_time,)
"""


def test_resume_refuses_a_policy_plugin_whose_code_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util
    import sys

    from headway.core._policy import _POLICIES

    path = tmp_path / "resume_plug.py"
    path.write_text(_PLUGIN_POLICY)
    spec = importlib.util.spec_from_file_location("resume_plug_for_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "resume_plug_for_test", module)
    spec.loader.exec_module(module)
    _POLICIES.register("test-resume-plug")(module.ResumePlug)
    try:
        runs = _Runs(monkeypatch)
        grid = _grid_file(tmp_path, "policies = ['test-resume-plug']\nseeds = [0, 1, 2]\nnum_requests = 30\n")
        out = tmp_path / "out"
        assert runs.sweep(grid, out, stop_after=1) == 130
        path.write_text(_PLUGIN_POLICY.replace("request.arrival_time,", "-request.arrival_time,"))
        capsys.readouterr()
        assert runs.sweep(grid, out, "--resume") == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"policy test-resume-plug's code ({path}) is not what it was (its SHA-256 differs)" in err
        assert runs.ran == []
        path.write_text(_PLUGIN_POLICY)
        assert runs.sweep(grid, out, "--resume") == 0
        assert runs.ran == [1, 2]
    finally:
        _POLICIES.unregister("test-resume-plug")
