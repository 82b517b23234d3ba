"""The fast first-look scorer: distilled from a checkpoint's own scores, never loaded stale or corrupt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from headway.predict import CheckpointError, Scorer  # noqa: E402
from headway.predict._cli import main as predictor_main  # noqa: E402
from headway.predict.data import load_jsonl, split_by_prompt  # noqa: E402
from headway.predict.fast import FAST_FILE, distill_fast, ensure_fast, load_fast  # noqa: E402
from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path) -> Path:
    """A random-head checkpoint whose settings say it was trained on ``synthetic_jsonl``."""
    torch.manual_seed(0)
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    torch.nn.init.normal_(model.head.weight, std=1.0)
    ck = save_checkpoint(model, tokenizer, tmp_path / "ck", fine_tuned=True, max_length=32)
    meta = json.loads((ck / "predictor.json").read_text())
    meta["training"] = {"data": str(synthetic_jsonl), "unit": "tokens", "test_frac": 0.2, "val_frac": 0.1, "seed": 0}
    (ck / "predictor.json").write_text(json.dumps(meta))
    return ck


def test_distill_mimics_the_checkpoint_on_its_training_prompts_only(checkpoint: Path, synthetic_jsonl: Path) -> None:
    fast = distill_fast(checkpoint, log=None)
    split = split_by_prompt(load_jsonl(synthetic_jsonl), 0.2, 0.1, 0)
    fit = [ex.prompt for ex in (*split.train.examples, *split.val.examples)]
    held = [ex.prompt for ex in split.test.examples]
    info = json.loads((checkpoint / "fast.json").read_text())
    assert info["distilled_on"]["prompts"] == len(set(fit)) and held  # never the held-out prompts
    assert info["heldout"]["n"] == len(held)
    encoder = Scorer.from_checkpoint(checkpoint).score(fit)
    tau = stats.kendalltau(fast.score(fit), encoder).statistic
    assert tau > 0.6 and info["fit_kendall_tau_b_vs_encoder"] == pytest.approx(tau, abs=1e-3)
    assert abs(float(np.mean(fast.score(fit))) - float(np.mean(encoder))) < 0.1 * float(np.std(encoder))  # same scale
    loaded = load_fast(checkpoint)
    assert np.array_equal(loaded.score(held), fast.score(held))
    assert loaded.score_one(held[0]) == fast.score([held[0]])[0]


def test_a_missing_stale_or_corrupt_fast_scorer_never_loads(checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match="no fast scorer; run `headway predictor distill"):
        load_fast(checkpoint)
    distill_fast(checkpoint, log=None)
    sidecar = checkpoint / "fast.json"
    good = sidecar.read_text()
    info = json.loads(good)
    sidecar.write_text(json.dumps({**info, "weights_sha256": "0" * 64}))
    with pytest.raises(CheckpointError, match="stale fast scorer"):
        load_fast(checkpoint)
    sidecar.write_text(good)
    weights = np.load(checkpoint / FAST_FILE)
    weights[0] += 1.0
    np.save(checkpoint / FAST_FILE, weights)
    with pytest.raises(CheckpointError, match="fast scorer is corrupt or was modified"):
        load_fast(checkpoint)
    said: list[str] = []
    ensure_fast(checkpoint, log=said.append)  # derived from the checkpoint: made again
    assert "distilling one" in said[0]
    assert load_fast(checkpoint).meta["fast_sha256"] == info["fast_sha256"]  # the same fit as before


def test_features_do_not_depend_on_the_process_hash_seed() -> None:
    code = "from headway.predict.fast import _features; print(_features('Write a LONG essay, please!', 1024))"
    out = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2")
    }
    assert len(out) == 1 and "[" in next(iter(out))


def test_distill_command_and_its_errors(
    checkpoint: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert predictor_main(["predictor", "distill", "--model", str(checkpoint), "--data", str(synthetic_jsonl)]) == 0
    out = capsys.readouterr().out
    assert f"distilled {checkpoint / FAST_FILE} from 120 prompts of {synthetic_jsonl}" in out
    assert "held-out" not in out  # its own --data: no held-out split to report on
    with pytest.raises(ValueError, match="alpha must be > 0, got 0"):
        distill_fast(checkpoint, alpha=0.0, log=None)
    with pytest.raises(ValueError, match="buckets must be a power of two >= 2, got 1000"):
        distill_fast(checkpoint, buckets=1000, log=None)
    assert predictor_main(["predictor", "distill", "--model", str(checkpoint.parent / "nope")]) == 2
    assert "no predictor checkpoint" in capsys.readouterr().err
