"""The command line: help, listings, errors, and `simulate` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_simulate_writes_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rep"
    code = main(["simulate", "--policies", "fcfs,sjf-oracle", "--num-requests", "300", "--out", str(out),
                 "--slo", "ttft:2000 e2el:60000"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    text = json.dumps(summary)
    assert "sjf-oracle" in text and "fcfs" in text
    for name in ("report.html", "latency_cdf.png", "percentiles.png", "timeline.png", "summary.csv"):
        assert (out / name).stat().st_size > 0, name
    assert "fcfs (baseline)" in capsys.readouterr().out


def test_simulate_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--policies", "fcfs", "--num-requests", "200", "--preset",
                 "llama3-8b-h100:1,llama3-8b-l4:1", "--router", "least-tokens", "--no-report"])
    assert code == 0
    out = capsys.readouterr().out
    assert "replica-0" in out and "replica-1" in out


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
