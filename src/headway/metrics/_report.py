"""One call that writes every report artefact of a set of runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from headway._files import staged_dir
from headway.core import Request
from headway.metrics._export import (
    unique_filenames,
    write_groups_csv,
    write_json,
    write_requests_csv,
    write_summary_csv,
)
from headway.metrics._html import FIGURES, render_figures, render_html
from headway.metrics._plots import TimelineLike
from headway.metrics._summary import RunSummary

__all__ = ["ReportPaths", "write_report"]


@dataclass(frozen=True, slots=True)
class ReportPaths:
    """The files :func:`write_report` wrote."""

    out_dir: Path
    summary_json: Path
    summary_csv: Path
    groups_csv: Path
    """One row per run and tenant, then per run and tier (``GROUP_COLUMNS``)."""
    requests_csv: Mapping[str, Path]
    """Run name -> ``requests_<sanitized name>.csv``."""
    figures: Mapping[str, Path]
    """Figure key (``latency_cdf``, ``percentiles``, ``timeline``) -> PNG path."""
    html: Path

    def all(self) -> list[Path]:
        """Every written file."""
        return [
            self.summary_json,
            self.summary_csv,
            self.groups_csv,
            *self.requests_csv.values(),
            *self.figures.values(),
            self.html,
        ]


def _stale_files(out: Path, written: set[Path]) -> list[Path]:
    """Files of an earlier report in ``out`` that this one did not write again: its per-run CSVs
    (``requests_*.csv``) and figures. Nothing else in the folder is touched."""
    candidates = [*out.glob("requests_*.csv"), *(out / f"{key}.png" for key in FIGURES)]
    return [f for f in candidates if f.is_file() and f not in written]


def write_report(
    out_dir: str | Path,
    runs: Mapping[str, tuple[RunSummary, Sequence[Request]]],
    *,
    title: str = "headway report",
    notes: str | Sequence[str] | None = None,
    baseline: str | None = None,
    timeline: Mapping[str, Sequence[TimelineLike]] | None = None,
    replicas: Mapping[str, Mapping[str, RunSummary]] | None = None,
    command: str | None = None,
) -> ReportPaths:
    """Write ``summary.json``, ``summary.csv``, ``groups.csv`` (per tenant and tier),
    ``requests_<name>.csv`` per run,
    ``latency_cdf.png``, ``percentiles.png`` (and ``timeline.png`` when ``timeline``
    is given) and a self-contained ``report.html`` into ``out_dir``.

    ``runs`` maps a run (policy) name to its summary and requests; names are used
    as given in tables and JSON, and sanitized (``[A-Za-z0-9._-]``, made unique) in
    file names. The per-request CSV's ``slo_met`` uses each summary's SLO.
    Written into a folder that holds an earlier report, it removes that report's per-run CSVs and
    figures that it does not write again (a run dropped since, a timeline no longer drawn), so the
    folder holds one report; other files are left alone.
    ``replicas`` (``{run: {replica: summary}}``, a fleet's per-replica summaries) adds a
    per-replica table to that run's section of ``report.html`` and a ``"replicas"``
    object to ``summary.json``. ``command`` (the command line that made the runs) and the
    ``notes`` go into ``summary.json``'s ``"meta"`` too, so the file says how to make it again.
    """
    if not runs:
        raise ValueError("write_report() needs at least one run")
    if baseline is not None and baseline not in runs:
        raise KeyError(f"baseline {baseline!r} is not one of the runs: {sorted(runs)}")
    if replicas and set(replicas) - set(runs):
        raise KeyError(
            f"per-replica summaries for runs that are not in the report: {sorted(set(replicas) - set(runs))}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {name: s for name, (s, _) in runs.items()}
    note_lines = [notes] if isinstance(notes, str) else list(notes or ())
    meta = {k: v for k, v in (("command", command), ("notes", note_lines)) if v}
    stems = unique_filenames(runs)
    images = render_figures(runs, timeline)
    # every file is written to a staging folder first and moved into place once all are: an interrupted
    # run leaves an earlier report in the folder whole (not new summaries beside an old per-run CSV)
    with staged_dir(out) as stage:
        write_json(stage / "summary.json", summaries, replicas=replicas, meta=meta)
        write_summary_csv(stage / "summary.csv", summaries)
        write_groups_csv(stage / "groups.csv", summaries)
        for name, (s, reqs) in runs.items():
            write_requests_csv(stage / f"requests_{stems[name]}.csv", reqs, slo=s.slo)
        for key, png in images.items():
            (stage / f"{key}.png").write_bytes(png)
        (stage / "report.html").write_text(
            render_html(runs, title=title, notes=notes, baseline=baseline, images=images, replicas=replicas),
            encoding="utf-8",
        )
    summary_json, summary_csv, groups_csv = out / "summary.json", out / "summary.csv", out / "groups.csv"
    requests_csv = {name: out / f"requests_{stems[name]}.csv" for name in runs}
    figures = {key: out / f"{key}.png" for key in images}
    html_path = out / "report.html"
    for stale in _stale_files(out, set(requests_csv.values()) | set(figures.values())):
        stale.unlink()  # an earlier report's own files in the same folder would read as this run's
    return ReportPaths(
        out_dir=out,
        summary_json=summary_json,
        summary_csv=summary_csv,
        groups_csv=groups_csv,
        requests_csv=requests_csv,
        figures=figures,
        html=html_path,
    )
