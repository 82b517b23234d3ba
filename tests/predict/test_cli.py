"""``python -m headway.predict predictor ...``: help, eval on generic JSONL, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headway.predict._cli import main


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["matrix"], ["export-onnx"]])
def test_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["predictor", *command, "--help"])
    assert info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_eval_on_generic_jsonl_and_bad_input(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    encoder, tokenizer = load_encoder(tiny_encoder)
    ck = save_checkpoint(LengthPredictor(encoder), tokenizer, tmp_path / "ck", fine_tuned=True)
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl)]) == 0
    out = capsys.readouterr().out
    assert "Kendall tau_b" in out and "Spearman" in out and "pair accuracy" in out
    assert "tokens (as given)" in out and "|a-b|/max(a,b) >= 0.2" in out

    assert main(["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl), "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["all"]["n"] == 120

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "output_tokens": 3}\n{"prompt": "x", "output_tokens": 0}\n')
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(bad)]) == 2
    assert f"{bad}:2: 'output_tokens' must be positive" in capsys.readouterr().err

    assert main(["predictor", "eval", "--model", str(tmp_path / "nope"), "--data", str(synthetic_jsonl)]) == 2
    assert "checkpoint directory does not exist" in capsys.readouterr().err

    not_encoder = tmp_path / "not-an-encoder"
    not_encoder.mkdir()
    code = main(
        [
            "predictor",
            "train",
            "--data",
            str(synthetic_jsonl),
            "--encoder",
            str(not_encoder),
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert f"{not_encoder}: not a Hugging Face model directory" in capsys.readouterr().err


def test_training_another_encoder_needs_a_checkpoint_name(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["predictor", "train", "--data", str(synthetic_jsonl), "--encoder", str(tiny_encoder), "--no-progress"])
    assert code == 2
    assert "name the checkpoint with --name or --out" in capsys.readouterr().err
