"""The run comparison table, as a ``rich`` table or as plain strings for HTML."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from headway.metrics._summary import RunSummary

__all__ = ["comparison_table", "replica_overview"]


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    get: Callable[[RunSummary], float | None]
    fmt: Callable[[float], str]
    ratio: bool = True
    """Whether a ratio to the baseline makes sense for this column."""


def _g(v: float) -> str:
    """4 significant digits below 1,000 (``0.01234``, ``123.5``); from 1,000 on whole numbers with
    thousands separators (``12,346``), never an exponent."""
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if abs(v) >= 999.95:  # .4g would round these to 1000 or write 1.235e+04
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _ms(v: float) -> str:
    return _g(v * 1000.0)


def _int(v: float) -> str:
    return f"{int(v):,}"


def _ratio(r: float) -> str:
    """A ratio to the baseline: two decimals from 0.1 to 100 (``0.60``, ``12.35``), whole numbers
    from 100 on (``1,234``), and two significant digits below 0.1 (``0.050``, ``0.0012``)."""
    a = abs(r)
    if a == 0.0 or math.isinf(a):
        return _g(r)
    if a >= 99.995:
        return f"{r:,.0f}"
    if a >= 0.0995:
        return f"{r:.2f}"
    decimals = 1 - math.floor(math.log10(a))  # 0.05 -> 3 (0.050), 0.0012 -> 4 (0.0012)
    return f"{r:.{decimals}f}"


def _pct(v: float) -> str:
    return f"{v * 100.0:.1f}%"


def _f3(v: float) -> str:
    return f"{v:.3f}"


_BASE_COLUMNS: tuple[_Column, ...] = (
    _Column("done", lambda s: s.num_completed, _int, ratio=False),
    _Column("aborted", lambda s: s.num_aborted, _int, ratio=False),
    _Column("E2E mean (s)", lambda s: s.e2e.mean, _g),
    _Column("E2E p99 (s)", lambda s: s.e2e.p99, _g),
    _Column("TTFT mean (s)", lambda s: s.ttft.mean, _g),
    _Column("TTFT p99 (s)", lambda s: s.ttft.p99, _g),
    _Column("TPOT mean (ms)", lambda s: s.tpot.mean, _ms),
    _Column("TPOT p99 (ms)", lambda s: s.tpot.p99, _ms),
    _Column("norm mean (ms/tok)", lambda s: s.normalized_latency.mean, _ms),
    _Column("norm p99 (ms/tok)", lambda s: s.normalized_latency.p99, _ms),
    _Column("req/s", lambda s: s.request_throughput, _g),
    _Column("out tok/s", lambda s: s.output_throughput, _g),
    _Column("preempt", lambda s: s.num_preemptions, _int),
)
_ITL_COLUMNS: tuple[_Column, ...] = (
    _Column("ITL mean (ms)", lambda s: s.itl.mean, _ms),
    _Column("ITL p99 (ms)", lambda s: s.itl.p99, _ms),
)
"""After TPOT when any run measured inter-token gaps (``headway bench serve``; not the simulator)."""
_SLO_COLUMNS: tuple[_Column, ...] = (
    _Column("SLO att.", lambda s: s.slo_attainment, _pct),
    _Column("goodput (req/s)", lambda s: s.goodput, _g),
)
_PREFIX = _Column("prefix hit", lambda s: s.prefix_cache_hit_rate, _pct, ratio=False)
"""Prompt tokens found in the prefix cache, when any run found some (fleets: per replica)."""
_JAIN = _Column("Jain", lambda s: s.jain_fairness, _f3, ratio=False)
# the terminal view: what fits 120 columns with ratios
_COMPACT_HEADERS = frozenset(
    {
        "done",
        "E2E mean (s)",
        "E2E p99 (s)",
        "TTFT p99 (s)",
        "norm mean (ms/tok)",
        "norm p99 (ms/tok)",
        "preempt",
        "goodput (req/s)",
        "prefix hit",
    }
)


def _is_num(v: float | None) -> bool:
    return v is not None and not math.isnan(v)


def comparison_cells(
    summaries: Mapping[str, RunSummary], baseline: str | None = None, *, compact: bool = False
) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows (one per run, in mapping order) of the comparison.

    With ``baseline``, each ratio-able cell of the other runs reads ``value (r×)``
    where ``r = value / baseline value``; the baseline's name gets ``(baseline)``.
    ``compact`` keeps the columns of a terminal view (counts, E2E, TTFT p99,
    normalized latency, preemptions, goodput, the prefix-cache hit rate), and the aborted count
    when any run aborted requests. The hit rate shows when any run found a prompt token cached.
    """
    if baseline is not None and baseline not in summaries:
        raise KeyError(f"baseline {baseline!r} is not one of the runs: {sorted(summaries)}")
    columns = list(_BASE_COLUMNS)
    if any(s.itl.count for s in summaries.values()):
        at = next(i for i, c in enumerate(columns) if c.header == "TPOT p99 (ms)") + 1
        columns[at:at] = _ITL_COLUMNS
    if any(s.slo is not None for s in summaries.values()):
        columns.extend(_SLO_COLUMNS)
    if any(s.prefix_cache_hit_rate for s in summaries.values()):
        columns.append(_PREFIX)
    columns.append(_JAIN)
    if compact:
        aborted = any(s.num_aborted for s in summaries.values())
        columns = [c for c in columns if c.header in _COMPACT_HEADERS or (aborted and c.header == "aborted")]
    headers = ["run", *(c.header for c in columns)]
    base = summaries[baseline] if baseline is not None else None
    rows: list[list[str]] = []
    for name, s in summaries.items():
        row = [f"{name} (baseline)" if name == baseline else name]
        for col in columns:
            v = col.get(s)
            if v is None or math.isnan(v):
                row.append("–")
                continue
            text = col.fmt(v)
            if base is not None and col.ratio and name != baseline:
                b = col.get(base)
                if b is not None and _is_num(b) and b != 0.0:
                    text += f" ({_ratio(v / b)}×)"
            row.append(text)
        rows.append(row)
    return headers, rows


