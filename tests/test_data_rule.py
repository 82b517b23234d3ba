"""The suite's data rule (tests/conftest.py): where the shared data is required, missing data fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # two pytest processes


@pytest.mark.parametrize("env", [{"HEADWAY_DATA_DIR": "/nonexistent/headway-data"},
                                 {"CI": "true", "HEADWAY_DATA_DIR": "/nonexistent/headway-data"}])
def test_a_missing_data_folder_fails_real_data_tests_where_it_is_required(env: dict[str, str]) -> None:
    # two kinds of data skip: the data_dir fixture's (test_data.py) and a skipif mark (test_reproduce.py)
    targets = ["tests/predict/test_data.py::test_alpaca_eval_loader",
               "tests/reproduce/test_reproduce.py::test_codealpaca_answers_are_not_capped"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets],
                         cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:]
    assert run.stdout.count("the shared data is required here") >= 2, run.stdout[-2000:]  # CI: the summary too
    assert "2 errors" in run.stdout
