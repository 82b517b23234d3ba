"""Training: frozen-mode runs learn a synthetic signal; full mode and every loss run end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from headway.predict import (
    CheckpointError,
    DataError,
    EncoderError,
    PredictError,
    Scorer,
    TrainConfig,
    load_jsonl,
    rank_metrics,
    train_predictor,
)
from headway.predict.data import split_by_prompt
from headway.predict.model import load_checkpoint
from headway.predict.score import TorchBackend
from headway.predict.train import default_predictor_dir


def _cfg(data: Path, encoder: Path | None, **kw: object) -> TrainConfig:
    base: dict[str, object] = {
        "data": str(data),
        "encoder": str(encoder) if encoder else None,
        "mode": "frozen",
        "pooling": "mean",
        "epochs": 60,
        "batch_size": 16,
        "max_length": 32,
        "progress": False,
        "threads": 1,
        "test_frac": 0.25,
        "val_frac": 0.15,
    }
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _untrained_tau(ck: Path, data: Path, cfg: TrainConfig) -> float:
    """Tau of the same architecture with a fresh (untrained) head on the same held-out prompts."""
    import torch

    loaded = load_checkpoint(ck)
    torch.manual_seed(123)
    torch.nn.init.normal_(loaded.model.head.weight, std=0.02)
    scorer = Scorer(TorchBackend(loaded.model), loaded.tokenizer, max_length=cfg.max_length)
    test = split_by_prompt(load_jsonl(data), cfg.test_frac, cfg.val_frac, cfg.seed).test
    return rank_metrics(scorer.score(test.prompts()), test.lengths()).kendall_tau_b


@pytest.mark.parametrize("loss", ["pairwise", "pointwise", "listwise"])
def test_frozen_training_learns_a_synthetic_signal(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, loss: str
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, loss=loss)
    result = train_predictor(cfg, out_dir=tmp_path / loss)
    assert result.test is not None and result.n_test > 15
    assert result.test.kendall_tau_b > 0.5, result.history[-1]
    assert result.test.kendall_tau_b > _untrained_tau(result.path, synthetic_jsonl, cfg) + 0.3
    assert result.unit == "tokens (as given)"
    # the saved checkpoint reproduces the reported held-out metric
    test = split_by_prompt(load_jsonl(synthetic_jsonl), cfg.test_frac, cfg.val_frac, cfg.seed).test
    again = rank_metrics(Scorer.from_checkpoint(result.path).score(test.prompts()), test.lengths())
    assert again.kendall_tau_b == pytest.approx(result.test.kendall_tau_b, abs=1e-6)
    if loss == "pairwise":
        assert result.pairs_seen > 0 and 0 < result.distinct_pairs <= result.pairs_seen


def test_full_mode_runs_and_saves_a_fine_tuned_encoder(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, mode="full", epochs=2, lr=1e-3, pairs_from="global", max_pairs=300)
    result = train_predictor(cfg, out_dir=tmp_path / "full")
    assert result.steps > 0 and result.pairs_seen > 0 and result.distinct_pairs <= 300
    meta = load_checkpoint(result.path).meta
    assert meta["encoder"]["fine_tuned"] is True
    assert meta["training"]["loss"] == "pairwise" and meta["data"]["unit"] == "tokens"
    assert (result.path / "encoder" / "config.json").is_file()
    assert meta["result"]["heldout_test"]["n"] == result.n_test


@pytest.mark.parametrize("mode", ["full", "frozen"])
def test_a_predictor_on_the_first_layers_reloads_with_them(
    tmp_path: Path, tiny_encoder_3_layers: Path, synthetic_jsonl: Path, mode: str
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder_3_layers, mode=mode, epochs=2, encoder_layers=2)
    result = train_predictor(cfg, out_dir=tmp_path / mode)
    loaded = load_checkpoint(result.path)
    assert len(loaded.model.encoder.encoder.layer) == 2
    assert loaded.meta["encoder"]["num_layers"] == 2 and loaded.meta["training"]["encoder_layers"] == 2
    assert result.test is not None
    test = split_by_prompt(load_jsonl(synthetic_jsonl), cfg.test_frac, cfg.val_frac, cfg.seed).test
    again = rank_metrics(Scorer.from_checkpoint(result.path).score(test.prompts()), test.lengths())
    assert again.kendall_tau_b == pytest.approx(result.test.kendall_tau_b, abs=1e-6)


def test_training_is_seeded(tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, epochs=5)
    a = train_predictor(cfg, out_dir=tmp_path / "a")
    b = train_predictor(cfg, out_dir=tmp_path / "b")
    assert a.history == b.history
    prompts = load_jsonl(synthetic_jsonl).prompts()[:10]
    assert np.allclose(Scorer.from_checkpoint(a.path).score(prompts), Scorer.from_checkpoint(b.path).score(prompts))


@pytest.mark.slow
def test_frozen_minilm_learns_the_synthetic_signal(tmp_path: Path, synthetic_jsonl: Path) -> None:
    """The real default encoder (bundled MiniLM-L6), frozen: the fast mode of the issue."""
    cfg = _cfg(synthetic_jsonl, None, pooling="auto", epochs=40)
    result = train_predictor(cfg, out_dir=tmp_path / "minilm")
    assert result.test is not None and result.test.kendall_tau_b > 0.6


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown loss"):
        TrainConfig(loss="hinge")
    with pytest.raises(ValueError, match="unknown mode"):
        TrainConfig(mode="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="encoder_layers must be >= 1, got 0"):
        TrainConfig(encoder_layers=0)
    with pytest.raises(ValueError, match="pretrain needs mode='full'"):
        TrainConfig(pretrain="sharegpt", mode="frozen")
    with pytest.raises(ValueError, match="pretrain_epochs must be >= 1, got 0"):
        TrainConfig(pretrain="sharegpt", pretrain_epochs=0)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"epochs": 0}, "epochs must be >= 1, got 0"),
        ({"epochs": -2}, "epochs must be >= 1, got -2"),
        ({"partners": 0}, "partners must be >= 1, got 0"),
        ({"max_pairs": 0}, "max_pairs must be >= 1, got 0"),
        ({"max_pairs": -1}, "max_pairs must be >= 1, got -1"),
        ({"batch_size": 1}, "batch_size must be >= 2, got 1"),
        ({"max_length": 4}, "max_length must be >= 8, got 4"),
        ({"lr": -1.0}, "lr must be a finite number > 0, got -1.0"),
        ({"lr": float("nan")}, "lr must be a finite number > 0, got nan"),
        ({"head_lr": -1.0}, "head_lr must be a finite number > 0, got -1.0"),
        ({"head_lr": 0.0}, "head_lr must be a finite number > 0, got 0.0"),
        ({"margin": -1.0}, "margin must be a finite number >= 0, got -1.0"),
        ({"margin": float("nan")}, "margin must be a finite number >= 0, got nan"),
        ({"weight_decay": float("inf")}, "weight_decay must be a finite number >= 0, got inf"),
        ({"grad_clip": -1.0}, "grad_clip must be a finite number >= 0, got -1.0"),
        ({"warmup_frac": 1.5}, r"warmup_frac must be in \[0, 1\], got 1.5"),
        ({"seed": -1}, "seed must be in 0..4294967295, got -1"),
        ({"seed": 2**32}, "seed must be in 0..4294967295, got 4294967296"),
        ({"test_frac": 0.6, "val_frac": 0.5}, "test_frac and val_frac must be in .* got 0.6 and 0.5"),
        ({"delta": float("nan")}, r"delta must be in \[0, 1\), got nan"),
    ],
)
def test_settings_that_would_train_nothing_or_harm_are_refused_by_name(
    setting: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**setting)  # type: ignore[arg-type]


def test_the_output_is_checked_before_anything_else(tmp_path: Path, tiny_encoder: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    cfg = _cfg(tmp_path / "no-such-data.jsonl", tiny_encoder)  # loading it would fail: the output fails first
    with pytest.raises(CheckpointError, match=f"{precious}: exists and is not a predictor checkpoint"):
        train_predictor(cfg, out_dir=precious)
    assert [f.name for f in precious.iterdir()] == ["thesis.tex"]
    with pytest.raises(DataError, match=r"no-such-data\.jsonl: file not found"):
        train_predictor(cfg, out_dir=tmp_path / "new")


@pytest.mark.parametrize("name", ["..", ".", "", "../../x", "/abs", "a/b"])
def test_a_predictor_name_cannot_leave_the_cache(name: str) -> None:
    with pytest.raises(ValueError, match=f"predictor name {name!r} must be a plain name"):
        default_predictor_dir(name)


def test_more_tokens_than_the_encoder_has_positions_are_refused(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, max_length=513, epochs=1)
    with pytest.raises(EncoderError, match=r"max_length 513 is more than .* cover 512 tokens; use --max-length 512"):
        train_predictor(cfg, out_dir=tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
    assert train_predictor(replace(cfg, max_length=512), out_dir=tmp_path / "ck").path == tmp_path / "ck"


@pytest.mark.parametrize("mode", ["full", "frozen"])
def test_a_diverging_run_stops_and_keeps_the_old_checkpoint(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, mode: str
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, mode=mode, epochs=2)
    old = train_predictor(cfg, out_dir=tmp_path / "ck").path
    before = (old / "model.safetensors").read_bytes()
    cfg.head_lr = float("inf")  # past the settings' checks, as a run whose loss blows up
    with pytest.raises(PredictError, match=r"training diverged: loss nan at epoch 1, step 2 .*nothing was saved"):
        train_predictor(cfg, out_dir=old)
    assert (old / "model.safetensors").read_bytes() == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ck", "synthetic.jsonl"]


@pytest.mark.parametrize("pairs_from", ["batch", "global"])
def test_data_without_a_pair_to_learn_from_is_refused(
    tmp_path: Path, tiny_encoder: Path, pairs_from: str, recwarn: pytest.WarningsRecorder
) -> None:
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps({"prompt": f"prompt {i}", "output_tokens": 100}) + "\n" for i in range(40)))
    cfg = _cfg(same, tiny_encoder, mode="full", epochs=1, pairs_from=pairs_from)
    with pytest.raises(DataError, match=r"same\.jsonl: nothing to learn from .*pair.*; nothing was saved"):
        train_predictor(cfg, out_dir=tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


def test_pretraining_gives_stage_two_its_encoder(tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path) -> None:
    rows = [json.loads(line) for line in synthetic_jsonl.read_text().splitlines()]
    other = tmp_path / "reversed.jsonl"  # the same prompts ranked the other way round
    top = max(r["output_tokens"] for r in rows)
    other.write_text("".join(json.dumps({**r, "output_tokens": top + 1 - r["output_tokens"]}) + "\n" for r in rows))
    cfg = _cfg(synthetic_jsonl, tiny_encoder, mode="full", epochs=1, lr=1e-3)
    plain = train_predictor(cfg, out_dir=tmp_path / "plain")
    pre = train_predictor(replace(cfg, pretrain=str(other), pretrain_epochs=2), out_dir=tmp_path / "pre")
    meta = load_checkpoint(pre.path).meta
    assert meta["pretrain"]["data"] == str(other) and meta["pretrain"]["epochs"] == 2
    assert meta["pretrain"]["n_train"] == plain.n_train and meta["training"]["pretrain"] == str(other)
    assert "pretrain" not in load_checkpoint(plain.path).meta
    prompts = load_jsonl(synthetic_jsonl).prompts()[:10]
    # same seed, same stage 2: only the encoder it started from differs
    a, b = Scorer.from_checkpoint(pre.path).score(prompts), Scorer.from_checkpoint(plain.path).score(prompts)
    assert not np.allclose(a, b)


def _taus_for_validation(monkeypatch: pytest.MonkeyPatch, taus: list[float]) -> list[np.ndarray]:
    """Make the validation of epoch k report ``taus[k - 1]`` (the held-out test keeps its real metric);
    returns the list into which each validation's scores are recorded."""
    import headway.predict.train as train_module

    real = train_module.rank_metrics
    seen: list[np.ndarray] = []

    def fake(scores: object, lengths: object, *args: object, **kw: object) -> object:
        metrics = real(scores, lengths, *args, **kw)  # type: ignore[arg-type]
        if len(seen) < len(taus):
            seen.append(np.array(scores, dtype=float))
            metrics = replace(metrics, kendall_tau_b=taus[len(seen) - 1])
        return metrics

    monkeypatch.setattr(train_module, "rank_metrics", fake)
    return seen


