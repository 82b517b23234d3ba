"""``headway reproduce pars`` (``headway.reproduce.pars``): what it tells while it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from headway.reproduce import Experiment


def test_training_a_predictor_is_told_when_it_starts_and_noted_in_the_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # training takes minutes and the report is written at the end: a line kept only for the report
    # leaves the command silent all that time
    pytest.importorskip("torch")
    import headway.predict.train as train
    from headway.reproduce import pars

    trained: list[Path] = []
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(train, "train_predictor", lambda config, path: trained.append(path))
    exp = Experiment("pars", "PARS")
    path = pars._checkpoint("pairwise-frozen", pars._note_and_tell(exp), mode="frozen", loss="pairwise")
    assert trained == [path] and path == tmp_path / "predictors" / "reproduce-pairwise-frozen"
    line = f"training predictor pairwise-frozen into {path}"
    assert exp.notes == [line]
    assert capsys.readouterr().err == line + "\n"
