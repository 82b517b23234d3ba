"""Rank metrics on hand cases, and the resampling ceiling on the real data."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from headway.predict import DataError
from headway.predict.data import Example, ExampleSet
from headway.predict.evaluate import evaluate_scorer, format_metrics, pair_accuracy, rank_metrics, resampling_ceiling


def test_perfect_and_reversed_rankings() -> None:
    lengths = np.array([10, 20, 30, 40, 80])
    up = rank_metrics(np.log(lengths), lengths)
    assert up.kendall_tau_b == pytest.approx(1.0) and up.spearman == pytest.approx(1.0)
    assert up.pair_accuracy == 1.0
    down = rank_metrics(-lengths, lengths)
    assert down.kendall_tau_b == pytest.approx(-1.0) and down.pair_accuracy == 0.0


def test_pair_accuracy_uses_the_delta_filter_and_half_credit_for_ties() -> None:
    lengths = [100, 80, 81, 10]
    scores = [1.0, 0.0, 0.0, 0.5]
    # pairs passing delta 0.2: (100,80) (100,10) (80,10) (81,10); (100,81): 19/100 and (80,81) fail
    # correct: 100>80 yes, 100>10 yes, 80>10: 0.0 < 0.5 no, 81>10 no -> 2 / 4
    acc, n, sampled = pair_accuracy(scores, lengths, 0.2)
    assert (acc, n, sampled) == (pytest.approx(2 / 4), 4, False)
    acc_tie, n_tie, _ = pair_accuracy([1.0, 1.0], [100, 10], 0.2)
    assert (acc_tie, n_tie) == (0.5, 1)
    acc_none, n_none, _ = pair_accuracy([1.0, 2.0], [100, 90], 0.2)
    assert n_none == 0 and math.isnan(acc_none)


def test_metrics_match_scipy() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 500, 300)
    scores = np.log(lengths) + rng.normal(0, 1, 300)
    m = rank_metrics(scores, lengths, unit="tokens (cl100k_base)")
    assert m.kendall_tau_b == pytest.approx(stats.kendalltau(scores, lengths).statistic)
    assert m.spearman == pytest.approx(stats.spearmanr(scores, lengths).statistic)
    assert "tokens (cl100k_base)" in format_metrics(m)


def test_resampling_ceiling(data_dir: Path) -> None:
    c = resampling_ceiling(data_dir)
    assert 0.75 < c["spearman"] < 0.86  # ~0.81: the same prompt resampled is not perfectly predictable
    assert c["kendall_tau_b"] < c["spearman"]


class _LengthScorer:
    """Scores a prompt by its length, and records how many prompts each call got."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, prompts: list[str]) -> np.ndarray:
        self.calls.append(len(prompts))
        return np.array([len(p) for p in prompts], dtype=np.float64)


def test_evaluate_scorer_checks_delta_and_shows_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = ExampleSet("d", "tokens", tuple(Example("x" * (i + 1), i + 1) for i in range(600)))
    scorer = _LengthScorer()
    for bad in (5.0, -1.0, 1.0, math.nan):
        with pytest.raises(DataError, match=rf"delta must be in \[0, 1\), got {bad}"):
            evaluate_scorer(scorer, data, bad)  # type: ignore[arg-type]
    assert scorer.calls == []
    quiet = evaluate_scorer(scorer, data)  # type: ignore[arg-type]
    assert scorer.calls == [600] and capsys.readouterr().err == ""
    shown = evaluate_scorer(scorer, data, progress=True)  # type: ignore[arg-type]
    assert scorer.calls == [600, 256, 256, 88] and capsys.readouterr().err == ""  # no bar in a log file
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # stderr a terminal: the bar
    assert evaluate_scorer(scorer, data, progress=True) == shown  # type: ignore[arg-type]
    assert "scoring" in capsys.readouterr().err
    assert shown == quiet and shown[None].kendall_tau_b == pytest.approx(1.0)
