"""PNG figures: latency CDFs, percentile bars and an engine timeline.

Figures are built with :class:`matplotlib.figure.Figure` directly (never
``pyplot``), so they use the Agg renderer, touch no global state and need no
display. matplotlib comes with the ``sim`` extra and is imported only when a figure is made.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from headway._optional import require
from headway.core import Request, RequestState
from headway.metrics._summary import RunSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "TimelineSample",
    "figure_png",
    "plot_latency_cdfs",
    "plot_percentile_bars",
    "plot_timeline",
    "save_figure",
]

_LOG_SPAN = 50.0
"""Use a log x axis when the positive values span at least this factor."""


@runtime_checkable
class TimelineSample(Protocol):
    """One engine sample: a time, queue lengths and KV-cache usage (0..1)."""

    @property
    def time(self) -> float: ...
    @property
    def num_waiting(self) -> float: ...
    @property
    def num_running(self) -> float: ...
    @property
    def kv_usage(self) -> float: ...


TimelineLike = TimelineSample | Sequence[float]
"""A :class:`TimelineSample` or a ``(time, num_waiting, num_running, kv_usage)`` tuple."""


def _figure_class() -> type[Figure]:
    cls: type[Figure] = require("matplotlib.figure", "sim", "figures").Figure
    return cls


def _color(i: int) -> str:
    return f"C{i % 10}"


_LINESTYLES = ("-", "--", ":", "-.")


def _linestyle(i: int) -> str:
    """Solid for the first ten series, then dashed, dotted...: colors repeat every ten."""
    return _LINESTYLES[(i // 10) % len(_LINESTYLES)]


def _completed_values(requests: Sequence[Request], metric: str) -> np.ndarray:
    vals: list[float] = []
    for r in requests:
        if r.state is not RequestState.FINISHED:
            continue
        if metric == "ttft":
            v = r.ttft
        elif metric == "e2e":
            v = r.e2e_latency
        else:  # normalized
            e2e = r.e2e_latency
            v = e2e / r.num_output_tokens if e2e is not None and r.num_output_tokens > 0 else None
        if v is not None and math.isfinite(v):
            vals.append(v)
    return np.sort(np.asarray(vals, dtype=np.float64))


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def plot_latency_cdfs(runs: Mapping[str, Sequence[Request]]) -> Figure:
    """Empirical CDFs of TTFT, E2E latency and normalized latency, one panel each and
    one line per run (completed requests only). A panel's x axis is logarithmic when
    its values are all positive and span a factor of 50 or more."""
    panels = (
        ("ttft", "TTFT (s)"),
        ("e2e", "E2E latency (s)"),
        ("normalized", "normalized latency (s/token)"),
    )
    fig = _figure_class()(figsize=(17, 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (metric, label) in zip(axes, panels, strict=True):
        all_vals: list[np.ndarray] = []
        for i, (name, reqs) in enumerate(runs.items()):
            x = _completed_values(reqs, metric)
            if x.size == 0:
                continue
            all_vals.append(x)
            y = np.arange(1, x.size + 1) / x.size
            ax.step(
                np.concatenate(([x[0]], x)),
                np.concatenate(([0.0], y)),
                where="post",
                color=_color(i),
                linestyle=_linestyle(i),
                label=name,
            )
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.3)
        if not all_vals:
            _no_data(ax)
            continue
        joined = np.concatenate(all_vals)
        lo, hi = float(joined.min()), float(joined.max())
        if lo > 0.0 and hi / lo >= _LOG_SPAN:
            ax.set_xscale("log")
    _shared_legend(fig, axes)
    fig.suptitle("Latency CDFs (completed requests)")
    return fig


def _shared_legend(fig: Figure, axes: Iterable[Any]) -> None:
    """One legend for every panel, outside the plotting area (runs share colors across panels)."""
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            fig.legend(
                handles, labels, loc="outside right upper", fontsize="small", ncols=1 if len(labels) <= 24 else 2
            )
            return


def plot_percentile_bars(summaries: Mapping[str, RunSummary]) -> Figure:
    """Grouped bars of p50/p90/p99 per run for TTFT, TPOT, E2E and normalized latency."""
    panels = (
        ("ttft", "TTFT (s)"),
        ("tpot", "TPOT (s)"),
        ("e2e", "E2E latency (s)"),
        ("normalized_latency", "normalized latency (s/token)"),
    )
    pcts = ("p50", "p90", "p99")
    names = list(summaries)
    if len(names) <= 4:
        fig = _figure_class()(figsize=(10.0, 7.5), layout="constrained")
        axes = fig.subplots(2, 2, squeeze=False).ravel()
    else:  # many runs: one full-width panel per metric, stacked, width capped
        fig = _figure_class()(figsize=(min(18.0, 4.0 + 0.7 * len(names)), 12.0), layout="constrained")
        axes = fig.subplots(4, 1, squeeze=False).ravel()
    x = np.arange(len(names), dtype=np.float64)
    width = 0.8 / len(pcts)
    for ax, (metric, label) in zip(axes, panels, strict=True):
        any_data = False
        for j, p in enumerate(pcts):
            heights = [getattr(getattr(summaries[n], metric), p) for n in names]
            heights = [0.0 if math.isnan(h) else h for h in heights]
            any_data = any_data or any(h > 0.0 for h in heights)
            ax.bar(x + (j - 1) * width, heights, width, label=p, color=_color(j))
        crowded = len(names) > 3
        ax.set_xticks(
            x,
            names,
            rotation=30 if crowded else 0,
            ha="right" if crowded else "center",
            fontsize="small" if crowded else None,
        )
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        if not any_data:
            _no_data(ax)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", ncols=len(pcts), fontsize="small")
    fig.suptitle("Latency percentiles per run")
    return fig


def _sample_tuple(s: TimelineLike) -> tuple[float, float, float, float]:
    if isinstance(s, TimelineSample):
        return (float(s.time), float(s.num_waiting), float(s.num_running), float(s.kv_usage))
    if len(s) != 4:
        raise ValueError(f"timeline samples are (time, num_waiting, num_running, kv_usage); got {s!r}")
    return (float(s[0]), float(s[1]), float(s[2]), float(s[3]))


def plot_timeline(timelines: Mapping[str, Sequence[TimelineLike]]) -> Figure:
    """Waiting queue length, running batch size and KV-cache usage over time, one
    line per run. Samples are :class:`TimelineSample` objects or
    ``(time, num_waiting, num_running, kv_usage)`` tuples."""
    fig = _figure_class()(figsize=(14, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True, squeeze=False)[:, 0]
    labels = ("waiting requests", "running requests", "KV cache usage")
    for i, (name, samples) in enumerate(timelines.items()):
        rows = sorted(_sample_tuple(s) for s in samples)
        if not rows:
            continue
        arr = np.asarray(rows, dtype=np.float64)
        for k, ax in enumerate(axes):
            ax.step(arr[:, 0], arr[:, k + 1], where="post", color=_color(i), linestyle=_linestyle(i), label=name)
    for ax, label in zip(axes, labels, strict=True):
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not ax.has_data():
            _no_data(ax)
    _shared_legend(fig, axes)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle("Engine timeline")
    return fig


def figure_png(fig: Figure, *, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG bytes (Agg)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG file and return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(figure_png(fig, dpi=dpi))
    return out
