"""Sweeps: grid files, Ray vs in-process equality, failures kept with their parameters."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

from headway.cli import main
from headway.sweep import Grid, load_grid, max_rates, run_sweep

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
        ("policies = ['fcfs']\nrates = [-1.0]", "rates must be numbers > 0"),
        ("policies = ['fcfs']\nrates = ['a']", "rates must be numbers > 0, got 'a'"),
        ("policies = ['fcfs']\nseeds = [-1]", "seeds must be integers >= 0, got -1"),
        ("policies = ['fcfs']\nnum_requests = 'abc'", "num_requests must be an integer >= 1, got 'abc'"),
        ("policies = ['fcfs', 'fcfs']", "policies lists fcfs more than once"),
        ("policies = ['fcfs', 'nope']", "Unknown policy 'nope'"),
        ("policies = ['fcfs']\npresets = ['llama3-8b-h100:2', 'nope']", "unknown preset 'nope'"),
        ("policies = ['fcfs']\nworkloads = ['no-such.csv']", "'no-such.csv' is neither a built-in name"),
        ("policies = ['fcfs']\nslo = 'ttft=5'", "invalid SLO pair 'ttft=5'"),
        ("policies = ['fcfs']\nscorer_tau = 2", "scorer_tau must be a number in"),
        ("policies = ['fcfs']\nmax_model_len = 0", "max_model_len must be an integer >= 1, got 0"),
        ("policies = ['fcfs']\nmax_model_len = 100000000", "max_model_len 100,000,000 does not fit the KV cache"),
        ("policies = ['fcfs']\ncolour = 1", "unknown grid keys"),
        ("policies = ['fcfs'\n", "not valid TOML"),
        ("policies = ['fcfs']\n[policy_args.pars]\ntau = 0.5", "policy_args for policies not in the grid"),
        ("policies = ['fcfs']\nrates = [1.0]\nlimits = 2", "limits must be a table of metric = bound"),
        ("policies = ['fcfs']\nrates = [1.0]\n[limits]\nttft_p999 = 2", "unknown metric 'ttft_p999'; valid: e2e_mean"),
        ("policies = ['fcfs']\nrates = [1.0]\n[limits]\nttft_p99 = 0", "ttft_p99 must be a number > 0, got 0"),
        ("policies = ['fcfs']\nrates = [1.0]\n[limits]\nslo_attainment = 0.9", "slo_attainment needs an slo"),
        ("policies = ['fcfs']\nrates = [1.0]\nslo = 'ttft:1'\n[limits]\nslo_attainment = 90", "is a share"),
        ("policies = ['fcfs']\n[limits]\nttft_p99 = 2", "limits need rates"),
        ("policies = ['fcfs']\nrouter = 'nearest'", "Unknown router 'nearest'"),
        ("policies = ['fcfs']\nasync_scheduling = 1", "async_scheduling must be true or false, got 1"),
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


def _malformed_trace(tmp_path: Path) -> str:
    """A file that passes the grid's checks (it exists) and fails its task when read."""
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-time,1,2\n")
    return str(bad)


def test_failed_task_is_reported_and_others_kept(tmp_path: Path) -> None:
    bad = _malformed_trace(tmp_path)
    grid = Grid(policies=("fcfs",), workloads=("default", bad), num_requests=50)
    results = run_sweep(grid, use_ray=False)
    ok, failed = results
    assert ok.error is None and ok.metrics is not None and ok.metrics["completed"] == 50
    assert failed.metrics is None and "bad.csv:2" in (failed.error or "")
    assert failed.task.params()["workload"] == bad


def test_score_based_policies_get_noisy_oracle_scores_as_in_simulate() -> None:
    def run(tau: float) -> dict[str, float]:
        grid = Grid(policies=("pars",), num_requests=300, rates=(8.0,), scorer_tau=tau)
        (result,) = run_sweep(grid, use_ray=False)
        assert result.error is None and result.metrics is not None
        return result.metrics

    assert run(0.0)["norm_mean"] > run(1.0)["norm_mean"]  # a better ranking, lower per-token latency
    tau_arg = Grid(policies=("pars",), num_requests=300, rates=(8.0,), policy_args={"pars": {"tau": 0.0}})
    (result,) = run_sweep(tau_arg, use_ray=False)
    assert repr(result.metrics) == repr(run(0.0))  # a tau in policy_args wins over scorer_tau (repr: NaN == NaN)