@pytest.mark.parametrize(
    ("taus", "best"),
    [
        ([0.2, 0.5, float("nan"), float("nan")], 2),  # collapses after its best epoch
        ([float("nan"), 0.3, float("nan"), 0.1], 2),  # a tie before the first finite tau
        ([0.4, float("nan"), 0.6, float("nan")], 3),
    ],
)
def test_an_epoch_whose_validation_tau_is_nan_does_not_replace_a_better_one(
    tmp_path: Path,
    tiny_encoder: Path,
    synthetic_jsonl: Path,
    monkeypatch: pytest.MonkeyPatch,
    taus: list[float],
    best: int,
) -> None:
    seen = _taus_for_validation(monkeypatch, taus)
    cfg = _cfg(synthetic_jsonl, tiny_encoder, epochs=len(taus))
    result = train_predictor(cfg, out_dir=tmp_path / "ck")
    assert len(seen) == len(taus)
    assert result.best_epoch == best
    meta = load_checkpoint(result.path).meta
    assert meta["result"]["best_epoch"] == best and meta["result"]["best_val_kendall_tau_b"] == taus[best - 1]
    # the saved weights are those of the best epoch: they score the validation prompts as it did
    val = split_by_prompt(load_jsonl(synthetic_jsonl), cfg.test_frac, cfg.val_frac, cfg.seed).val
    assert not np.allclose(seen[best - 1], seen[-1], atol=1e-4)
    assert np.allclose(Scorer.from_checkpoint(result.path).score(val.prompts()), seen[best - 1], atol=1e-4)


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_without_a_validation_set_the_last_epoch_is_kept_and_predictor_json_is_strict(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path
) -> None:
    cfg = _cfg(synthetic_jsonl, tiny_encoder, epochs=3, val_frac=0.0)
    said: list[str] = []
    result = train_predictor(cfg, out_dir=tmp_path / "ck", log=said.append)
    assert result.n_val == 0 and result.best_epoch == 3
    warned = "warning: 0 validation examples: val tau_b reads nan and the last epoch is kept"
    assert any(s.startswith(warned) for s in said)
    meta = _strict_json((result.path / "predictor.json").read_text())
    assert isinstance(meta, dict)
    assert meta["result"]["best_val_kendall_tau_b"] is None and meta["result"]["best_epoch"] == 3
    assert [h["val_kendall_tau_b"] for h in meta["result"]["history"]] == [None, None, None]
    assert meta["result"]["heldout_test"]["n"] == result.n_test
    # the readers take it: it loads, scores, and evaluates on its own split
    assert load_checkpoint(result.path).meta["result"]["best_val_kendall_tau_b"] is None
    assert Scorer.from_checkpoint(result.path).score(["Write a long story about bees."]).shape == (1,)


