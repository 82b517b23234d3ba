"""Plots, the comparison table, the HTML report and write_report()."""

from __future__ import annotations

import base64
import csv
import io
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import headway.metrics._export
from headway.core import Request, Tier
from headway.metrics import (
    ReportPaths,
    RunSummary,
    comparison_table,
    figure_png,
    plot_latency_cdfs,
    plot_timeline,
    read_json,
    summarize,
    write_html_report,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Runs = dict[str, tuple[RunSummary, Sequence[Request]]]


@pytest.fixture(scope="module")
def runs(mk_finished: Callable[..., Request], mk_aborted: Callable[..., Request]) -> Runs:
    def run(scale: float, name: str) -> tuple[RunSummary, list[Request]]:
        reqs = [
            mk_finished(f"r{i}", i * 0.5, ttft=0.05 * scale * (i + 1), e2e=0.5 * scale * (i + 1) ** 1.5,
                        n_out=5 + 7 * i, tenant="<b>tenant&co</b>" if i % 2 else "t1",
                        tier=Tier.PREMIUM if i % 3 == 0 else Tier.STANDARD, preemptions=i % 2)
            for i in range(12)
        ]
        reqs.append(mk_aborted("gone", 1.0, reason="queue_full", finish=1.0))
        return summarize(reqs, slo="ttft:300 e2el:8000", name=name), reqs

    return {"fcfs": run(1.0, "fcfs"), "sjf:oracle-v2": run(0.6, "sjf:oracle-v2"),
            "<script>alert(1)</script>": run(0.8, "x")}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, runs: Runs) -> ReportPaths:
    timeline = {"fcfs": [(0.0, 3, 1, 0.1), (1.0, 1, 4, 0.5), (2.0, 0, 2, 0.3)],
                "sjf:oracle-v2": [(0.0, 2, 2, 0.2), (1.5, 0, 3, 0.6)]}
    return write_report(tmp_path_factory.mktemp("report"), runs, title="Policies <& friends>",
                        notes=["seed 0; workload 'chat'", "<i>not markup</i>"], baseline="fcfs",
                        timeline=timeline)


def test_a_report_written_over_another_leaves_one_report(tmp_path: Path, runs: Runs) -> None:
    # a run dropped since (its CSV) and a figure no longer drawn (the timeline) read as this run's
    out = tmp_path / "rep"
    write_report(out, runs, timeline={"fcfs": [(0.0, 3, 1, 0.1), (1.0, 1, 4, 0.5)]})
    (out / "mine.csv").write_text("a user's file\n")
    again = write_report(out, {"fcfs": runs["fcfs"]})
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(p.name for p in again.all()), "mine.csv"]  # the user's own file stays
    )
    assert not (out / "timeline.png").exists() and not (out / "requests_sjf_oracle-v2.csv").exists()


