from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import have_shared_data
from headway.reproduce import (
    EXPERIMENTS,
    ClaimRow,
    Experiment,
    Rule,
    Verdict,
    add_reproduce_parser,
    band_rule,
    run_reproduction,
)
from headway.reproduce._report import write_report


def _row(values, rule, **kw) -> ClaimRow:
    return ClaimRow("x", "claim", "fig. 1", 7.7, "setting", tuple(values), rule, **kw)


def test_band_rule_is_two_sided_around_the_paper_figure():
    r = band_rule(7.7, neutral=1.0)  # a speedup: the effect 6.7 divided / multiplied by 1.5
    assert (r.lo, r.hi) == pytest.approx((1 + 6.7 / 1.5, 1 + 6.7 * 1.5))
    assert r.verdict([7.0, 8.0, 7.5]) is Verdict.REPRODUCED
    assert r.verdict([30.0, 30.0, 30.0]) is Verdict.DIRECTION_ONLY  # twice the claim is not "reproduced"
    assert r.verdict([1.5, 1.6, 1.4]) is Verdict.DIRECTION_ONLY
    assert r.verdict([0.9, 0.95, 1.2]) is Verdict.NOT_REPRODUCED
    red = band_rule(0.35, 0.50, neutral=0.0)  # a reduction given as a range
    assert (red.lo, red.hi) == pytest.approx((0.35 / 1.5, 0.75))
    assert red.verdict([0.8, 0.8, 0.8]) is Verdict.DIRECTION_ONLY


def test_direction_needs_every_seed_on_the_claimed_side():
    r = band_rule(1.5, neutral=1.0)
    assert r.verdict([1.01, 1.02, 1.03]) is Verdict.DIRECTION_ONLY
    assert r.verdict([0.99, 1.05, 1.04]) is Verdict.NOT_REPRODUCED  # mean > 1 but one seed is not
    assert r.verdict([1.2, float("nan"), 1.3]) is Verdict.NOT_REPRODUCED


def test_no_change_claim_has_no_direction_verdict():
    r = Rule(0.97, 1.03, None)
    assert r.verdict([1.0, 1.01, 0.99]) is Verdict.REPRODUCED
    assert r.verdict([1.2, 1.2, 1.2]) is Verdict.NOT_REPRODUCED
    assert "otherwise not reproduced" in r.describe("x")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lo": 2.0, "hi": 1.0, "neutral": 0.0}, "band is empty"),
        ({"lo": 0.5, "hi": 2.0, "neutral": 1.0}, "must lie above neutral"),
        ({"lo": float("nan"), "hi": 2.0, "neutral": 1.0}, "Rule.lo"),
        ({"lo": 1.1, "hi": 2.0, "neutral": float("inf")}, "Rule.neutral"),
    ],
)
def test_bad_rules_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Rule(**kwargs)


def test_band_rule_refuses_a_figure_on_both_sides_of_neutral():
    with pytest.raises(ValueError, match="one side of neutral"):
        band_rule(0.9, 1.2, neutral=1.0)
    with pytest.raises(ValueError, match="reversed"):
        band_rule(2.0, 1.5, neutral=1.0)


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=6), st.floats(1.01, 50.0))
def test_verdict_follows_the_mean_and_the_band(values, figure):
    rule = band_rule(figure, neutral=1.0)
    row = _row(values, rule)
    mean = sum(values) / len(values)
    assert row.measured == pytest.approx(mean)
    assert row.reproduced == (rule.lo <= row.measured <= rule.hi)
    std, lo, hi = row.spread
    assert lo == min(values) and hi == max(values) and std >= 0.0
    if row.verdict is Verdict.DIRECTION_ONLY:
        assert min(values) > 1.0


def test_claim_row_needs_values_and_reports_ratio():
    with pytest.raises(ValueError, match="no measured values"):
        _row([], band_rule(2.0, neutral=1.0))
    row = _row([3.85, 3.85], band_rule(7.7, neutral=1.0), unit="x")
    assert row.ratio == pytest.approx(0.5)
    assert row.measured_text().startswith("3.85x ± 0")