def test_max_model_len_reaches_every_task() -> None:
    # vLLM's --max-model-len, as headway simulate's: the default workload's prompts of 600 tokens or
    # more are refused, and outputs stop where prompt and output reach 600
    grid = Grid(policies=("fcfs",), num_requests=200, max_model_len=600)
    (capped,) = run_sweep(grid, use_ray=False)
    (whole,) = run_sweep(dataclasses.replace(grid, max_model_len=None), use_ray=False)
    assert capped.metrics["completed"] < whole.metrics["completed"] == 200


def test_a_preset_entry_may_name_a_fleet() -> None:
    grid = Grid(policies=("fcfs",), presets=("llama3-8b-l4", "llama3-8b-l4:2"), num_requests=200, rates=(6.0,))
    one, two = run_sweep(grid, use_ray=False)
    assert one.metrics is not None and two.metrics is not None
    assert two.metrics["e2e_mean"] < one.metrics["e2e_mean"]  # twice the engines, less waiting


def test_router_and_engine_settings_reach_every_task(tmp_path: Path) -> None:
    # what a prefix-aware router, async scheduling or prefix caching buy a fleet, swept as headway simulate
    # runs them (--router, --async-scheduling, --no-enable-prefix-caching); a Mooncake trace whose prompts
    # share 512-token prefixes, so that caching and routing matter
    from headway.sim import CacheConfig, SchedulerConfig, simulate
    from headway.sim._fleet import fleet_presets
    from headway.workload import load_workload

    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 80 * i, "input_length": 2048, "output_length": 40 + i % 50,
                                         "hash_ids": [i % 4, 10 + i % 8, 100 + i, 1000 + i]}) + "\n"
                             for i in range(200)))  # fmt: skip

    def by_hand(router: str, **engine: bool) -> float:
        cache = CacheConfig(enable_prefix_caching=engine.get("enable_prefix_caching", True))
        scheduler = SchedulerConfig(async_scheduling=engine.get("async_scheduling", False))
        res = simulate(load_workload(trace, seed=0), "fcfs", preset=fleet_presets("llama3-8b-a100:2"), router=router,
                       cache=cache, scheduler=scheduler)  # fmt: skip
        return sum(r.finish_time - r.arrival_time for r in res.requests) / len(res.requests)  # type: ignore[operator]

    means = set()
    for settings in ({"router": "random"}, {"router": "prefix-aware"},
                     {"router": "prefix-aware", "async_scheduling": True},
                     {"router": "prefix-aware", "enable_prefix_caching": False}):  # fmt: skip
        grid = Grid(policies=("fcfs",), workloads=(str(trace),), presets=("llama3-8b-a100:2",), **settings)
        (result,) = run_sweep(grid, use_ray=False)
        assert result.metrics is not None
        assert result.metrics["e2e_mean"] == pytest.approx(by_hand(**settings), rel=1e-12), settings
        means.add(result.metrics["e2e_mean"])
    assert len(means) == 4  # each setting changed the run


def test_sweep_cli_checks_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs', 'nope']\n")
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(tmp_path / "out")]) == 2
    assert "Unknown policy 'nope'" in capsys.readouterr().err and not (tmp_path / "out").exists()
    grid.write_text("policies = ['fcfs']\n")
    assert main(["sweep", "--grid", str(grid), "--num-cpus", "0"]) == 2
    assert "--num-cpus must be >= 1, got 0" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_sweep_cli_refuses_ray_flags_that_would_be_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs']\n")
    out = tmp_path / "out"
    for flags, message in [
        (["--no-ray", "--num-cpus", "2"], "--num-cpus sets up Ray, and --no-ray runs the tasks without it"),
        (["--no-ray", "--ray-address", "auto"], "--ray-address sets up Ray, and --no-ray runs the tasks without it"),
        (["--ray-address", "auto", "--num-cpus", "2"], "--num-cpus sizes a local Ray, and --ray-address joins"),
    ]:
        assert main(["sweep", "--grid", str(grid), *flags, "--out", str(out)]) == 2, flags
        assert message in capsys.readouterr().err and not out.exists(), flags


def test_a_grid_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    grid = tmp_path / "g.toml"
    grid.write_bytes(b"policies = ['\xff']\n")
    with pytest.raises(ValueError, match=r"g\.toml: not UTF-8 text \(invalid start byte\)"):
        load_grid(grid)


