from __future__ import annotations

import argparse
import math

import pytest

from headway.reproduce import EXPERIMENTS, ClaimRow, add_reproduce_parser, run_reproduction
from headway.workload import find_data_dir


def _have_data() -> bool:
    try:
        find_data_dir()
    except FileNotFoundError:
        return False
    return True


def test_claim_row_ratio():
    row = ClaimRow("x", "c", paper=0.4, measured=0.2, reproduced=False, criterion="...")
    assert row.ratio == pytest.approx(0.5)
    assert math.isnan(ClaimRow("x", "c", 0.0, 1.0, True, "...").ratio)


def test_parser_accepts_the_documented_command_line():
    parser = argparse.ArgumentParser(prog="headway")
    sub = parser.add_subparsers(dest="command")
    add_reproduce_parser(sub)
    args = parser.parse_args(["reproduce", "pars", "--out", "d", "--quick"])
    assert (args.experiment, args.out, args.quick, args.predictor) == ("pars", "d", True, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["reproduce", "nope"])


def test_unknown_reproduction_is_named():
    with pytest.raises(ValueError, match="unknown reproduction 'nope'"):
        run_reproduction("nope", "unused")


@pytest.mark.slow
@pytest.mark.skipif(not _have_data(), reason="shared data not present")
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_quick_reproduction_writes_report_and_rows(name, tmp_path):
    rows = run_reproduction(name, tmp_path, quick=True, echo=False)
    assert len(rows) >= 4
    assert all(isinstance(r.reproduced, bool) and r.criterion for r in rows)
    assert all(math.isfinite(r.measured) for r in rows)
    report = (tmp_path / f"{name}.md").read_text()
    assert "| claim | paper | measured | ratio | reproduced |" in report
    pngs = list(tmp_path.glob(f"{name}_*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    if name == "uniboost":  # its wins over SRPT come from that baseline thrashing: the report says so
        assert "come from that baseline thrashing" in report and "does not beat FCFS's tail" in report


def test_bad_arguments_fail_before_any_simulation(tmp_path, capsys):
    from headway.cli import main

    (tmp_path / "file").write_text("")
    for argv, message in [
        (["uniboost", "--predictor", "/x"], "--predictor scores prompts for pars only, not uniboost"),
        (["pars", "--seed", "-5"], "--seed must be >= 0, got -5"),
        (["pars", "--out", ""], "--out: empty path"),
        (["pars", "--out", str(tmp_path / "file")], "exists and is not a folder"),
    ]:
        assert main(["reproduce", *argv, "--quick"]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "claims reproduced" not in captured.out, argv


def test_module_entry_points_take_the_headway_command_line(tmp_path):
    import subprocess
    import sys

    for argv in (["-m", "headway", "--version"], ["-m", "headway.reproduce", "driftsched", "--quick",
                                                   "--out", str(tmp_path)]):  # fmt: skip
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "driftsched.md").is_file()
