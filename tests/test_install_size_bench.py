"""``benchmarks/bench_install_size.py``: the command its result file shows (the run itself installs from
the package index, a benchmark, not a test)."""

from __future__ import annotations

from factories import load_script


def test_the_shown_command_hides_the_workdir_path_only() -> None:
    module = load_script("benchmarks/bench_install_size.py")
    shown = module.shown_command
    base = "python benchmarks/bench_install_size.py"
    assert shown([]) == base
    assert shown(["--workdir", "/tmp/x"]) == f"{base} --workdir DIR"
    assert shown(["--workdir=/tmp/x"]) == f"{base} --workdir=DIR"
    assert shown(["--variants", "core", "sim", "--workdir", "/w"]) == f"{base} --variants core sim --workdir DIR"
