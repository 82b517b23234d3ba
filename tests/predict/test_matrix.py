"""The cross-model matrix end to end on the real alpaca_eval lengths, with a tiny encoder."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from headway.predict import DataError, TrainConfig, cross_model_matrix


@pytest.mark.slow
def test_matrix_trains_each_loss_and_reuses_checkpoints(
    tmp_path: Path, tiny_encoder: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = TrainConfig(encoder=str(tiny_encoder), mode="frozen", epochs=3, max_length=32, threads=1, progress=False)
    models = ["gpt4", "claude-2.1"]
    result = cross_model_matrix(
        "gpt4", models, ["pairwise", "listwise"], cfg, data_dir, tmp_path / "ck", log=lambda _m: None
    )
    assert set(result.cells) == {(loss, m) for loss in ("pairwise", "listwise", "oracle") for m in models}
    oracle_self = result.cells[("oracle", "gpt4")]
    assert oracle_self.kendall_tau_b == pytest.approx(1.0)  # the training model's own lengths
    assert 0.3 < result.cells[("oracle", "claude-2.1")].kendall_tau_b < 0.9
    assert result.n_test_prompts > 100
    text = result.to_markdown()
    assert "| claude-2.1 |" in text and "Kendall tau_b" in text and "tokens (cl100k_base)" in text
    assert "resampling ceiling" in text

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    reused = cross_model_matrix(
        "gpt4",
        models,
        ["pairwise"],
        cfg,
        data_dir,
        checkpoints={"pairwise": tmp_path / "ck" / "gpt4-pairwise-frozen"},
        log=lambda _m: None,
    )
    assert reused.cells[("pairwise", "claude-2.1")] == result.cells[("pairwise", "claude-2.1")]
    assert list(temporary.iterdir()) == []  # no checkpoint directory left behind without an out_root
    with pytest.raises(DataError, match="not trained like this matrix"):
        cross_model_matrix(
            "gpt4",
            models,
            ["pointwise"],
            cfg,
            data_dir,
            checkpoints={"pointwise": tmp_path / "ck" / "gpt4-pairwise-frozen"},
            log=lambda _m: None,
        )


def test_a_checkpoint_for_a_loss_not_trained_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"given for pointwise, which is not among the losses \['pairwise'\]"):
        cross_model_matrix("gpt4", ["gpt4"], ["pairwise"], checkpoints={"pointwise": tmp_path}, log=lambda _m: None)