def test_a_report_interrupted_while_written_leaves_the_earlier_one_whole(
    tmp_path: Path, runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C mid-row in a per-request CSV: no file of the earlier report is replaced or cut off, and
    # nothing of the interrupted one is left beside it
    out = tmp_path / "rep"
    write_report(out, runs)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_rows = headway.metrics._export.request_rows

    def rows_then_ctrl_c(*args: object, **kwargs: object) -> Iterator[dict[str, object]]:
        yield from list(real_rows(*args, **kwargs))[:3]  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr(headway.metrics._export, "request_rows", rows_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_report(out, {"fcfs": runs["fcfs"]})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_report_files_exist(report: ReportPaths, runs: Runs) -> None:
    names = sorted(p.name for p in report.out_dir.iterdir())
    assert names == sorted([
        "summary.json", "summary.csv", "groups.csv", "requests_fcfs.csv", "requests_sjf_oracle-v2.csv",
        "requests__script_alert_1_script_.csv", "latency_cdf.png", "percentiles.png",
        "timeline.png", "report.html",
    ])
    assert sorted(p.name for p in report.all()) == names
    assert set(report.requests_csv) == set(runs)
    for png in report.figures.values():
        assert png.read_bytes().startswith(PNG_MAGIC)
    assert list(read_json(report.summary_json)) == list(runs)
    with report.summary_csv.open(newline="") as fh:
        assert [r["name"] for r in csv.DictReader(fh)] == list(runs)
    with report.requests_csv["sjf:oracle-v2"].open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 13 and rows[-1]["slo_met"] == "false"
    with report.groups_csv.open(newline="") as fh:
        groups = [(r["run"], r["group_kind"], r["group"]) for r in csv.DictReader(fh)]
    assert groups[:5] == [("fcfs", "tenant", "<b>tenant&co</b>"), ("fcfs", "tenant", "default"),
                          ("fcfs", "tenant", "t1"), ("fcfs", "tier", "premium"),
                          ("fcfs", "tier", "standard")]  # fmt: skip
    assert len(groups) == 15  # the aborted request is tenant "default"


def test_html_is_self_contained_and_escaped(report: ReportPaths) -> None:
    html = report.html.read_text(encoding="utf-8")
    # the embedded figures' base64 left out: by chance it can hold any short string ("ITL")
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,", html)
    assert "http" not in text  # no external scripts, styles, images or links
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", text)
    assert "<script" not in text and "<b>tenant" not in text and "<i>not markup" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;b&gt;tenant&amp;co&lt;/b&gt;" in text
    assert "ITL" not in text  # no streamed chunks measured here (bench serve's reports have the row)
    assert "Policies &lt;&amp; friends&gt;" in text
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 3
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert "ttft:300 e2el:8000" in text and "queue_full" in text
    heads = re.findall(r"<thead><tr>(.*?)</tr></thead>", text)
    groups = [h for h in heads if h.startswith(("<th>tenant</th>", "<th>tier</th>"))]
    assert len(groups) == 6 and all("<th>goodput (req/s)</th>" in h for h in groups)  # 2 per run


def test_write_html_report_alone(tmp_path: Path, runs: Runs) -> None:
    one = {"fcfs": runs["fcfs"]}
    path = write_html_report(tmp_path / "html", one, "only fcfs", "a note")
    text = path.read_text(encoding="utf-8")
    assert path.name == "report.html" and "a note" in text and "http" not in text
    assert text.count("data:image/png;base64,") == 2  # no timeline given


def _render(table: object) -> str:
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_comparison_table_with_baseline(runs: Runs) -> None:
    summaries = {k: s for k, (s, _) in runs.items()}
    table = comparison_table(summaries, baseline="fcfs")
    headers = [str(c.header) for c in table.columns]
    assert headers[:3] == ["run", "done", "aborted"]
    assert {"E2E mean (s)", "E2E p99 (s)", "TTFT mean (s)", "TTFT p99 (s)", "TPOT mean (ms)", "TPOT p99 (ms)",
            "norm mean (ms/tok)", "norm p99 (ms/tok)", "req/s", "out tok/s", "preempt", "SLO att.",
            "goodput (req/s)", "Jain"} <= set(headers)
    assert "ITL mean (ms)" not in headers  # simulated runs have no chunks, so no ITL column
    assert table.row_count == 3
    text = _render(table)
    assert "fcfs (baseline)" in text
    assert "<script>alert(1)</script>" in text  # shown literally, not parsed as markup
    # sjf's E2E mean is 0.6 x fcfs's (every latency scaled by 0.6)
    sjf_line = next(line for line in text.splitlines() if "sjf:oracle-v2" in line)
    assert "(0.60×)" in sjf_line and "(1.00×)" in sjf_line  # latency ratio; equal req count
    # TPOT scales by 0.6 too: its mean is shown in ms with its ratio
    tpot = summaries["sjf:oracle-v2"].tpot.mean * 1000.0
    assert f"{tpot:.4g} (0.60×)" in sjf_line


def test_comparison_cells_format_large_numbers_and_small_ratios(mk_finished: Callable[..., Request]) -> None:
    from headway.metrics._summary import ITL_KEY
    from headway.metrics._table import comparison_cells

    # a fast run (~3.9 million output tokens/s, 1,969 req/s) against one 600,000 times slower
    fast = summarize([mk_finished(f"r{i}", i * 0.0001, ttft=0.01, e2e=0.02 + i * 1e-5, n_out=2000) for i in range(50)])
    slow = summarize([mk_finished(f"r{i}", i * 0.0001, ttft=0.01, e2e=12345.678, n_out=2000, preemptions=12345)
                      for i in range(3)])  # fmt: skip
    headers, rows = comparison_cells({"fast": fast, "slow": slow}, baseline="fast")
    cell = dict(zip(headers, rows[0], strict=True))
    assert cell["out tok/s"] == "3,938,558" and cell["req/s"] == "1,969"  # not 3.939e+06, 1969
    assert cell["E2E mean (s)"] == "0.02025" and cell["TPOT mean (ms)"] == "0.005125"
    cell = dict(zip(headers, rows[1], strict=True))
    assert cell["E2E mean (s)"] == "12,346 (609,814×)"  # not 1.235e+04 (6.098e+05×)
    assert cell["out tok/s"] == "0.486 (0.00000012×)"  # not (0.00×)
    assert cell["TPOT p99 (ms)"] == "6,176 (1,177,449×)"
    assert cell["preempt"] == "37,035"
    assert all("e+" not in c and "e-" not in c for c in rows[0] + rows[1])
    # ITL columns follow TPOT once a run measured inter-token gaps (bench serve)
    reqs = [mk_finished("a", 0.0, ttft=0.1, e2e=0.4, n_out=4), mk_finished("b", 0.0, ttft=0.1, e2e=0.3, n_out=3)]
    reqs[0].extra[ITL_KEY] = [0.1, 0.1, 0.1]
    reqs[1].extra[ITL_KEY] = [0.05, 0.15]
    headers, rows = comparison_cells({"bench": summarize(reqs), "sim": fast})
    at = headers.index("TPOT p99 (ms)")
    assert headers[at + 1 : at + 3] == ["ITL mean (ms)", "ITL p99 (ms)"]
    assert rows[0][at + 1] == "100" and rows[1][at + 1] == "–"


def test_the_prefix_cache_hit_rate_is_a_column_once_a_run_found_a_token_cached(
    mk_finished: Callable[..., Request],
) -> None:
    import dataclasses

    from headway.metrics._table import comparison_cells

    s = summarize([mk_finished("a", 0.0, ttft=0.1, e2e=1.0, n_out=3)])
    off, none, some = (dataclasses.replace(s, prefix_cache_hit_rate=v) for v in (None, 0.0, 0.8412))
    for compact in (False, True):
        assert "prefix hit" not in comparison_cells({"a": off, "b": none}, compact=compact)[0]
        headers, rows = comparison_cells({"a": off, "b": none, "c": some}, baseline="b", compact=compact)
        at = headers.index("prefix hit")
        assert [r[at] for r in rows] == ["–", "0.0%", "84.1%"]  # a rate, never a ratio to the baseline


def test_comparison_table_without_baseline_or_slo(runs: Runs, mk_finished: Callable[..., Request]) -> None:
    s = summarize([mk_finished("a", 0.0, ttft=0.1, e2e=1.0, n_out=3)])
    table = comparison_table({"only": s})
    headers = [str(c.header) for c in table.columns]
    assert "SLO att." not in headers
    assert "×" not in _render(table)
    with pytest.raises(KeyError, match="baseline"):
        comparison_table({"only": s}, baseline="missing")


@dataclass
class _Sample:
    time: float
    num_waiting: int
    num_running: int
    kv_usage: float


def test_timeline_accepts_objects_and_tuples_and_checks_arity() -> None:
    fig = plot_timeline({"a": [_Sample(0.0, 1, 2, 0.5), _Sample(1.0, 0, 1, 0.2)], "b": [(0.0, 1, 1, 0.1)]})
    assert figure_png(fig).startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="time, num_waiting"):
        plot_timeline({"bad": [(0.0, 1.0)]})


def test_timeline_rows_are_the_samples_sorted_as_tuples_either_way() -> None:
    """Plain tuples (converted at once) and sample objects (one by one) come out as
    ``sorted(tuples)``, ties broken by the later columns."""
    from headway.metrics._plots import _timeline_rows

    rng = np.random.default_rng(0)
    rows = [(float(t), int(w), int(r), float(k)) for t, w, r, k in rng.integers(0, 4, size=(200, 4))]
    want = np.asarray(sorted(rows), dtype=np.float64)
    assert np.array_equal(_timeline_rows(rows), want)
    assert np.array_equal(_timeline_rows([_Sample(*row) for row in rows]), want)
    assert _timeline_rows([]).shape == (0, 4)


def test_cdf_log_axis_when_values_span_decades(mk_finished: Callable[..., Request]) -> None:
    wide = [mk_finished(f"w{i}", 0.0, ttft=10.0 ** (i - 3), e2e=10.0 ** (i - 2), n_out=2) for i in range(5)]
    narrow = [mk_finished(f"n{i}", 0.0, ttft=1.0 + i, e2e=2.0 + i, n_out=2) for i in range(5)]
    ax_ttft = plot_latency_cdfs({"w": wide}).axes[0]
    assert ax_ttft.get_xscale() == "log"
    assert plot_latency_cdfs({"n": narrow}).axes[0].get_xscale() == "linear"


def test_write_report_validation(tmp_path: Path, runs: Runs) -> None:
    with pytest.raises(ValueError, match="at least one run"):
        write_report(tmp_path, {})
    with pytest.raises(KeyError, match="baseline"):
        write_report(tmp_path, {"fcfs": runs["fcfs"]}, baseline="nope")
    with pytest.raises(KeyError, match="per-replica"):
        write_report(tmp_path / "never", {"fcfs": runs["fcfs"]}, replicas={"sjf": {"r0": runs["fcfs"][0]}})
    assert not (tmp_path / "never").exists()  # refused before anything is written
