"""Claim rows, statistics, simulation helpers and the report writer shared by the reproductions."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from headway.core import Request, RequestState
from headway.sim import CacheConfig, SchedulerConfig, SimResult, simulate
from headway.workload import RequestSpec, Workload

__all__ = [
    "ClaimRow",
    "Experiment",
    "pct",
    "run_policy",
    "with_scores",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """One claim of a paper, what we measured, and whether it reproduced.

    ``paper`` is the claimed value as a number in the same unit as ``measured``
    (a speedup, a reduction fraction, a ratio...); ``ratio = measured / paper``.
    ``criterion`` says in words what "reproduced" means for this row.
    """

    experiment: str
    claim: str
    paper: float
    measured: float
    reproduced: bool
    criterion: str
    unit: str = ""
    note: str = ""

    @property
    def ratio(self) -> float:
        if self.paper == 0 or not math.isfinite(self.measured):
            return math.nan
        return self.measured / self.paper


@dataclass
class Experiment:
    """What one reproduction produced: claim rows, extra tables and figures."""

    name: str
    title: str
    setup: list[str] = field(default_factory=list)
    rows: list[ClaimRow] = field(default_factory=list)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    notes: list[str] = field(default_factory=list)
    wall_time: float = 0.0


def pct(values: Iterable[float | None], q: float) -> float:
    """The ``q``-th percentile (0-100) of the non-None values (nan when empty)."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    return float(np.percentile(arr, q)) if arr.size else math.nan


def mean(values: Iterable[float | None]) -> float:
    arr = np.array([v for v in values if v is not None], dtype=float)
    return float(arr.mean()) if arr.size else math.nan


def with_scores(specs: Sequence[RequestSpec], scores: Sequence[float] | None) -> list[RequestSpec]:
    """Copies of ``specs`` carrying ``score`` (or none when ``scores`` is None)."""
    if scores is None:
        return [replace(s, score=None) for s in specs]
    return [replace(s, score=float(x)) for s, x in zip(specs, scores, strict=True)]


def run_policy(
    specs: Sequence[RequestSpec] | Workload,
    policy: str,
    *,
    preset: str = "llama3-8b-a100",
    scheduler: SchedulerConfig | None = None,
    cache: CacheConfig | None = None,
    policy_kwargs: Mapping[str, Any] | None = None,
    name: str = "reproduce",
) -> SimResult:
    wl = specs if isinstance(specs, Workload) else Workload.from_specs(name, list(specs))
    return simulate(wl, policy, preset=preset, scheduler=scheduler, cache=cache, policy_kwargs=policy_kwargs)


def finished(res: SimResult) -> list[Request]:
    return [r for r in res.requests if r.state is RequestState.FINISHED]


def throughput(res: SimResult) -> float:
    """Output tokens per second over the run (first arrival to last finish)."""
    reqs = finished(res)
    t0 = min(r.arrival_time for r in reqs)
    t1 = max(r.finish_time or 0.0 for r in reqs)
    return sum(r.num_output_tokens for r in reqs) / max(t1 - t0, 1e-9)


def fmt(x: float, digits: int = 3) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}"


# -------------------------------------------------------------------- report
def print_rows(rows: Sequence[ClaimRow], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("experiment", "claim", "paper", "measured", "ratio", "reproduced"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r.experiment,
            r.claim,
            fmt(r.paper) + (f" {r.unit}" if r.unit else ""),
            fmt(r.measured) + (f" {r.unit}" if r.unit else ""),
            fmt(r.ratio, 2),
            "[green]yes[/green]" if r.reproduced else "[red]no[/red]",
        )
    Console().print(table)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return out


def write_report(exp: Experiment, out_dir: Path, command: str) -> Path:
    """``<out_dir>/<name>.md``: setup, the claim table, extra tables, figures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# Reproduction: {exp.title}", "", f"Command: `{command}`", ""]
    lines += ["## Setup", ""] + [f"- {s}" for s in exp.setup] + [""]
    lines += ["## Claims", ""]
    lines += _md_table(
        ["claim", "paper", "measured", "ratio", "reproduced", "criterion", "note"],
        [
            [
                r.claim,
                fmt(r.paper) + (f" {r.unit}" if r.unit else ""),
                fmt(r.measured) + (f" {r.unit}" if r.unit else ""),
                fmt(r.ratio, 2),
                "yes" if r.reproduced else "**no**",
                r.criterion,
                r.note,
            ]
            for r in exp.rows
        ],
    )
    for title, header, rows in exp.tables:
        lines += ["", f"## {title}", "", *_md_table(header, rows)]
    if exp.figures:
        lines += ["", "## Figures", ""]
        for fname, caption in exp.figures:
            lines += [f"![{caption}]({fname})", "", f"*{caption}*", ""]
    if exp.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in exp.notes]
    lines += ["", f"Simulated in {exp.wall_time:.1f} s wall time.", ""]
    path = out_dir / f"{exp.name}.md"
    path.write_text("\n".join(lines))
    return path


def save_figure(out_dir: Path, fname: str, draw: Callable[[Any], None], size: tuple[float, float] = (7, 4)) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=size)
    try:
        draw(fig)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
    finally:
        plt.close(fig)
    return fname


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
