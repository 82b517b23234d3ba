"""JSON and CSV export of run summaries and per-request metrics."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from headway._files import replacing, write_atomic
from headway.core import Request
from headway.metrics._slo import SLO
from headway.metrics._summary import _STAT_FIELDS, REQUEST_COLUMNS, Cell, GroupSummary, RunSummary, request_rows

__all__ = [
    "GROUP_COLUMNS",
    "SUMMARY_COLUMNS",
    "group_rows",
    "read_json",
    "read_replica_json",
    "safe_filename",
    "summary_row",
    "write_groups_csv",
    "write_json",
    "write_requests_csv",
    "write_summary_csv",
]

_JSON_FORMAT = "headway.metrics.summary"
_JSON_VERSION = 1
_STAT_METRICS = (*_STAT_FIELDS, "itl")  # a group's summary has no ITL
_STAT_KEYS = ("count", "mean", "min", "p50", "p90", "p95", "p99", "max")

SUMMARY_COLUMNS: tuple[str, ...] = (
    "name",
    "num_requests",
    "num_completed",
    "num_aborted",
    "num_unfinished",
    "aborted_by_reason",
    "start_time",
    "end_time",
    "makespan",
    "total_prompt_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{m}_{k}" for m in _STAT_METRICS for k in _STAT_KEYS),
    "num_preemptions",
    "num_recomputed_tokens",
    "slo",
    "num_slo_met",
    "slo_attainment",
    "goodput",
    "jain_fairness",
    "prefix_cache_hit_rate",
)
"""Columns of the summary CSV: one row per run; latency columns are in seconds
(``normalized_latency_*`` in seconds per output token; ``itl_*`` over every gap between
streamed tokens, empty where nothing was streamed, as in simulation; ``prefix_cache_hit_rate`` a
fraction, the per-request CSV's ``num_cached_tokens`` over those rows' ``num_prompt_tokens``, empty
where no engine reported it)."""

GROUP_COLUMNS: tuple[str, ...] = (
    "run",
    "group_kind",
    "group",
    "num_requests",
    "num_completed",
    "num_aborted",
    "total_output_tokens",
    "output_throughput",
    *(f"{m}_{k}" for m in _STAT_FIELDS for k in _STAT_KEYS),
    "num_preemptions",
    "num_slo_met",
    "slo_attainment",
    "goodput",
)
"""Columns of the per-group CSV: one row per run and tenant, then per run and tier
(``group_kind`` is ``tenant`` or ``tier``). Throughputs and goodput divide by the whole
run's makespan, so a run's groups of one kind add up to its own values."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str, *, default: str = "run", max_len: int = 80) -> str:
    """A portable file-name stem for a run/policy name.

    Characters outside ``[A-Za-z0-9._-]`` (``:``, ``/``, spaces, ...) become ``_``;
    leading dots and dashes are dropped; an empty result becomes ``default``.
    """
    stem = _UNSAFE.sub("_", name).lstrip(".-")[:max_len].rstrip(".")
    return stem or default


def unique_filenames(names: Iterable[str]) -> dict[str, str]:
    """Map each name to a :func:`safe_filename` stem unique case-insensitively."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        stem = base = safe_filename(name)
        n = 2
        while stem.lower() in used:
            stem = f"{base}-{n}"
            n += 1
        used.add(stem.lower())
        out[name] = stem
    return out


def _as_runs(
    summaries: RunSummary | Mapping[str, RunSummary] | Iterable[RunSummary],
) -> dict[str, RunSummary]:
    """Normalize to ``{name: summary}``; a mapping's keys win over ``summary.name``."""
    if isinstance(summaries, RunSummary):
        return {summaries.name: summaries}
    if isinstance(summaries, Mapping):
        return {str(k): v if v.name == k else dataclasses.replace(v, name=str(k)) for k, v in summaries.items()}
    out: dict[str, RunSummary] = {}
    for s in summaries:
        if s.name in out:
            raise ValueError(f"two summaries are named {s.name!r}; pass a mapping with unique keys")
        out[s.name] = s
    return out


def _cell(value: Cell) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def _write_csv(path: str | Path, columns: tuple[str, ...], rows: Iterable[Mapping[str, Cell]]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out, "w", newline="", encoding="utf-8") as fh:  # whole or not at all
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row[c]) for c in columns])
    return out


def write_requests_csv(path: str | Path, requests: Iterable[Request], *, slo: SLO | str | None = None) -> Path:
    """One row per request (columns :data:`REQUEST_COLUMNS`), in input order.

    Empty cells mean "not available"; floats are written with ``repr`` so they read
    back exactly; ``slo_met`` is ``true``/``false`` (empty without an SLO).
    """
    return _write_csv(path, REQUEST_COLUMNS, request_rows(requests, slo=slo))


def summary_row(summary: RunSummary) -> dict[str, Cell]:
    """The flat :data:`SUMMARY_COLUMNS` dict of one run (NaN -> ``None``)."""
    row: dict[str, Cell] = {
        "name": summary.name,
        "num_requests": summary.num_requests,
        "num_completed": summary.num_completed,
        "num_aborted": summary.num_aborted,
        "num_unfinished": summary.num_unfinished,
        "aborted_by_reason": ";".join(f"{k}={v}" for k, v in summary.aborted_by_reason.items()),
        "start_time": summary.start_time,
        "end_time": summary.end_time,
        "makespan": summary.makespan,
        "total_prompt_tokens": summary.total_prompt_tokens,
        "total_output_tokens": summary.total_output_tokens,
        "request_throughput": summary.request_throughput,
        "output_throughput": summary.output_throughput,
        "total_token_throughput": summary.total_token_throughput,
    }
    row.update(_flat_stats(summary, _STAT_METRICS))
    row.update(
        {
            "num_preemptions": summary.num_preemptions,
            "num_recomputed_tokens": summary.num_recomputed_tokens,
            "slo": None if summary.slo is None else summary.slo.to_spec(),
            "num_slo_met": summary.num_slo_met,
            "slo_attainment": summary.slo_attainment,
            "goodput": summary.goodput,
            "jain_fairness": summary.jain_fairness,
            "prefix_cache_hit_rate": summary.prefix_cache_hit_rate,
        }
    )
    return _nan_to_none(row)


