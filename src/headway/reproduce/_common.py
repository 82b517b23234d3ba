"""Claim rows, statistics, simulation helpers and the report writer shared by the reproductions."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from headway import _files
from headway.core import Request, RequestState
from headway.reproduce._claims import ClaimRow
from headway.sim import CacheConfig, SchedulerConfig, SimResult, simulate
from headway.workload import RequestSpec, Workload

__all__ = [
    "REPORT_PREFIX",
    "Experiment",
    "codealpaca_2k",
    "counting_runs",
    "pct",
    "run_policy",
    "with_scores",
]


@dataclass
class Experiment:
    """What one reproduction produced: claim rows, extra tables and figures."""

    name: str
    title: str
    seeds: tuple[int, ...] = ()
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


def codealpaca_2k() -> list[tuple[str, int]]:
    """CodeAlpaca-2k's (prompt, answer tokens): instruction plus input, and text-davinci-003's answer
    counted as characters / 4 (:func:`~headway.workload.approx_token_count`). Not
    ``headway.predict.data.load_codealpaca``'s counts: its WordPiece counter truncates at 128 tokens."""
    import json

    from headway.workload import approx_token_count, find_data_dir

    with (find_data_dir() / "codealpaca" / "code_alpaca_2k.json").open(encoding="utf-8") as fh:
        records = json.load(fh)
    out = []
    for rec in records:
        prompt = "\n\n".join(
            x for x in (str(rec.get("instruction") or "").strip(), str(rec.get("input") or "").strip()) if x
        )
        answer = str(rec.get("output") or "")
        if prompt and answer.strip():
            out.append((prompt, approx_token_count(answer)))
    return out


def with_scores(specs: Sequence[RequestSpec], scores: Sequence[float] | None) -> list[RequestSpec]:
    """Copies of ``specs`` carrying ``score`` (or none when ``scores`` is None)."""
    if scores is None:
        return [replace(s, score=None) for s in specs]
    return [replace(s, score=float(x)) for s, x in zip(specs, scores, strict=True)]


_ON_RUN: list[Callable[[str], None]] = []


@contextlib.contextmanager
def counting_runs(on_run: Callable[[str], None]) -> Iterator[None]:
    """While inside, :func:`run_policy` calls ``on_run(policy)`` after each simulation (progress)."""
    _ON_RUN.append(on_run)
    try:
        yield
    finally:
        _ON_RUN.remove(on_run)


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
    res = simulate(wl, policy, preset=preset, scheduler=scheduler, cache=cache, policy_kwargs=policy_kwargs)
    for on_run in _ON_RUN:
        on_run(policy)
    return res


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


REPORT_PREFIX = "reproduce-"


def save_figure(out_dir: Path, fname: str, draw: Callable[[Any], None], size: tuple[float, float] = (7, 4)) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=size)
    try:
        draw(fig)
        fig.tight_layout()
        _files.save_figure(fig, out_dir / fname, dpi=110)  # (this module's save_figure draws one first)
    finally:
        plt.close(fig)
    return fname


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