def test_a_sweep_on_ray_without_ray_says_so_once_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import headway.sweep._cli as sweep_cli

    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs']\n")
    monkeypatch.setattr(sweep_cli, "available", lambda module: module != "ray")
    assert main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "sweep" not in captured.out and not (tmp_path / "out").exists()  # no header, no progress bar
    said = "headway: error: Ray is not installed: pip install -e '.[sweep]' or run with --no-ray"
    assert captured.err.strip() == said  # the install line once


def test_a_sweep_says_what_scores_its_score_ranked_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs', 'pars', 'sjf-score']\nnum_requests = 30\nscorer_tau = 0.6\n"
                    "[policy_args.sjf-score]\nscorer = 'oracle'\n")  # fmt: skip
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(tmp_path / "out")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pars: ranked by a noisy oracle's length scores at Kendall tau 0.6 (scorer_tau)" in out
    assert "sjf-score" not in out.split("ranked by")[0]  # its own scorer: nothing to say
    grid.write_text("policies = ['fcfs']\nnum_requests = 30\n")
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(tmp_path / "out2")]) == 0
    assert "noisy oracle" not in capsys.readouterr().out


def test_sweep_cli_writes_report_and_fails_loudly(tmp_path: Path) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text(f"policies = ['fcfs']\nworkloads = ['default', {_malformed_trace(tmp_path)!r}]\n"
                    "rates = [5.0]\nnum_requests = 40\n")
    out = tmp_path / "out"
    code = main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)])
    assert code == 1  # one task failed: a malformed trace
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and "bad.csv:2" in rows[2]
    assert (out / "curves.png").stat().st_size > 0
    agg = (out / "aggregate.csv").read_text()
    assert "fcfs" in agg and not math.isnan(float(agg.splitlines()[1].split(",")[6]))


def test_a_sweep_says_when_every_seed_gave_the_same_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a replayed log with its own arrival times and lengths draws nothing from the seed: its "mean over
    # seeds" was one run shown as if it were several
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt": f"q{i}", "output_tokens": 20 + 7 * i, "arrival_time": 0.3 * i}) + "\n"
                           for i in range(30)))  # fmt: skip
    grid = tmp_path / "g.toml"
    grid.write_text(f"policies = ['fcfs']\nworkloads = ['default', {str(log)!r}]\nseeds = [0, 1]\nnum_requests = 30\n")
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(tmp_path / "out")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"every seed gave the same run for fcfs on {log}" in out and "fcfs on default" not in out
    rows = list(csv.DictReader((tmp_path / "out" / "aggregate.csv").read_text().splitlines()))
    assert [r["distinct_runs"] for r in rows] == ["2", "1"]


def test_an_interrupted_sweep_keeps_the_tasks_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C in the third task: the two that finished are written, marked partial, and the exit is 130
    import headway.sweep._runner as runner

    real, calls = runner.run_task, []

    def interrupted_third(task, grid):  # type: ignore[no-untyped-def]
        calls.append(task.index)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task, grid)

    monkeypatch.setattr(runner, "run_task", interrupted_third)
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs', 'sjf-oracle']\nrates = [5.0, 7.0]\nseeds = [0, 1]\nnum_requests = 60\n")
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert "interrupted: 2 of 8 tasks finished" in " ".join(captured.out.split())
    assert captured.err.strip() == "headway: interrupted"
    doc = json.loads((out / "results.json").read_text())
    assert (doc["complete"], doc["tasks_finished"], doc["tasks_in_grid"]) == (False, 2, 8)
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert [(r["policy"], r["rate"], r["seed"]) for r in rows] == [("fcfs", "5.0", "0"), ("fcfs", "5.0", "1")]
    assert all(r["error"] == "" and float(r["e2e_mean"]) > 0 for r in rows)

    calls.clear()
    monkeypatch.setattr(runner, "run_task", real)  # the same sweep run through: complete again
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert (doc["complete"], doc["tasks_finished"], doc["tasks_in_grid"]) == (True, 8, 8)


# a policy that says when each task starts (a file per task) and takes a while to start
_MARKED_POLICY = '''
import os, time, uuid
from pathlib import Path
from headway import Policy, register_policy

@register_policy("marked-fcfs")
class MarkedFCFS(Policy):
    """First come, first served, leaving a file in $MARK_DIR as each run starts."""

    def __init__(self):
        Path(os.environ["MARK_DIR"], uuid.uuid4().hex).touch()
        time.sleep(0.3)

    def key(self, request, now):
        return (request.arrival_time,)
'''


