"""``benchmarks/bench_install_size.py``: the command its result file shows (the run itself installs from
the package index, a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_install_size.py"


def test_the_shown_command_hides_the_workdir_path_only() -> None:
    spec = importlib.util.spec_from_file_location("bench_install_size", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shown = module.shown_command
    base = "python benchmarks/bench_install_size.py"
    assert shown([]) == base
    assert shown(["--workdir", "/tmp/x"]) == f"{base} --workdir DIR"
    assert shown(["--workdir=/tmp/x"]) == f"{base} --workdir=DIR"
    assert shown(["--variants", "core", "sim", "--workdir", "/w"]) == f"{base} --variants core sim --workdir DIR"
