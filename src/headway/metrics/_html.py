"""A self-contained HTML report: inline CSS, PNGs as base64 data URIs, no links out."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from headway._files import write_atomic
from headway._optional import available
from headway.core import Request
from headway.metrics._plots import (
    TimelineLike,
    figure_png,
    plot_latency_cdfs,
    plot_percentile_bars,
    plot_timeline,
)
from headway.metrics._stats import LatencyStats
from headway.metrics._summary import GroupSummary, RunSummary
from headway.metrics._table import comparison_cells

__all__ = ["write_html_report"]

Runs = Mapping[str, tuple[RunSummary, Sequence[Request]]]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1500px; color: #222; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
.notes { background: #f7f7f0; border-left: 4px solid #cc9; padding: 0.5em 1em; }
.muted { color: #666; font-size: 0.9em; }
"""

_FIGURE_CAPTIONS: dict[str, str] = {
    "latency_cdf": "Latency CDFs of completed requests (TTFT, E2E, normalized latency).",
    "percentiles": "p50 / p90 / p99 per run and metric.",
    "timeline": "Waiting and running requests and KV-cache usage over time.",
}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(v: float | int | None, fmt: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return format(v, fmt)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>\n" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"


_STAT_ROWS: tuple[tuple[str, str, float], ...] = (
    ("ttft", "TTFT (s)", 1.0),
    ("tpot", "TPOT (s)", 1.0),
    ("e2e", "E2E latency (s)", 1.0),
    ("normalized_latency", "normalized latency (ms/token)", 1000.0),
    ("queueing_delay", "queueing delay (s)", 1.0),
)


def _stats_row(label: str, st: LatencyStats, scale: float) -> list[str]:
    vals = (st.mean, st.min, st.p50, st.p90, st.p95, st.p99, st.max)
    return [label, str(st.count), *(_num(v * scale) for v in vals)]


def _latency_table(s: RunSummary) -> str:
    headers = ["metric", "n", "mean", "min", "p50", "p90", "p95", "p99", "max"]
    rows = [_stats_row(label, getattr(s, key), scale) for key, label, scale in _STAT_ROWS]
    if s.itl.count:  # measured by bench serve on streams; the simulator has no chunks
        rows.insert(2, _stats_row("ITL, every gap between tokens (s)", s.itl, 1.0))
    return _table(headers, rows)


def _group_table(groups: Mapping[str, GroupSummary], kind: str, with_slo: bool) -> str:
    headers = [
        kind,
        "requests",
        "done",
        "aborted",
        "out tok/s",
        "TTFT mean (s)",
        "TTFT p99 (s)",
        "E2E mean (s)",
        "E2E p99 (s)",
        "norm mean (ms/tok)",
        "norm p99 (ms/tok)",
        "preempt",
    ]
    if with_slo:
        headers += ["SLO att.", "goodput (req/s)"]
    rows = []
    for name, g in groups.items():
        row = [
            name,
            str(g.num_requests),
            str(g.num_completed),
            str(g.num_aborted),
            _num(g.output_throughput),
            _num(g.ttft.mean),
            _num(g.ttft.p99),
            _num(g.e2e.mean),
            _num(g.e2e.p99),
            _num(g.normalized_latency.mean * 1000.0),
            _num(g.normalized_latency.p99 * 1000.0),
            str(g.num_preemptions),
        ]
        if with_slo:
            row.append("–" if g.slo_attainment is None else f"{g.slo_attainment * 100:.1f}%")
            row.append("–" if g.goodput is None else _num(g.goodput))
        rows.append(row)
    return _table(headers, rows)


def _facts(s: RunSummary) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in s.aborted_by_reason.items()) or "none"
    items = [
        (
            "requests",
            f"{s.num_requests} ({s.num_completed} completed, {s.num_aborted} aborted, {s.num_unfinished} unfinished)",
        ),
        ("abort reasons", reasons),
        ("makespan", f"{_num(s.makespan)} s (first arrival {_num(s.start_time)} s → last finish {_num(s.end_time)} s)"),
        (
            "throughput",
            f"{_num(s.request_throughput)} req/s, {_num(s.output_throughput)} output tok/s, "
            f"{_num(s.total_token_throughput)} total tok/s",
        ),
        ("preemptions", f"{s.num_preemptions} ({s.num_recomputed_tokens} tokens recomputed)"),
        ("Jain's fairness over tenants", _num(s.jain_fairness, ".3f")),
    ]
    if s.slo is not None:
        att = "–" if s.slo_attainment is None else f"{s.slo_attainment * 100:.1f}%"
        items.append(
            ("SLO", f"{s.slo.to_spec()} (ms): {s.num_slo_met} met, attainment {att}, goodput {_num(s.goodput)} req/s")
        )
    lis = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in items)
    return f"<ul>{lis}</ul>\n"