def test_report_states_rule_verdict_seeds_and_command(tmp_path):
    exp = Experiment("demo", "Demo", seeds=(0, 1, 2), setup=["workload W"])
    exp.rows += [
        _row([8.0, 7.0, 7.5], band_rule(7.7, neutral=1.0), unit="x"),
        _row([1.2, 1.3, 1.1], band_rule(7.7, neutral=1.0), unit="x", reason="tau 0.3"),
    ]
    path = write_report(exp, tmp_path, "headway reproduce demo")
    text = path.read_text()
    assert path.name == "reproduce-demo.md"
    assert "Command: `headway reproduce demo`" in text and "Seeds: 0, 1, 2" in text
    assert "1 reproduced, 1 direction only, 0 not reproduced, of 2 claims" in text
    assert "reproduced if the mean is in [5.47x, 11.1x]" in text
    assert "| **direction only** | tau 0.3 |" in text


def test_parser_accepts_the_documented_command_line():
    parser = argparse.ArgumentParser(prog="headway")
    sub = parser.add_subparsers(dest="command")
    add_reproduce_parser(sub)
    args = parser.parse_args(["reproduce", "pars", "--out", "d", "--quick", "--seeds", "5"])
    assert (args.experiment, args.out, args.quick, args.predictor, args.seeds) == ("pars", "d", True, None, 5)
    assert parser.parse_args(["reproduce", "all"]).out is None  # headway-out/reproduce-<time>, never docs/results
    with pytest.raises(SystemExit):
        parser.parse_args(["reproduce", "nope"])


def test_unknown_reproduction_is_named():
    with pytest.raises(ValueError, match="unknown reproduction 'nope'"):
        run_reproduction("nope", "unused")
    with pytest.raises(ValueError, match="num_seeds must be >= 1, got 0"):
        run_reproduction("pars", "unused", num_seeds=0)


