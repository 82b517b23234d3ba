"""Scorer specs shared by the gateway and the vLLM plugin (``headway.predict._resolve``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headway.predict._resolve import predictor_spec


def test_predictor_specs(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "predictor.json").write_text("{}")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert predictor_spec("default") == (None, None)
    assert predictor_spec("default:onnx-int8") == (None, "onnx-int8")
    assert predictor_spec(str(ckpt)) == (str(ckpt), None)
    assert predictor_spec(f"{ckpt}:onnx-int8") == (str(ckpt), "onnx-int8")
    assert predictor_spec(str(plain)) == (str(plain), None)  # a path: loading it says what is missing
    assert predictor_spec(str(tmp_path / "missing")) == (str(tmp_path / "missing"), None)
    assert predictor_spec("~/ckpt:onnx") == ("~/ckpt", "onnx")
    assert predictor_spec("./ckpt") == ("./ckpt", None)
    assert predictor_spec("headway.predict.score:default_scorer()") is None
    assert predictor_spec("mymodule:attr") is None


def test_a_module_spec_stays_a_module_where_a_directory_has_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodule").mkdir()
    monkeypatch.chdir(tmp_path)
    assert predictor_spec("mymodule:attr") is None
    (tmp_path / "mymodule" / "predictor.json").write_text("{}")
    assert predictor_spec("mymodule:onnx") == ("mymodule", "onnx")


def test_a_directory_with_a_colon_in_its_name_is_that_directory(tmp_path: Path) -> None:
    versioned = tmp_path / "ck:v2"
    versioned.mkdir()
    assert predictor_spec(str(versioned)) == (str(versioned), None)
    assert predictor_spec(f"{versioned}:onnx") == (str(versioned), "onnx")
    assert predictor_spec(f"{tmp_path}/ck:onnx") == (f"{tmp_path}/ck", "onnx")  # no such directory: DIR:BACKEND
