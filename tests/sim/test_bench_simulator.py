"""The simulator-speed benchmark (``benchmarks/bench_simulator.py``): its comparison with Vidur, with
Vidur's runner replaced by a stand-in (Vidur itself is not installed here)."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from factories import load_script


@pytest.fixture
def bench(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_script("benchmarks/bench_simulator.py")
    monkeypatch.setattr(module, "DATA", data_dir)
    return module


def test_interleaved_rounds_alternate_with_vidur_and_another_python_is_flagged(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[int, tuple[str, ...]]] = []
    cpu = iter([4.0, 1.0, 30.0, 900.0])  # Vidur's CPU seconds: the side-by-side run, then each round

    def fake_vidur(n: int, *extra: str) -> dict[str, Any]:
        calls.append((n, extra))
        seconds = next(cpu)
        config = {"python": "3.0.0", "python_base_prefix": "/elsewhere"}
        return {"run_seconds": seconds, "run_cpu_seconds": seconds, "requests_per_second": n / seconds,
                "events_per_second": 1.0, "config": config}  # fmt: skip

    monkeypatch.setattr(bench, "run_vidur", fake_vidur)
    assert bench.main(["--num-requests", "40", "--repeat", "1", "--policies", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert calls == [(40, ()), (40, ("--repeat", "1")), (40, ("--repeat", "1")), (40, ("--repeat", "1"))]
    assert "Vidur's python 3.0.0 (/elsewhere)" in out
    assert "NOTE: the two ran on different Python installations" in out
    line = next(ln for ln in out.splitlines() if "interleaved rounds" in ln)
    ratios = [float(x.replace(",", "")) for x in re.findall(r"([\d,]+)x", line)]
    # three rounds and their median: each round's ratio follows Vidur's CPU time in it (1, 30, 900 s;
    # steps of 30x, far beyond how much headway's own time can move between rounds)
    assert len(ratios) == 4 and ratios[0] < ratios[1] < ratios[2] and ratios[3] == ratios[1]


def test_rounds_must_not_be_negative(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench.main(["--num-requests", "40", "--rounds", "-1"])
    assert info.value.code == 2
    assert "--rounds must be >= 0, got -1" in capsys.readouterr().err


def test_the_report_file_holds_the_run_its_command_and_vidur_s_setup(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def fake_vidur(n: int, *extra: str) -> dict[str, Any]:
        config = {"python": "3.0.0", "python_base_prefix": "/elsewhere", "attention_profile": "synthetic roofline",
                  "numpy": "9.9"}  # fmt: skip
        return {"run_seconds": 2.0, "run_cpu_seconds": 2.0, "requests_per_second": n / 2.0,
                "events_per_second": 1.0, "vidur_commit": "abc1234", "config": config}  # fmt: skip

    monkeypatch.setattr(bench, "run_vidur", fake_vidur)
    monkeypatch.setenv("VIDUR_PATH", "/some/vidur")
    monkeypatch.setenv("VIDUR_ARGS", "--quick-train --cache-dir /secret/cache")
    out = tmp_path / "simulator.md"
    (tmp_path / "simulator.md").write_text("an earlier run\n")
    args = ["--num-requests", "40", "--repeat", "1", "--policies", "--rounds", "1", "--out", str(out)]
    assert bench.main(args) == 0
    printed = capsys.readouterr().out
    report = out.read_text()
    assert "an earlier run" not in report  # overwritten
    assert report.startswith("# Simulator speed vs Vidur")
    assert f'VIDUR_ARGS="--quick-train --cache-dir ..." python benchmarks/bench_simulator.py {" ".join(args)}' in report
    assert "/secret" not in report and "/some/vidur" not in report
    assert "vidur_commit abc1234, attention_profile synthetic roofline, python 3.0.0, numpy 9.9" in report
    # every line it printed, in one block
    body = report.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert body.splitlines() == [ln for ln in printed.splitlines() if not ln.startswith("wrote ")]
    assert "interleaved rounds, headway fcfs / Vidur per CPU second" in body
