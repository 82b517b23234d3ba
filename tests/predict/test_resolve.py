"""Scorer specs shared by the gateway and the vLLM plugin (``headway.predict._resolve``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headway.predict._resolve import not_a_spec_hint, predictor_spec


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


def test_finding_a_checkpoint_does_not_import_the_training_code(tmp_path: Path) -> None:
    """A vLLM venv may lack scipy (the training code's): a missing checkpoint directory must be
    named, not a missing scipy."""
    import subprocess
    import sys

    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'scipy': raise ModuleNotFoundError('scipy blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from headway.predict.score import ensure_predictor\n"
        f"ensure_predictor({str(tmp_path / 'none')!r}, train_if_missing=False)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "CheckpointError" in proc.stderr and "no predictor checkpoint" in proc.stderr, proc.stderr[-500:]


def test_load_predictor_names_what_is_not_a_predictor() -> None:
    from headway.predict._load import load_batch_scorer, load_predictor

    with pytest.raises(ValueError, match=r"^scorer 'headway.policies:batch_scorer' names no predictor"):
        load_predictor("headway.policies:batch_scorer")
    with pytest.raises(ValueError, match=r"^scorer 'default:fp4': unknown backend 'fp4'"):
        load_predictor("default:fp4")
    with pytest.raises(ValueError, match=r"^scorer 'default:fp4': unknown backend 'fp4'"):
        load_batch_scorer("default:fp4", backend="onnx")
    assert load_batch_scorer("math:fsum")([1.0, 2.0]) == 3.0  # a module spec is resolved as the gateway does


def test_what_a_spec_that_names_nothing_was_probably_meant_to_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").mkdir()
    assert not_a_spec_hint("defualt") == "; did you mean 'default'?"
    assert not_a_spec_hint("noisy_oracle", ("default", "noisy-oracle", "oracle")) == "; did you mean 'noisy-oracle'?"
    assert not_a_spec_hint("plain") == (
        "; the directory 'plain' holds no predictor.json, so it is no predictor checkpoint"
    )
    assert not_a_spec_hint("ck2") == f"; there is no checkpoint directory 'ck2' in {tmp_path}"