def comparison_table(
    summaries: Mapping[str, RunSummary],
    baseline: str | None = None,
    *,
    title: str | None = None,
    compact: bool = False,
) -> Table:
    """A ``rich`` table with one row per run: completed/aborted counts, mean and p99
    of E2E latency, TTFT, TPOT, ITL (when any run measured it) and normalized latency,
    request and output-token throughput, preemptions, SLO attainment and goodput (when
    any run has an SLO) and Jain's index. Numbers from 1,000 on have thousands separators.

    With ``baseline`` (a key of ``summaries``), the other runs' cells also show the
    ratio to the baseline (``0.50×`` = half the baseline's value). ``compact``: the
    terminal subset of columns (see :func:`comparison_cells`).
    """
    headers, rows = comparison_cells(summaries, baseline, compact=compact)
    table = Table(title=title)
    # Text(...) so that run names such as "fcfs[v2]" are not read as rich markup.
    table.add_column(Text(headers[0]), style="bold", no_wrap=True)
    for h in headers[1:]:
        table.add_column(Text(h), justify="right")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def replica_overview(replicas: Mapping[str, Mapping[str, RunSummary]], names: Sequence[str], title: str) -> Table:
    """One table for a fleet's several runs: a row per run, a column per replica (``names``), each
    cell the requests that replica completed and their mean E2E latency (how the router spread the
    load); "–" where a run has no such replica or it completed none."""
    table = Table(title=title)
    table.add_column("run", style="bold", no_wrap=True)
    for name in names:
        table.add_column(Text(name), justify="right")
    for run, per in replicas.items():
        cells = []
        for name in names:
            s = per.get(name)
            mean = s.e2e.mean if s is not None else math.nan
            cells.append("–" if s is None or math.isnan(mean) else f"{s.num_completed:,} / {_g(mean)}")
        table.add_row(Text(run), *(Text(c) for c in cells))
    return table