def _sigterm_a_sweep(tmp_path: Path, out: Path, ray: bool) -> tuple[int, str, str]:
    """Run a 40-task sweep into ``out`` in a child process, SIGTERM it once a task has finished;
    (exit status, stdout, stderr)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from headway.integrations._server import headway_src_dir

    (tmp_path / "marked.py").write_text(_MARKED_POLICY)
    marks = tmp_path / "marks"
    marks.mkdir()
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['marked-fcfs']\nseeds = [" + ", ".join(map(str, range(40))) + "]\nnum_requests = 50\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HEADWAY_PLUGINS", "PYTHONPATH")}
    env.update(PYTHONPATH=str(headway_src_dir()), HEADWAY_PLUGINS=str(tmp_path / "marked.py"), MARK_DIR=str(marks))
    args = ["--num-cpus", "1"] if ray else ["--no-ray"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "headway", "sweep", "--grid", str(grid), *args, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240  # Ray's start on a busy 2-core machine
        while len(list(marks.iterdir())) < 2:  # one task at a time: the second began, so the first ended
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize("ray", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in-process", "ray"])
def test_sigterm_ends_a_sweep_with_one_line_and_keeps_what_finished(tmp_path: Path, ray: bool) -> None:
    import signal

    if ray:
        pytest.importorskip("ray")
    out = tmp_path / "out"
    returncode, stdout, stderr = _sigterm_a_sweep(tmp_path, out, ray)
    assert returncode == -signal.SIGTERM, stderr  # ended by the signal, as a supervisor expects
    assert stderr.strip().splitlines()[-1] == "headway: terminated" and "Traceback" not in stderr, stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False and 1 <= doc["tasks_finished"] < 40 and doc["tasks_in_grid"] == 40
    assert f"interrupted: {doc['tasks_finished']} of 40 tasks finished" in " ".join(stdout.split())


def test_an_interrupted_sweep_does_not_replace_a_complete_report_in_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    complete = {"complete": True, "tasks_finished": 2, "tasks_in_grid": 2, "tasks": [], "aggregate": []}
    (out / "results.json").write_text(json.dumps(complete))
    (out / "results.csv").write_text("an earlier sweep's rows\n")
    _, stdout, stderr = _sigterm_a_sweep(tmp_path, out, ray=False)
    assert json.loads((out / "results.json").read_text()) == complete, stderr
    assert (out / "results.csv").read_text() == "an earlier sweep's rows\n"
    partial = json.loads((out / "interrupted" / "results.json").read_text())
    assert partial["complete"] is False and 1 <= partial["tasks_finished"] < 40
    assert f"the complete report already in {out} is kept" in " ".join(stdout.split())
    assert not [p for p in out.rglob("*") if "staging" in p.name], "a staging folder was left behind"


def _row(policy: str, rate: float | None, **metrics: float) -> dict:  # type: ignore[type-arg]
    return {"preset": "llama3-8b-h100:4", "workload": "default", "policy": policy, "rate": rate, **metrics}


def test_max_rates_is_the_highest_rate_meeting_the_limits_with_every_lower_one() -> None:
    nan = float("nan")
    rows = [
        _row("fcfs", None, ttft_p99=0.1, slo_attainment=1.0),  # the workload's own arrivals: no rate to report
        _row("fcfs", 30.0, ttft_p99=2.5, slo_attainment=0.95),
        _row("fcfs", 10.0, ttft_p99=0.5, slo_attainment=1.0),
        _row("fcfs", 20.0, ttft_p99=1.9, slo_attainment=0.95),
        _row("fcfs", 40.0, ttft_p99=1.0, slo_attainment=0.99),  # meets them again past a miss: not counted
        _row("pars", 10.0, ttft_p99=0.4, slo_attainment=0.99),
        _row("pars", 20.0, ttft_p99=0.6, slo_attainment=0.91),
        _row("sjf", 10.0, ttft_p99=nan, slo_attainment=nan),  # every seed failed: a miss
        _row("srpt", 10.0, ttft_p99=2.1, slo_attainment=0.2),
    ]
    limits = {"ttft_p99": 2.0, "slo_attainment": 0.9}
    fcfs, pars, sjf, srpt = max_rates(rows, limits)
    assert (fcfs["policy"], fcfs["max_rate"], fcfs["next_rate"], fcfs["ttft_p99"]) == ("fcfs", 20.0, 30.0, 1.9)
    assert fcfs["missed"] == "ttft_p99 2.5 > 2"
    assert (pars["max_rate"], pars["next_rate"], pars["missed"]) == (20.0, None, "")  # at least 20: none missed
    assert (sjf["max_rate"], sjf["next_rate"]) == (None, 10.0)  # the lowest rate missed
    why = "no value (every seed failed, or no request completed)"
    assert sjf["missed"] == f"ttft_p99: {why}; slo_attainment: {why}"
    assert srpt["max_rate"] is None and math.isnan(srpt["ttft_p99"])
    assert srpt["missed"] == "ttft_p99 2.1 > 2; slo_attainment 0.2 < 0.9"  # attainment is a floor, latency a ceiling


def test_a_sweep_with_limits_reports_the_highest_rate_meeting_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the capacity question: how many requests/s keep P99 TTFT under a bound; 2 req/s is light load for an
    # A100 and 40 req/s overloads it (TTFT in seconds)
    grid = tmp_path / "g.toml"
    grid.write_text("policies = ['fcfs']\nrates = [2.0, 40.0]\nnum_requests = 150\nslo = 'ttft:1000'\n"
                    "[limits]\nttft_p99 = 1.0\nslo_attainment = 0.9\n")  # fmt: skip
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "highest rate meeting the limits" in text and "40: ttft_p99" in text
    assert "the highest rate swept at which ttft_p99 <= 1 s, slo_attainment >= 0.9" in text
    (row,) = csv.DictReader((out / "capacity.csv").read_text().splitlines())
    assert (row["policy"], row["max_rate"], row["next_rate"]) == ("fcfs", "2.0", "40.0")
    assert float(row["ttft_p99"]) <= 1.0 and float(row["slo_attainment"]) >= 0.9
    assert json.loads((out / "results.json").read_text())["capacity"][0]["max_rate"] == 2.0
    grid.write_text("policies = ['fcfs']\nrates = [2.0]\nnum_requests = 30\n")  # no limits: no capacity.csv left
    assert main(["sweep", "--grid", str(grid), "--no-ray", "--out", str(out)]) == 0
    assert not (out / "capacity.csv").exists() and "capacity" not in json.loads((out / "results.json").read_text())


def test_the_sweep_table_never_cuts_a_fleet_name_short() -> None:
    # a sweep over fleet sizes ("how many replicas?") printed 'llama3-8b-h1…' for every one of them
    import io

    from rich.console import Console

    from headway.sweep._cli import _print_table, _table

    metrics = {"seeds": 1, "failed": 0, "e2e_mean": 9.7, "e2e_p99": 23.8, "ttft_p99": 0.44, "norm_mean": 0.038,
               "goodput_rps": 30.5}  # fmt: skip
    rows = [{"preset": f"llama3-8b-h100:{n}", "workload": "azure-conv", "policy": "uniboost", "rate": 40.0, **metrics}
            for n in (4, 5)]  # fmt: skip
    for width in (140, 80):  # (the CLI's console is 140 wide at least; a narrower one is widened)
        console = Console(width=width, file=io.StringIO())
        _print_table(console, _table(rows))
        text = console.file.getvalue()  # type: ignore[attr-defined]
        firsts = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
        assert firsts == ["llama3-8b-h100:4", "llama3-8b-h100:5"]  # whole, each on its line
        assert "azure-conv" in text and "uniboost" in text
    # long names and every column (the hit rate's too) still whole at 140: headers neither cut nor folded
    longer = {"workload": "sharegpt-sessions", "policy": "uniboost-base", "prefix_cache_hit_rate": 0.5}
    wide = [{**r, **longer} for r in rows]
    console = Console(width=140, file=io.StringIO())
    _print_table(console, _table(wide))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "…" not in text and "sharegpt-sessions" in text and "uniboost-base" in text
    for head in ("e2e_mean", "e2e_p99", "ttft_p99", "norm_mean", "(s/token)", "prefix hit", "goodput", "(req/s)"):
        assert head in text, head


def test_the_curves_of_policies_that_decided_alike_are_drawn(tmp_path: Path) -> None:
    # two policies whose numbers differ in the last bits (one rate, 6 replicas: nothing queued) made a log
    # axis a few ulps high: matplotlib divided by zero and misplaced every panel
    import warnings

    from headway.sweep._cli import _plot_curves

    rows = [
        {"preset": "llama3-8b-h100:6", "workload": "azure-conv", "policy": policy, "rate": 40.0, "norm_mean": norm,
         "e2e_p99": p99}
        for policy, norm, p99 in (("fcfs", 0.018599531613937167, 12.14623029107819),
                                  ("uniboost", 0.01859953161393715, 12.146230291078183))
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert _plot_curves(tmp_path / "curves.png", rows) == tmp_path / "curves.png"


def test_the_curves_say_a_session_workloads_rate_is_conversations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sharegpt-sessions' rate starts conversations (6/s sends about 19 requests/s): the axis said requests/s
    from matplotlib.figure import Figure

    from headway.sweep._cli import _plot_curves

    saved: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kwargs: saved.append(fig))
    rows = [{"preset": "llama3-8b-a100:4", "workload": workload, "policy": "fcfs", "rate": rate,
             "norm_mean": 0.02 * rate, "e2e_p99": 3.0 * rate}
            for workload in ("default", "sharegpt-sessions") for rate in (2.0, 6.0)]  # fmt: skip
    _plot_curves(tmp_path / "curves.png", rows)
    (fig,) = saved
    labels = [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()]
    assert labels == ["arrival rate (requests/s)", "conversation rate (conversations/s)"]


def test_the_example_grids_load_and_the_capacity_one_answers(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    assert load_grid(examples / "sweep.toml").slo is not None
    grid = load_grid(examples / "capacity.toml")
    assert grid.limits and len(grid.presets) == 2
    out = tmp_path / "out"
    assert main(["sweep", "--grid", str(examples / "capacity.toml"), "--no-ray", "--out", str(out)]) == 0
    with (out / "capacity.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(grid.presets) * len(grid.workloads) * len(grid.policies)
    # a second replica sustains more: each policy's answer on two A100s is above its answer on one
    by = {(r["preset"], r["policy"]): r["max_rate"] for r in rows}
    for policy in grid.policies:
        one, two = by[("llama3-8b-a100", policy)], by[("llama3-8b-a100:2", policy)]
        assert one and two and float(two) > float(one), (policy, one, two)


def test_shared_system_prompts_and_the_hit_rate_in_a_sweep(tmp_path: Path) -> None:
    """A grid puts shared system prompts in front of its requests as `headway simulate --system-prompts`
    does, and reports the prefix cache's hit rate (a column of the table once any run found a hit)."""
    from headway.sim import simulate
    from headway.sim._fleet import fleet_presets
    from headway.workload import load_workload

    grid = Grid(policies=("fcfs",), workloads=("default",), presets=("llama3-8b-a100:2",), num_requests=300,
                system_prompts=3, system_prompt_tokens=1200, router="prefix-aware")  # fmt: skip
    (result,) = run_sweep(grid, use_ray=False)
    assert result.metrics is not None
    workload = load_workload("default", seed=0, num_requests=300, system_prompts=3, system_prompt_tokens=1200)
    res = simulate(workload, "fcfs", preset=fleet_presets("llama3-8b-a100:2"), router="prefix-aware")
    from headway.metrics import summarize

    want = summarize(res.requests).prefix_cache_hit_rate
    assert want is not None and want > 0.3
    assert result.metrics["prefix_cache_hit_rate"] == pytest.approx(want, rel=1e-12)
    plain = Grid(policies=("fcfs",), workloads=("default",), presets=("llama3-8b-a100:2",), num_requests=300)
    (without,) = run_sweep(plain, use_ray=False)
    assert without.metrics is not None and without.metrics["prefix_cache_hit_rate"] < 0.01

    out = tmp_path / "g.toml"
    out.write_text("policies = ['fcfs']\nworkloads = ['default']\nnum_requests = 200\nsystem_prompts = 2\n")
    assert main(["sweep", "--grid", str(out), "--no-ray", "--out", str(tmp_path / "o")]) == 0
    with (tmp_path / "o" / "aggregate.csv").open(encoding="utf-8") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["prefix_cache_hit_rate"]) > 0.3
    for bad, why in (({"system_prompt_tokens": 100}, "needs system_prompts"), ({"system_prompts": 0}, ">= 1"),
                     ({"think_time": 2.0}, "only applies to sharegpt-sessions")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            Grid(policies=("fcfs",), workloads=("default",), **bad)  # type: ignore[arg-type]
