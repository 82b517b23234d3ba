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

from headway import _files
from headway._optional import require
from headway.core import PAPER_POLICIES, Request, RequestState
from headway.metrics._summary import RunSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "POLICY_FAMILIES",
    "TimelineSample",
    "figure_png",
    "plot_latency_cdfs",
    "plot_percentile_bars",
    "plot_timeline",
    "run_styles",
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


POLICY_FAMILIES: dict[str, str] = {
    "fcfs": "baseline",
    "priority": "baseline",
    "sarathi": "baseline",
    **{name: paper for paper, names in PAPER_POLICIES.items() for name in names},
    "bands": "DriftSched",  # priority bands with fair tenant flows: multi-tenant QoS, as DriftSched
    "sjf-oracle": "oracle",
    "srpt-oracle": "oracle",
    "trail-oracle": "oracle",
}
"""The family a built-in policy's line is drawn in: its paper (PARS with the learned-length baselines it
is compared with, UniBoost with the Boost variants, DriftSched), the baselines, or the oracle bounds.
A run named ``policy (...)`` or ``policy@...`` takes its policy's family; other runs are ``other``."""

_FAMILY_ORDER = ("baseline", "PARS", "UniBoost", "DriftSched", "oracle", "other")
_FAMILY_COLORS = {
    "baseline": "#444444",
    "PARS": "#1f77b4",
    "UniBoost": "#d62728",
    "DriftSched": "#2ca02c",
    "oracle": "#9467bd",
    "other": "#ff7f0e",
}
_LINESTYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))


def _family(name: str) -> str:
    policy = name.split("(", 1)[0].split("@", 1)[0].strip()
    return POLICY_FAMILIES.get(policy, "other")


def run_styles(names: Iterable[str]) -> dict[str, tuple[str, Any, str]]:
    """Each run's ``(color, linestyle, family)``, in drawing order: grouped by family (baselines,
    PARS, UniBoost, DriftSched, oracles, others), one colour per family and one line style per run
    within it. Styles repeat only past seven runs of one family."""
    by_family: dict[str, list[str]] = {}
    for name in names:
        by_family.setdefault(_family(name), []).append(name)
    styles: dict[str, tuple[str, Any, str]] = {}
    for family in _FAMILY_ORDER:
        for j, name in enumerate(by_family.get(family, [])):
            styles[name] = (_FAMILY_COLORS[family], _LINESTYLES[j % len(_LINESTYLES)], family)
    return styles


def _label(name: str, family: str) -> str:
    return f"{family}: {name}" if family != "other" else name


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
    one line per run (completed requests only), styled by :func:`run_styles`. A panel's x axis is
    logarithmic when
    its values are all positive and span a factor of 50 or more."""
    panels = (
        ("ttft", "TTFT (s)"),
        ("e2e", "E2E latency (s)"),
        ("normalized", "normalized latency (s/token)"),
    )
    fig = _figure_class()(figsize=(17, 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    styles = run_styles(runs)
    for ax, (metric, label) in zip(axes, panels, strict=True):
        all_vals: list[np.ndarray] = []
        for name, (color, linestyle, family) in styles.items():
            x = _completed_values(runs[name], metric)
            if x.size == 0:
                continue
            all_vals.append(x)
            y = np.arange(1, x.size + 1) / x.size
            ax.step(
                np.concatenate(([x[0]], x)),
                np.concatenate(([0.0], y)),
                where="post",
                color=color,
                linestyle=linestyle,
                linewidth=1.6,
                label=_label(name, family),
            )
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of completed requests")
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


def _timeline_rows(samples: Sequence[TimelineLike]) -> np.ndarray:
    """The samples as an ``(n, 4)`` array in time order (ties by the other columns, as tuples sort).
    Plain tuples, what the simulator records, are converted at once; anything else one by one."""
    if samples and all(type(s) is tuple and len(s) == 4 for s in samples):
        arr = np.array(samples, dtype=np.float64)
    else:
        arr = np.array([_sample_tuple(s) for s in samples], dtype=np.float64).reshape(-1, 4)
    return arr[np.lexsort(arr.T[::-1])]


def plot_timeline(timelines: Mapping[str, Sequence[TimelineLike]]) -> Figure:
    """Waiting queue length, running batch size and KV-cache usage over time, one
    line per run (styled by :func:`run_styles`). Samples are :class:`TimelineSample` objects or
    ``(time, num_waiting, num_running, kv_usage)`` tuples."""
    fig = _figure_class()(figsize=(14, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True, squeeze=False)[:, 0]
    labels = ("waiting requests", "running requests", "KV cache usage")
    for name, (color, linestyle, family) in run_styles(timelines).items():
        arr = _timeline_rows(timelines[name])
        if not len(arr):
            continue
        for k, ax in enumerate(axes):
            ax.step(
                arr[:, 0], arr[:, k + 1], where="post", color=color, linestyle=linestyle, label=_label(name, family)
            )
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
    """Write ``fig`` as a PNG file, whole or not at all (:func:`headway._files.save_figure`), its folder
    made if needed, and return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return _files.save_figure(fig, out, format="png", dpi=dpi, metadata={"Software": None})