def test_validation_ranks_each_models_lengths_on_their_own() -> None:
    # training pairs only compare one model's answers; pooled, a model whose answers are all longer
    # made a score that only tells the models apart look best (and the epoch chosen by it)
    from headway.predict.data import Example, ExampleSet
    from headway.predict.train import validation_tau

    def ex(i: int, n: int, m: str) -> Example:
        return Example(f"prompt {i}", n, m)

    # within each model, the order is the reverse of the scores'; across models, b's are all longer
    val = ExampleSet("v", "tokens", (ex(0, 10, "a"), ex(1, 20, "a"), ex(2, 100, "b"), ex(3, 200, "b")))
    scores = np.array([2.0, 1.0, 4.0, 3.0])
    assert validation_tau(scores, val) == pytest.approx(-1.0)  # pooled, tau_b is +0.33
    # one model (or none named): the pooled tau, as before
    one = ExampleSet("v", "tokens", (ex(0, 10, "a"), ex(1, 20, "a"), ex(2, 30, "a")))
    assert validation_tau(np.array([1.0, 2.0, 3.0]), one) == pytest.approx(1.0)
    # a model with one example has no tau: left out, not nan
    lone = ExampleSet("v", "tokens", (*val.examples[:2], ex(4, 50, "c")))
    assert validation_tau(np.array([2.0, 1.0, 0.0]), lone) == pytest.approx(-1.0)


def test_training_keeps_the_epoch_that_validation_tau_ranks_best(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import headway.predict.train as train_module

    taus = iter([0.1, 0.6, 0.3])
    calls: list[int] = []

    def spy(scores: np.ndarray, val: object) -> float:
        calls.append(len(scores))
        return next(taus)

    monkeypatch.setattr(train_module, "validation_tau", spy)
    result = train_predictor(_cfg(synthetic_jsonl, tiny_encoder, epochs=3), out_dir=tmp_path / "ck")
    assert len(calls) == 3 and result.best_epoch == 2