def _flat_stats(obj: RunSummary | GroupSummary, metrics: tuple[str, ...]) -> dict[str, Cell]:
    """``{metric_key: value}`` for each of ``metrics`` (a :class:`LatencyStats` attribute) and :data:`_STAT_KEYS`."""
    out: dict[str, Cell] = {}
    for metric in metrics:
        stats = getattr(obj, metric).to_dict()
        for key in _STAT_KEYS:
            out[f"{metric}_{key}"] = stats[key]
    return out


def _nan_to_none(row: dict[str, Cell]) -> dict[str, Cell]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def group_rows(summary: RunSummary) -> list[dict[str, Cell]]:
    """The flat :data:`GROUP_COLUMNS` dicts of one run's tenants, then its tiers (NaN -> ``None``)."""
    rows: list[dict[str, Cell]] = []
    for kind, groups in (("tenant", summary.tenants), ("tier", summary.tiers)):
        for g in groups.values():
            row: dict[str, Cell] = {
                "run": summary.name,
                "group_kind": kind,
                "group": g.name,
                "num_requests": g.num_requests,
                "num_completed": g.num_completed,
                "num_aborted": g.num_aborted,
                "total_output_tokens": g.total_output_tokens,
                "output_throughput": g.output_throughput,
            }
            row.update(_flat_stats(g, _STAT_FIELDS))
            row.update(
                {
                    "num_preemptions": g.num_preemptions,
                    "num_slo_met": g.num_slo_met,
                    "slo_attainment": g.slo_attainment,
                    "goodput": g.goodput,
                }
            )
            rows.append(_nan_to_none(row))
    return rows


def write_groups_csv(path: str | Path, summaries: RunSummary | Mapping[str, RunSummary] | Iterable[RunSummary]) -> Path:
    """One row per run and tenant, then per run and tier (columns :data:`GROUP_COLUMNS`);
    mapping keys name the runs."""
    runs = _as_runs(summaries)
    return _write_csv(path, GROUP_COLUMNS, (row for s in runs.values() for row in group_rows(s)))


def write_summary_csv(
    path: str | Path, summaries: RunSummary | Mapping[str, RunSummary] | Iterable[RunSummary]
) -> Path:
    """One row per run (columns :data:`SUMMARY_COLUMNS`); mapping keys name the runs."""
    runs = _as_runs(summaries)
    return _write_csv(path, SUMMARY_COLUMNS, (summary_row(s) for s in runs.values()))


def write_json(
    path: str | Path,
    summaries: RunSummary | Mapping[str, RunSummary] | Iterable[RunSummary],
    *,
    replicas: Mapping[str, Mapping[str, RunSummary]] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``{"format", "version", "runs": {name: RunSummary.to_dict()}}`` as JSON.

    Mapping keys name the runs (and replace ``summary.name``). ``replicas`` (a fleet's
    per-replica summaries, ``{run: {replica: summary}}``) adds a ``"replicas"`` object of
    the same shape; every run it names must be one of ``summaries``. ``meta`` (how the runs
    were made: the command, the report's notes) is written as ``"meta"``. The file is strict
    JSON (NaN is written as ``null``); :func:`read_json` reads the runs back, and
    :func:`read_replica_json` the per-replica summaries.
    """
    runs = _as_runs(summaries)
    doc: dict[str, Any] = {
        "format": _JSON_FORMAT,
        "version": _JSON_VERSION,
        "runs": {name: s.to_dict() for name, s in runs.items()},
    }
    if replicas:
        unknown = sorted(set(replicas) - set(runs))
        if unknown:
            raise KeyError(f"per-replica summaries for runs that are not in the file: {unknown}")
        doc["replicas"] = {run: {str(k): s.to_dict() for k, s in per.items()} for run, per in replicas.items()}
    if meta:
        doc["meta"] = dict(meta)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return out


def read_json(path: str | Path) -> dict[str, RunSummary]:
    """Read a file written by :func:`write_json` back into ``{name: RunSummary}``."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != _JSON_FORMAT:
        raise ValueError(f"{path}: not a headway metrics summary file")
    if doc.get("version") != _JSON_VERSION:
        raise ValueError(f"{path}: unsupported summary version {doc.get('version')!r}")
    runs = doc["runs"]
    if not isinstance(runs, dict):
        raise ValueError(f"{path}: 'runs' must be an object")
    return {str(k): RunSummary.from_dict(v) for k, v in runs.items()}


def read_replica_json(path: str | Path) -> dict[str, dict[str, RunSummary]]:
    """The per-replica summaries of a file written by :func:`write_json` with ``replicas``,
    as ``{run: {replica: RunSummary}}``; ``{}`` when it has none (a single engine)."""
    read_json(path)  # the format and version checks
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    per = doc.get("replicas", {})
    if not isinstance(per, dict) or not all(isinstance(v, dict) for v in per.values()):
        raise ValueError(f"{path}: 'replicas' must be an object of objects")
    return {str(run): {str(k): RunSummary.from_dict(v) for k, v in reps.items()} for run, reps in per.items()}
