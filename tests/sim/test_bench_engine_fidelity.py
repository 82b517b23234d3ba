"""The engine-fidelity benchmark's figure and its rewrite of the result file
(``benchmarks/bench_engine_fidelity.py``; the simulations themselves are the simulator's tests')."""

from __future__ import annotations

from pathlib import Path

from factories import load_script
from headway.workload import RequestSpec, Workload


def test_a_rerun_keeps_the_section_written_by_hand_and_nothing_else(tmp_path: Path) -> None:
    bench = load_script("benchmarks/bench_engine_fidelity.py")
    out = tmp_path / "engine_fidelity.md"
    assert bench.with_hand_written("# new\n\n| a |\n\n", out) == ("# new\n\n| a |\n\n", False)  # no file yet
    out.write_text("# old\n\n| stale |\n\n## Reading the tables (by hand)\n\nsrpt-oracle 1.83x\n")
    text, kept = bench.with_hand_written("# new\n\n| a |\n\n", out)
    assert kept and text == "# new\n\n| a |\n\n## Reading the tables (by hand)\n\nsrpt-oracle 1.83x\n"
    out.write_text("# old\n\n| stale |\n")  # nothing written by hand: the tables alone
    assert bench.with_hand_written("# new\n", out) == ("# new\n", False)


def test_the_figure_draws_each_mode_of_each_workload(tmp_path: Path) -> None:
    bench = load_script("benchmarks/bench_engine_fidelity.py")
    wl = Workload.from_specs("w", [RequestSpec("r0", 0.0, 10, 5)], {})
    narrow = [("ltr", "pause", True, 1.43, 1017), ("ltr", "none", False, 0.97, 0), ("ltr", "evict", False, 0.97, 0)]
    wide = [("ltr", "pause", True, 8.93, 52054), ("ltr", "none", False, 0.88, 1), ("ltr", "evict", False, 0.96, 182)]
    png = tmp_path / "engine_fidelity.png"
    bench.plot([(wl, 0.97, narrow), (wl, 0.80, wide)], png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