@pytest.mark.slow
@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n != "pars"])  # pars trains predictors: see below
def test_quick_reproduction_writes_report_and_rows(name, tmp_path):
    rows = run_reproduction(name, tmp_path, quick=True, echo=False)
    assert len(rows) >= 4
    assert all(isinstance(r.verdict, Verdict) and len(r.values) == 3 for r in rows)
    assert all(math.isfinite(r.measured) for r in rows)
    report = (tmp_path / f"reproduce-{name}.md").read_text()
    assert "| claim (paper) | source | paper | setting headway ran | measured | rule | verdict | reason |" in report
    pngs = list(tmp_path.glob(f"reproduce-{name}_*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)


@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
def test_an_experiment_counts_its_simulations_on_a_terminal(tmp_path, capsys, monkeypatch):
    import re
    import sys

    run_reproduction("uniboost", tmp_path, quick=True, num_seeds=1)
    err = capsys.readouterr().err
    assert err == "reproducing uniboost (seed 0, quick) ...\n"  # stderr a file: the start line alone
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    run_reproduction("uniboost", tmp_path, quick=True, num_seeds=1)
    err = capsys.readouterr().err
    assert re.search(r"uniboost: [1-9][0-9]* simulations \(last: [a-z-]+\)", err), err


def test_an_interrupted_reproduction_says_which_reports_it_kept(tmp_path, capsys, monkeypatch):
    import headway.reproduce as reproduce
    from headway.cli import main

    def finished(out_dir, **kwargs):
        return Experiment("pars", "PARS", seeds=(0,), rows=[_row([1.0], band_rule(1.5, neutral=1.0))])

    def interrupted(out_dir, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "_runner", lambda name: finished if name == "pars" else interrupted)
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-2:] == [f"interrupted in uniboost: its report is not written; kept: {tmp_path / 'reproduce-pars.md'}",
                        "headway: interrupted"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reproduce-pars.md"]


def test_bad_arguments_fail_before_any_simulation(tmp_path, capsys):
    from headway.cli import main

    (tmp_path / "file").write_text("")
    for argv, message in [
        (["uniboost", "--predictor", "/x"], "--predictor scores prompts for pars only, not uniboost"),
        (["pars", "--seed", "-5"], "--seed must be >= 0, got -5"),
        (["pars", "--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["uniboost", "--seeds", "99999999999"], "--seeds must be at most 1,000, got 99999999999"),
        (["pars", "--predictor", str(tmp_path / "nothing")], "--predictor: "),
        (["pars", "--predictor", str(tmp_path / "file")], "is a file, not a checkpoint directory"),
        (["pars", "--out", ""], "--out: empty path"),
        (["pars", "--out", str(tmp_path / "file")], "exists and is not a folder"),
    ]:
        assert main(["reproduce", *argv, "--quick"]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "claims reproduced" not in captured.out, argv
        assert "trained earlier" not in captured.err and "training predictor" not in captured.err, argv


def test_default_report_folder_is_headway_out_not_the_docs(tmp_path, monkeypatch, capsys):
    import headway.reproduce as reproduce
    from headway.cli import main

    seen: list[Path] = []

    def fake_run(name, out_dir, quick=False, **kwargs):
        seen.append(Path(out_dir))
        return []

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "run_reproduction", fake_run)
    assert main(["reproduce", "driftsched", "--quick"]) == 0
    (out,) = seen
    assert out.parent == Path("headway-out") and out.name.startswith("reproduce-") and out.is_dir()
    assert f"report in {out}/" in capsys.readouterr().out
    assert not (tmp_path / "docs").exists()


@pytest.mark.slow
@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
def test_module_entry_points_take_the_headway_command_line(tmp_path):
    import subprocess
    import sys

    for argv in (["-m", "headway", "--version"], ["-m", "headway.reproduce", "driftsched", "--quick",
                                                   "--seeds", "1", "--out", str(tmp_path)]):  # fmt: skip
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reproduce-driftsched.md").is_file()


def test_uniboost_modes_are_the_engines():
    from headway.core import DISPLACEMENT_MODES
    from headway.reproduce.uniboost import MODES, supports_modes

    assert supports_modes() and set(MODES.values()) <= set(DISPLACEMENT_MODES)
    assert MODES == {"SGLang": "evict", "vLLM": "none"}


@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
def test_codealpaca_answers_are_not_capped():
    from headway.reproduce._common import codealpaca_2k

    rows = codealpaca_2k()
    assert len(rows) > 2000
    assert max(n for _, n in rows) > 128  # the WordPiece counter of headway.predict.data stops at 128


@pytest.mark.slow
@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
def test_driftsched_drift_comes_from_two_real_models():
    from headway.reproduce.driftsched import _pool

    pool = _pool()
    alpaca = [p for p in pool if p.source == "alpaca_eval"]
    others = [p for p in pool if p.source != "alpaca_eval"]
    assert len(alpaca) > 700 and others
    changed = sum(p.before != p.after for p in alpaca)
    assert changed > 0.9 * len(alpaca)  # the update changes nearly every answer's length...
    ratios = {round(p.after / p.before, 3) for p in alpaca}
    assert len(ratios) > 100  # ...by no single constant
    assert all(p.before == p.after for p in others)  # one model's answers only: no drift there


def test_each_experiment_says_when_it_starts(monkeypatch, capsys):
    # an experiment prints its claims when it ends, minutes later: `reproduce all` was silent until then
    import headway.reproduce as reproduce

    class Started(Exception):
        pass

    def runner(out, **kwargs):
        raise Started

    monkeypatch.setattr(reproduce, "_runner", lambda name: runner)
    with pytest.raises(Started):
        reproduce.run_reproduction("driftsched", "unused", quick=True, seed=2, num_seeds=3)
    assert capsys.readouterr().err == "reproducing driftsched (seeds 2-4, quick) ...\n"
    with pytest.raises(Started):
        reproduce.run_reproduction("uniboost", "unused", echo=False)
    assert capsys.readouterr().err == ""


def test_a_printed_rule_states_the_band_the_code_applies():
    # the burst-throughput band's low edge is 1.0067x (1 + 0.01 / 1.5): printed to 3 digits it read
    # "1.01x", and a mean of 1.0016x read "1x", so neither the rule nor the value could be checked
    r = band_rule(1.01, 1.12, neutral=1.0)
    assert r.describe("x") == "reproduced if the mean is in [1.00667x, 1.18x]; direction only if every seed is > 1x"
    row = _row([0.99774, 1.00330, 1.00384], r, unit="x")
    assert row.measured_text() == "1.00163x ± 0.0034 (0.99774 to 1.00384)"
    # far from neutral the figures keep 3 digits; no effect at all prints as none, not as float noise
    assert band_rule(7.7, neutral=1.0).describe("x").startswith("reproduced if the mean is in [5.47x, 11.1x]")
    assert _row([1.0 + 1e-14, 1.0, 1.0], Rule(1.05, math.inf, 1.0), unit="x").measured_text() == "1x ± 5.8e-15 (1 to 1)"


def _uniboost_keys(modes):
    """Every ``<scenario>/<policy>`` key of ``uniboost._one_seed``'s answer."""
    from headway.reproduce import uniboost

    keys = [f"{pre}{label}/{p}" for pre in ("", "kv-") for label in modes for p in ("trail-oracle", "uniboost")]
    keys += [f"main/{p}" for p in ("fcfs", *uniboost.SJF_BASED, "distboost", "uniboost-base")]
    keys += [f"burst/{p}" for p in ("fcfs", "trail-oracle", "uniboost")]
    keys += [f"kv/{p}" for p in ("distboost", "uniboost-base", "uniboost-memguard")]
    return [*keys, "shift/uniboost-memguard", "shift/uniboost"]


def test_every_uniboost_row_that_fails_says_why(monkeypatch, tmp_path):
    # with no effect anywhere every claim fails: the burst-throughput row was "not reproduced" with an
    # empty reason column (and the SLO and gamma-Ada rows would have been too)
    from headway.reproduce import uniboost

    metrics = ("mean_ttlt", "p50_ttlt", "p99_ttlt", "p99_ttft", "ttft_slo99", "ttlt_slo99", "throughput")
    flat = dict.fromkeys(metrics, 100.0) | {"recomputed": 1000.0, "preemptions": 10.0}

    def one_seed(n, seed, modes):
        keys = _uniboost_keys(modes)
        return {k: dict(flat) for k in keys}

    monkeypatch.setattr(uniboost, "_one_seed", one_seed)
    exp = uniboost.run(tmp_path)
    assert exp.rows and all(r.verdict is Verdict.NOT_REPRODUCED for r in exp.rows)
    assert [r.claim for r in exp.rows if not r.reason] == []


def test_the_unified_priority_ablation_runs_where_the_engine_displaces(monkeypatch, tmp_path):
    # it compared distboost and uniboost-base on the main replay, where nothing is displaced: the unified
    # key then only orders waiting requests, as distboost's does, and the row read 1x with 0 preemptions
    # by construction; under KV pressure (the MemGuard ablation's 4,000 blocks) the engine displaces
    from headway.reproduce import uniboost

    metrics = ("mean_ttlt", "p50_ttlt", "p99_ttlt", "p99_ttft", "ttft_slo99", "ttlt_slo99", "throughput")
    flat = dict.fromkeys(metrics, 100.0) | {"recomputed": 1000.0, "preemptions": 0.0}
    calls = []

    def one_seed(n, seed, modes):
        keys = _uniboost_keys(modes)
        out = {k: dict(flat) for k in keys}
        out["kv/distboost"] = flat | {"p99_ttft": 130.0, "preemptions": 40.0}
        calls.append(seed)
        return out

    monkeypatch.setattr(uniboost, "_one_seed", one_seed)
    row = next(r for r in uniboost.run(tmp_path).rows if "unified priority" in r.claim)
    assert row.values == (1.3,) * len(calls) and "4,000 KV blocks" in row.setting
    assert row.reason.startswith("P99 TTFT distboost 130.00 s vs uniboost-base 100.00 s; preemptions 40 vs 0")


def test_modes_whose_runs_are_the_same_give_one_row_per_claim(monkeypatch, tmp_path):
    # at the default cache TRAIL+ preempts nothing, so the SGLang and vLLM modes are one run: its
    # verdict counted twice overstated the page's "reproduced"; runs that differ keep a row per mode
    from headway.reproduce import uniboost

    if not uniboost.supports_modes():
        pytest.skip("this engine has no displacement modes")
    metrics = ("mean_ttlt", "p50_ttlt", "p99_ttlt", "p99_ttft", "ttft_slo99", "ttlt_slo99", "throughput")
    flat = dict.fromkeys(metrics, 100.0) | {"recomputed": 1000.0, "preemptions": 10.0}
    differ = {"on": False}

    def one_seed(n, seed, modes):
        keys = _uniboost_keys(modes)
        out = {k: dict(flat) for k in keys}
        if differ["on"]:
            out[f"{next(iter(modes))}/trail-oracle"]["preemptions"] = 3.0
        return out

    monkeypatch.setattr(uniboost, "_one_seed", one_seed)
    headline = "UniBoost reduces P99 TTLT by 35-50 % vs SRPT with perfect length prediction (TRAIL+)"
    rows = [r for r in uniboost.run(tmp_path).rows if r.claim == headline]
    assert len(rows) == 1 and f"{' and '.join(uniboost.MODES)} modes, identical runs" in rows[0].setting
    differ["on"] = True
    rows = [r for r in uniboost.run(tmp_path).rows if r.claim == headline]
    assert [r.setting.split(",")[1].strip().split(" (")[0] for r in rows] == [f"{m} mode" for m in uniboost.MODES]