_DEFINITIONS = """
<h2>Definitions</h2>
<ul class="muted">
<li>Latency statistics cover completed (FINISHED) requests only; aborted requests are counted
separately and are SLO misses.</li>
<li>TTFT = first token − arrival; E2E (TTLT) = finish − arrival; queueing delay = first scheduled −
arrival; normalized latency = E2E / output tokens (per-token latency).</li>
<li>TPOT = (last token − first token) / (output tokens − 1), each request's mean inter-token time;
per-token gaps are not recorded, so there is no per-gap TBT distribution.</li>
<li>Percentiles interpolate linearly between order statistics (numpy's default method).</li>
<li>Throughputs and goodput divide by the makespan, first arrival to last finish. Goodput counts
requests meeting every SLO target (as <code>vllm bench serve --goodput</code>).</li>
<li>Jain's index = (Σx)² / (n·Σx²) over tenants, with x = 1 / mean normalized latency of the tenant
(0 for a tenant with no completed request); 1 means equal per-token latency for all tenants.</li>
</ul>
"""


def render_html(
    runs: Runs,
    *,
    title: str = "headway report",
    notes: str | Sequence[str] | None = None,
    baseline: str | None = None,
    images: Mapping[str, bytes] | None = None,
    replicas: Mapping[str, Mapping[str, RunSummary]] | None = None,
) -> str:
    """The report as one HTML string; ``images`` maps figure keys to PNG bytes, and
    ``replicas`` a fleet run's name to its per-replica summaries."""
    if not runs:
        raise ValueError("a report needs at least one run")
    summaries = {name: s for name, (s, _) in runs.items()}
    parts = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n",
        f"<h1>{_e(title)}</h1>\n",
    ]
    if notes:
        paras = [notes] if isinstance(notes, str) else list(notes)
        parts.append('<div class="notes">' + "".join(f"<p>{_e(p)}</p>" for p in paras) + "</div>\n")
    slos = sorted({s.slo.to_spec() for s in summaries.values() if s.slo is not None})
    if slos:
        parts.append(f"<p>SLO targets (ms, <code>--goodput</code> form): {_e('; '.join(slos))}</p>\n")
    headers, rows = comparison_cells(summaries, baseline)
    parts.append("<h2>Comparison</h2>\n")
    if baseline is not None:
        parts.append(f'<p class="muted">Ratios are relative to {_e(baseline)}.</p>\n')
    parts.append(_table(headers, rows))
    if images:
        parts.append("<h2>Figures</h2>\n")
        for key, png in images.items():
            data = base64.b64encode(png).decode("ascii")
            caption = _FIGURE_CAPTIONS.get(key, key)
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{_e(key)}">'
                f"<figcaption>{_e(caption)}</figcaption></figure>\n"
            )
    elif not available("matplotlib"):
        parts.append(
            '<h2>Figures</h2>\n<p class="muted">None: figures need matplotlib, which comes with the sim extra '
            "(<code>pip install -e '.[sim]'</code>).</p>\n"
        )
    parts.append("<h2>Runs</h2>\n")
    for name, s in summaries.items():
        with_slo = s.slo is not None
        parts.append(f"<h3>{_e(name)}</h3>\n")
        parts.append(_facts(s))
        parts.append(_latency_table(s))
        per_replica = (replicas or {}).get(name)
        if per_replica:
            parts.append("<h4>Per replica</h4>\n" + _table(*comparison_cells(dict(per_replica), None)))
        parts.append("<h4>Per tenant</h4>\n" + _group_table(s.tenants, "tenant", with_slo))
        parts.append("<h4>Per tier</h4>\n" + _group_table(s.tiers, "tier", with_slo))
    parts.append(_DEFINITIONS)
    parts.append("</body>\n</html>\n")
    return "".join(parts)


FIGURES = ("latency_cdf", "percentiles", "timeline")
"""Every key :func:`render_figures` may return (a report's ``<key>.png``)."""


def render_figures(runs: Runs, timeline: Mapping[str, Sequence[TimelineLike]] | None = None) -> dict[str, bytes]:
    """PNG bytes of the report's figures, keyed ``latency_cdf``, ``percentiles``
    and (when ``timeline`` is given) ``timeline`` (:data:`FIGURES`); none without matplotlib (the
    ``sim`` extra)."""
    if not available("matplotlib"):
        return {}
    images = {
        "latency_cdf": figure_png(plot_latency_cdfs({n: reqs for n, (_, reqs) in runs.items()})),
        "percentiles": figure_png(plot_percentile_bars({n: s for n, (s, _) in runs.items()})),
    }
    if timeline:
        images["timeline"] = figure_png(plot_timeline(timeline))
    return images


def write_html_report(
    out_dir: str | Path,
    runs: Runs,
    title: str = "headway report",
    notes: str | Sequence[str] | None = None,
    *,
    baseline: str | None = None,
    timeline: Mapping[str, Sequence[TimelineLike]] | None = None,
) -> Path:
    """Write ``out_dir/report.html``: comparison table, figures (inline base64 PNGs),
    per-run statistics and per-tenant/per-tier tables. The file loads nothing from
    elsewhere; run names, tenant ids, the title and notes are HTML-escaped."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    text = render_html(runs, title=title, notes=notes, baseline=baseline, images=render_figures(runs, timeline))
    write_atomic(path, text)
    return path
