"""The command line: help, listings, errors, and `simulate` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headway.cli import build_parser, main

HEAVY = ("torch", "transformers", "starlette", "uvicorn", "httpx", "redis", "ray", "onnxruntime")


def test_building_the_parser_imports_no_optional_dependency() -> None:
    # `./dev simulate` installs only the core package: every subcommand module must
    # import without the predict / serve / sweep extras.
    code = (
        "import sys, headway.cli; headway.cli.build_parser(); "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # type: ignore[union-attr]
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0, name
    assert "simulate" in capsys.readouterr().out


def test_unknown_policy_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "fcfs,shortest", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "Unknown policy 'shortest'" in err and "sjf-oracle" in err


def test_bad_policy_arg_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "fcfs", "--policy-arg", "pars=1", "--no-report"]) == 2
    assert "NAME.key=value" in capsys.readouterr().err
    # a misspelled setting: refused before any simulation, naming the setting it meant
    assert main(["simulate", "--policies", "fcfs,pars", "--policy-arg", "pars.starvation=5", "--no-report"]) == 2
    captured = capsys.readouterr()
    assert "has no setting 'starvation' (did you mean 'starvation_threshold'?)" in captured.err
    assert "simulating" not in captured.out and "requests in" not in captured.out


def test_simulate_writes_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rep"
    code = main(["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "300", "--out", str(out),
                 "--slo", "ttft:2000 e2el:60000"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    text = json.dumps(summary)
    assert "sjf-oracle" in text and "fcfs" in text
    # how to make it again: the command as given and the report's notes (workload, engine, ...)
    assert summary["meta"]["command"] == (
        f"headway simulate --policies fcfs,sjf-oracle --num-requests 300 --out {out} --slo 'ttft:2000 e2el:60000'"
    )
    assert summary["meta"]["notes"][0].startswith("workload default: 300 requests (--seed 0 --num-requests 300")
    for name in ("report.html", "latency_cdf.png", "percentiles.png", "timeline.png", "summary.csv"):
        assert (out / name).stat().st_size > 0, name
    assert "fcfs (baseline)" in capsys.readouterr().out


def test_simulate_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--policies", "fcfs", "--num-requests", "200", "--preset",
                 "llama3-8b-h100:1,llama3-8b-l4:1", "--router", "least-tokens", "--no-report"])
    assert code == 0
    out = capsys.readouterr().out
    assert "replica-0" in out and "replica-1" in out


def test_a_fleet_of_several_policies_prints_one_per_replica_overview(capsys: pytest.CaptureFixture[str]) -> None:
    # compared policies: one row each in one per-replica table, not a full table per policy
    # ahead of the comparison; the fleet named compactly
    assert main(["simulate", "--policies", "fcfs,sjf-oracle,pars", "--num-requests", "80", "--replicas", "4",
                 "--router", "round-robin", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "preset 4 x llama3-8b-a100;" in out and "default on 4 x llama3-8b-a100" in out
    assert "llama3-8b-a100, llama3-8b-a100" not in out
    assert out.count("per replica") == 1 and "fcfs: per replica" not in out
    overview = out.split("per replica: done / E2E mean (s)")[1].split("default on")[0]
    assert "replica-3" in overview and "20 / " in overview  # round-robin: 80 requests, 20 a replica
    assert [line.split()[1] for line in overview.splitlines() if line.startswith("│")] == [
        "fcfs", "sjf-oracle", "pars"
    ]  # fmt: skip


def test_simulate_fleet_report_has_the_per_replica_tables(tmp_path: Path) -> None:
    from headway.metrics import read_json, read_replica_json

    out = tmp_path / "fleet"
    assert main(["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "200", "--replicas", "2",
                 "--router", "round-robin", "--out", str(out)]) == 0
    per = read_replica_json(out / "summary.json")
    assert sorted(per) == ["fcfs", "sjf-oracle"]
    for name, reps in per.items():
        assert sorted(reps) == ["replica-0", "replica-1"]
        # round-robin splits 200 requests evenly, and the replicas add up to the fleet
        assert [s.num_requests for s in reps.values()] == [100, 100]
        assert read_json(out / "summary.json")[name].num_requests == 200
    html = (out / "report.html").read_text()
    assert html.count("<h4>Per replica</h4>") == 2 and "replica-1" in html


def test_every_policy_is_described_by_a_whole_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    # `headway policies` shows a docstring's first line: it must be the docstring's whole first paragraph
    from headway.core import available_policies, get_policy_class

    for name in available_policies():
        cls = get_policy_class(name)
        if cls.__module__.startswith("headway."):
            first = (cls.__doc__ or "").strip().split("\n\n")[0]
            assert "\n" not in first and first.endswith("."), (name, first)
    assert main(["policies"]) == 0
    bands = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("bands "))
    assert bands.endswith("the inner policy's order in a flow."), bands


def test_listings(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("policies", "presets", "workloads", "routers"):
        assert main([cmd]) == 0
    out = capsys.readouterr().out
    assert "uniboost" in out and "llama3-70b-4xh100" in out and "length-aware" in out


def test_help_shows_a_default_only_where_it_adds_something() -> None:
    import argparse

    from headway._help import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--rate", type=float, default=2.5, help="arrival rate")
    p.add_argument("--seed", type=int, default=None, help="seed")
    p.add_argument("--quiet", action="store_true", help="no output")
    p.add_argument("--tag", action="append", default=[], help="repeatable")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    text = " ".join(p.format_help().split())
    assert "arrival rate (default: 2.5)" in text
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text
    assert "batch size (default 32)" in text and "(default: 32)" not in text


def test_file_errors_are_one_line_and_come_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", str(tmp_path / "none.csv"), "--no-report"]) == 2
    assert capsys.readouterr().err == f"headway: error: {tmp_path / 'none.csv'}: workload file not found\n"
    (tmp_path / "afile").write_text("")
    for out in ("afile", "afile/sub"):
        assert main(["simulate", "--policies", "fcfs", "--out", str(tmp_path / out)]) == 2
        err = capsys.readouterr()
        assert err.err.startswith(f"headway: error: --out {tmp_path / out}: ") and "Traceback" not in err.err
        assert "simulating" not in err.out and "workload" not in err.out  # refused before loading anything
    assert main(["simulate", "--policies", "fcfs", "--slo", "ttft=5", "--no-report"]) == 2
    assert "invalid SLO pair 'ttft=5'" in capsys.readouterr().err


def test_settings_that_would_be_ignored_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--policies", "pars", "--baseline", "nope"], "--baseline nope is not one of the policies being run"),
        (["--policies", "fcfs,fcfs"], "--policies lists fcfs more than once"),
        (["--policies", ","], "--policies names no policy"),
        (["--router", "power-of-two"], "--router and --router-arg need a fleet"),
        (  # once, before the workload loads (it was one failure per policy)
            ["--replicas", "2", "--router", "cache-aware", "--router-arg", "balance_rel_threshold=0.5"],
            "--router-arg: cache-aware: balance_rel_threshold must be a finite number >= 1, got 0.5",
        ),
        (["--out", "x", "--no-report"], "--out names a report folder, and --no-report writes none"),
        (["--preset", "llama3-8b-h100:-1"], "replica count must be >= 1 in 'llama3-8b-h100:-1'"),
    ]:
        assert main(["simulate", "--no-report", *argv] if "--no-report" not in argv else ["simulate", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def _norm_mean(out: Path) -> float:
    (run,) = json.loads((out / "summary.json").read_text())["runs"].values()
    return float(run["normalized_latency"]["mean"])


def test_a_policy_arg_wins_over_the_noisy_oracle_defaults(tmp_path: Path) -> None:
    common = ["simulate", "--policies", "pars", "--num-requests", "400"]
    assert main([*common, "--out", str(tmp_path / "default")]) == 0
    assert main([*common, "--policy-arg", "pars.tau=0.0", "--out", str(tmp_path / "arg")]) == 0
    assert main([*common, "--scorer-tau", "0.0", "--out", str(tmp_path / "flag")]) == 0
    assert _norm_mean(tmp_path / "arg") == _norm_mean(tmp_path / "flag") != _norm_mean(tmp_path / "default")


def test_workload_flags_reach_the_loader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = tmp_path / "model_outputs.json"
    outputs.write_text(json.dumps([
        {"instruction": "Say hi", "output": "Hello!", "generator": "a", "dataset": "d"},
        {"instruction": "Count to three", "output": "One, two, three.", "generator": "b", "dataset": "d"},
    ]))  # fmt: skip
    assert main(["simulate", "--workload", str(outputs), "--policies", "fcfs", "--no-report"]) == 2
    assert "pick one with model= (--model)" in capsys.readouterr().err
    assert main(["simulate", "--workload", str(outputs), "--model", "b", "--policies", "fcfs", "--no-report"]) == 0
    assert "model_outputs: 1 requests" in capsys.readouterr().out
    argv = ["simulate", "--num-requests", "50", "--policies", "fcfs", "--no-report", "--arrivals", "burst"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "50 requests in one burst at t = 0;" in out and "--rate" not in out
    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt": "a", "output_tokens": 5}\n{"prompt": "b", "output_tokens": 9}\n')
    assert main(["simulate", "--workload", str(log), "--policies", "fcfs", "--no-report"]) == 0
    assert "2 requests in one burst at t = 0 (no arrival times: --rate R spreads them)" in capsys.readouterr().out
    assert main(["simulate", "--workload", str(log), "--rate", "2", "--policies", "fcfs", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "2 requests over " in out and "burst" not in out
    assert main(["simulate", "--workload", str(outputs), "--format", "nope", "--no-report"]) == 2
    assert "format must be one of" in capsys.readouterr().err


def test_aborted_requests_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "fcfs", "--num-requests", "30", "--num-gpu-blocks", "1", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "fcfs: 30 of 30 requests aborted (30 prompt does not fit the KV cache (16 tokens))" in out
    assert "aborted" in out.split("default on llama3-8b-a100")[1]  # the table's column
    assert "full table in the report" not in out  # --no-report: there is none


def test_an_empty_workload_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert main(["simulate", "--workload", str(empty), "--policies", "fcfs", "--no-report"]) == 2
    assert "headway: error: workload empty has no requests" in capsys.readouterr().err


def test_policy_listing_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and "(priority, arrival_time)" in out
    ltr = next(line for line in out.splitlines() if line.startswith("ltr "))
    assert "Waiting and running requests" in ltr  # its docstring's *and running*, shown plain
    assert main(["routers"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and "((requests + 1) / speed)" in out
    assert main(["workloads"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in lines}
    assert len(starts) == 1, lines  # the descriptions start in one column, after the longest name


def test_presets_lists_the_good_saved_presets_and_warns_about_bad_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from headway.sim import PRESETS

    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path))
    PRESETS["llama3-8b-l4"].save(tmp_path / "mine.json")
    (tmp_path / "broken.json").write_text("[1, 2]")
    assert main(["presets"]) == 0
    out, err = capsys.readouterr()
    assert "mine " in out and "llama3-8b-a100" in out and "broken" not in out
    assert f"headway: warning: skipped {tmp_path / 'broken.json'}: not a headway cost model" in err


def test_policy_is_an_alias_of_policies_and_no_flag_is_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    # `--policy`, as `headway serve` spells it, is not taken for a prefix of --policy-arg
    assert main(["simulate", "--policy", "sjf-oracle", "--num-requests", "20", "--no-report"]) == 0
    assert "policies sjf-oracle" in capsys.readouterr().out
    for cut in ("--polic", "--num-req"):  # a flag cut short is refused, not read as the one it starts
        with pytest.raises(SystemExit) as info:
            main(["simulate", cut, "20", "--no-report"])
        assert info.value.code == 2
        assert f"unrecognized arguments: {cut}" in capsys.readouterr().err
    # nor in the other commands, where a prefix is another flag's start (--preset-dir, --model, --api-keys)
    for argv in (
        ["calibrate", "--preset", "x"],
        ["serve", "--backend", "http://127.0.0.1:1", "--api-key", "k"],
        ["bench", "serve", "--mode", "x"],
        ["predictor", "matrix", "--loss", "pairwise"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert f"unrecognized arguments: {argv[-2]} {argv[-1]}" in capsys.readouterr().err, argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--num-requests", "0"], "--num-requests must be >= 1, got 0"),
        (["--rate", "0"], "--rate must be a positive finite number, got 0.0"),
        (["--burstiness", "-1"], "--burstiness must be a positive finite number, got -1.0"),
        (["--output-cv", "-1"], "--output-cv must be a finite number >= 0, got -1.0"),
        (["--system-prompt-tokens", "5"], "--system-prompt-tokens needs --system-prompts"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
        (["--max-num-batched-tokens", "8"], "--max-num-batched-tokens (8) must be >= --max-num-seqs (256)"),
        (["--block-size", "0"], "--block-size must be >= 1, got 0"),
        (["--gpu-memory-utilization", "2"], "--gpu-memory-utilization must be in (0, 1], got 2.0"),
    ],
)
def test_bad_values_are_refused_naming_their_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # checked before anything runs: the missing trace file is never opened
    missing = str(tmp_path / "missing.csv")
    assert main(["simulate", "--workload", missing, "--policies", "fcfs", "--no-report", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"headway: error: {message}") and err.count("\n") == 1, err
    assert out == ""


def test_workload_values_out_of_range_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--num-requests", "10000000000"], "--num-requests must be at most 100,000,000, got 10000000000"),
        (["--num-requests", "10", "--rate", "1e-300"], "10 arrivals at rate 1e-300 requests/s span"),
        (["--workload", "burst", "--rate", "5"], "got rate=5.0 (--rate)"),
        (["--arrivals", "burst", "--burstiness", "0.5"], "got burstiness=0.5 (--burstiness)"),
    ]:
        assert main(["simulate", "--policies", "fcfs", "--no-report", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("headway: error: ") and message in err, argv
        assert err.count("\n") == 1 and "Traceback" not in err, argv


def test_arrivals_placed_as_vllm_bench_serve_does(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's placement: the first request one gap in, the last at exactly N / rate (here 40 s)
    assert main(["simulate", "--policies", "fcfs", "--num-requests", "200", "--arrivals", "gamma-vllm",
                 "--rate", "5", "--no-report"]) == 0
    from headway.workload import load_workload

    times = [r.arrival_time for r in load_workload("default", num_requests=200, rate=5.0, arrivals="gamma-vllm")]
    assert times[0] > 0 and times[-1] == pytest.approx(40.0, rel=1e-12)


def test_a_missing_extra_is_named_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A core-only install (./dev simulate) runs commands that need an extra: say which, before any work."""
    import sys

    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx: ModuleNotFoundError, as if not installed
    assert main(["calibrate", "--launch", "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert "headway: error: calibrate needs the 'serve' extra" in err and "pip install -e '.[serve]'" in err
    assert "Traceback" not in err
    monkeypatch.setitem(sys.modules, "no_such_dependency", None)

    def broken(args: object) -> int:
        import no_such_dependency  # noqa: F401 - not an extra of ours: a real bug, raised as it is

        return 0

    import headway._lists as cli

    monkeypatch.setattr(cli, "_cmd_policies", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["policies"])


def test_simulate_with_no_policies_runs_the_curated_set(capsys: pytest.CaptureFixture[str]) -> None:
    from headway.core import available_policies
    from headway.metrics import POLICY_FAMILIES
    from headway.sim._cli import DEFAULT_POLICIES

    # FCFS, one policy per paper family, the oracle bound: all registered, families distinct
    assert set(DEFAULT_POLICIES) <= set(available_policies())
    families = [POLICY_FAMILIES[n] for n in DEFAULT_POLICIES]
    assert families == ["baseline", "PARS", "UniBoost", "DriftSched", "oracle"]
    assert main(["simulate", "--num-requests", "60", "--no-report"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"policies {', '.join(DEFAULT_POLICIES)}" in out
    assert main(["simulate", "--num-requests", "30", "--no-report", "--policies", "all"]) == 0
    assert f"policies {', '.join(available_policies())}" in " ".join(capsys.readouterr().out.split())


def test_simulate_scores_prompts_with_the_shipped_predictor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path / "cache"))  # nothing trained: the shipped one
    prompts = [
        ("Write a detailed 2000-word essay on the history of Rome, with sources.", 900),
        ("Say yes or no: is 7 prime?", 3),
        ("Summarize the plot of Hamlet in three paragraphs.", 300),
    ]
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "output_tokens": n}) + "\n" for p, n in prompts))
    out = tmp_path / "out"
    argv = ["simulate", "--workload", str(workload), "--arrivals", "burst", "--max-num-seqs", "1",
            "--policies", "fcfs,pars", "--policy-arg", "pars.scorer=default:onnx-int8", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "noisy-oracle" not in capsys.readouterr().out

    def start_order(policy: str) -> list[str]:
        rows = (out / f"requests_{policy}.csv").read_text().splitlines()
        header = rows[0].split(",")
        recs = [dict(zip(header, r.split(","), strict=True)) for r in rows[1:]]
        return [r["request_id"] for r in sorted(recs, key=lambda r: float(r["first_scheduled_time"]))]

    assert start_order("fcfs") == ["w-0", "w-1", "w-2"]
    assert start_order("pars") == ["w-1", "w-2", "w-0"]  # predicted shortest first, the essay last


def test_every_option_of_every_command_says_what_it_does() -> None:
    """``--help`` is the reference a newcomer reads: no flag is listed bare."""
    import argparse
    import re

    from headway.cli import build_parser

    def bare(parser: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        texts = [parser.description or ""]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out += bare(sub, f"{path} {name}")
            elif not action.help:
                out.append(f"{path} {action.option_strings[-1] if action.option_strings else action.dest}")
            elif action.help != argparse.SUPPRESS:
                texts.append(action.help)
        # and no reST markup (``x``, :mod:`x`) where a terminal shows it as typed
        out += [f"{path}: {text[:60]!r}" for text in texts if re.search(r"``|:\w+:`", text)]
        return out

    assert bare(build_parser(), "headway") == []


def test_a_reader_that_leaves_early_ends_the_listing_quietly(capsys, monkeypatch) -> None:
    """``headway policies | head -1``: no 'Broken pipe' error, the shell's SIGPIPE status."""
    import sys

    class _Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", _Gone())
    assert main(["policies"]) == 141
    assert capsys.readouterr().err == ""


def test_simulate_says_when_the_policies_decided_alike(capsys: pytest.CaptureFixture[str]) -> None:
    # a light load: every request is admitted as it arrives, so no order can matter
    light = ["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "200", "--rate", "0.2", "--no-report"]
    assert main(light) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fcfs, sjf-oracle decided alike" in out and "(a higher --rate queues requests)" in out
    # the default load queues requests, and shortest-first then finishes them at other times
    assert main(["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "300", "--no-report"]) == 0
    assert "decided alike" not in capsys.readouterr().out


def test_simulate_async_scheduling_reaches_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's flag name; the same workload planned a step ahead admits later, so first tokens come later
    ttft = {}
    for flag in ("--no-async-scheduling", "--async-scheduling"):
        out = tmp_path / flag
        assert main(["simulate", "--policies", "fcfs", "--num-requests", "300", flag, "--out", str(out)]) == 0
        ttft[flag] = json.loads((out / "summary.json").read_text())["runs"]["fcfs"]["ttft"]["mean"]
        said = "async scheduling;" in " ".join(capsys.readouterr().out.split())
        assert said == (flag == "--async-scheduling")
    assert ttft["--async-scheduling"] > ttft["--no-async-scheduling"]


def test_simulate_client_timeout_aborts_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the default load queues requests for longer than 5 s: some clients give up, none without the flag
    for timeout, aborted in ((None, False), ("5", True)):
        out = tmp_path / str(timeout)
        args = ["simulate", "--policies", "fcfs", "--num-requests", "300", "--out", str(out)]
        assert main(args + (["--client-timeout", timeout] if timeout else [])) == 0
        run = json.loads((out / "summary.json").read_text())["runs"]["fcfs"]
        assert (run["num_aborted"] > 0) == aborted
        assert ("client timeout" in " ".join(capsys.readouterr().out.split())) == aborted
    assert main(["simulate", "--client-timeout", "-1", "--no-report"]) == 2
    assert "--client-timeout must be" in capsys.readouterr().err
    # 0 aborted every request as it arrived, and the runs were then said to have "decided alike"
    # with a hint to raise the rate
    assert main(["simulate", "--client-timeout", "0", "--no-report"]) == 2
    assert "--client-timeout must be a finite number > 0, got 0.0" in capsys.readouterr().err


def test_runs_that_aborted_requests_are_not_said_to_have_decided_alike(capsys: pytest.CaptureFixture[str]) -> None:
    # a light load whose long requests outlive their clients: both policies abort the same ones at
    # the same times, but "every request got its first token and finished" would be false
    args = ["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "200", "--rate", "0.2"]
    assert main([*args, "--client-timeout", "5", "--no-report"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "aborted" in out and "decided alike" not in out


def test_simulate_admission_limits_reach_the_engine_and_its_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # vLLM's flag names. A small KV cache preempts requests; a watermark admits fewer at a time and
    # preempts none; fewer active sequences queue requests longer; the server's limit turns some away
    def run(*flags: str) -> dict[str, Any]:
        out = tmp_path / "-".join(flags)
        assert main(["simulate", "--policies", "fcfs", "--num-requests", "300", *flags, "--out", str(out)]) == 0
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())["runs"]["fcfs"]
        return summary

    small = run("--num-gpu-blocks", "800")
    guarded = run("--num-gpu-blocks", "800", "--watermark", "0.3")
    assert small["num_preemptions"] > 0 and guarded["num_preemptions"] == 0
    assert run("--max-num-active-seqs", "4")["ttft"]["mean"] > run()["ttft"]["mean"]
    capsys.readouterr()
    assert run("--max-num-queued-reqs", "20")["num_aborted"] > 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "rejected: max_num_queued_reqs" in printed
    assert "different sets of requests" not in printed  # one run: no ratios
    # two policies that turn away different requests: their ratios are said to compare different sets
    out = tmp_path / "two"
    flags = ["--num-requests", "300", "--rate", "20", "--max-num-queued-reqs", "30", "--out", str(out)]
    assert main(["simulate", "--policies", "fcfs,sjf-oracle", *flags]) == 0
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert runs["fcfs"]["num_completed"] != runs["sjf-oracle"]["num_completed"]  # (233 and 232 turned away)
    assert "compare latencies over different sets of requests" in " ".join(capsys.readouterr().out.split())
    assert main(["simulate", "--watermark", "1", "--no-report"]) == 2
    assert "--watermark must be in [0, 1)" in capsys.readouterr().err
    assert main(["simulate", "--max-num-active-seqs", "300", "--no-report"]) == 2
    assert "--max-num-active-seqs must be between 1 and --max-num-seqs (256)" in capsys.readouterr().err


def test_a_bad_flag_value_is_one_line_and_a_pointer_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse printed the whole usage block first (thirty lines for simulate) before the one that matters."""
    cases = (
        (["simulate", "--rate", "abc"], "headway simulate", "float"),
        (["bench", "serve", "--seed", "x"], "headway bench serve", "int"),
    )
    for argv, prog, kind in cases:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert capsys.readouterr().err.splitlines() == [
            f"{prog}: error: argument {argv[-2]}: invalid {kind} value: {argv[-1]!r}",
            f"({prog} --help lists the options)",
        ]


def test_simulate_says_when_a_dataset_is_sampled_with_replacement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # more requests than a prompt log holds repeated its prompts without a word
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt": f"q{i}", "output_tokens": 10 + i}) + "\n" for i in range(4)))
    args = ["simulate", "--workload", str(log), "--rate", "1", "--policies", "fcfs", "--no-report"]
    assert main([*args, "--num-requests", "10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--num-requests 10 is more than the 4 requests" in out and "each about 2.5 times" in out
    assert main([*args, "--num-requests", "4"]) == 0
    assert "with replacement" not in capsys.readouterr().out


def test_simulate_says_how_many_records_of_a_dataset_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # records without a prompt/response pair were dropped without a word unless none was left
    records = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi!"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "an answer to nothing"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
        {"id": "d", "conversations": [{"from": "human", "value": "Tell me"}, {"from": "gpt", "value": "Sure."}]},
    ]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(records))
    assert main(["simulate", "--workload", str(data), "--policies", "fcfs", "--no-report"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 requests in one burst" in out
    assert "2 records of sharegpt skipped: no prompt/response pair or 0 tokens" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--workload", ""],
        ["simulate", "--out", " "],
        ["simulate", "--slo", ""],
        ["sweep", "--grid", ""],
        ["bench", "serve", "--workload", "", "--base-url", "http://127.0.0.1:9"],
        ["predictor", "train", "--data", ""],
        ["predictor", "eval", "--data-dir", ""],
        ["predictor", "cross-source", "--data-dir", ""],
        ["predictor", "cross-source", "--save-head", " "],
        ["predictor", "cross-source", "--checkpoint", ""],
        ["predictor", "cross-source-finetune", "--save-checkpoint", ""],
        ["predictor", "cross-source-finetune", "--encoder", ""],
        ["predictor", "cross-source-finetune", "--data-dir", ""],
        ["calibrate", "--name", "", "--from-timings", "x.json"],
    ],
)
def test_an_empty_name_or_path_is_an_error_not_the_default(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # '' read as '.' (".: no instructions.jsonl") or as the flag's default (--out '' wrote headway-out/...)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    flag = next(a for a in argv if a.startswith("--") and argv[argv.index(a) + 1].strip() == "")
    assert f"argument {flag}: must not be empty" in capsys.readouterr().err
