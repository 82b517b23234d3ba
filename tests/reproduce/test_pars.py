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


def test_the_full_run_trains_its_predictor_under_its_own_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # it trained into the default checkpoint's place, after which `--scorer default` (the gateway, the
    # plugin, simulate) loaded that predictor on this machine instead of the shipped one
    pytest.importorskip("torch")
    import headway.predict.score as score
    import headway.predict.train as train
    from headway.predict._paths import default_predictor_dir
    from headway.reproduce import pars

    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path))
    names: list[str] = []

    def checkpoint(name: str, log: object, **config: object) -> Path:
        names.append(name)
        return tmp_path / name

    class Stop(Exception):
        pass

    def stop(path: Path, *args: object, **kwargs: object) -> None:
        raise Stop(str(path))

    def no_training(config: object, path: Path) -> None:
        raise AssertionError(f"trained into {path}")

    monkeypatch.setattr(pars, "_checkpoint", checkpoint)
    monkeypatch.setattr(train, "train_predictor", no_training)
    monkeypatch.setattr(score.Scorer, "from_checkpoint", stop)
    with pytest.raises(Stop, match=r"trained$"):  # the run's own predictor is the one it scores with
        pars.run(tmp_path / "out")
    assert "trained" in names and not default_predictor_dir().exists()
