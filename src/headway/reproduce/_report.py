"""The claims table, printed (rich) and written as a Markdown page."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from headway._files import write_atomic
from headway.reproduce._claims import ClaimRow, Verdict
from headway.reproduce._common import REPORT_PREFIX, Experiment

__all__ = ["print_rows", "report_path", "write_report"]

_COLOUR = {Verdict.REPRODUCED: "green", Verdict.DIRECTION_ONLY: "yellow", Verdict.NOT_REPRODUCED: "red"}


def print_rows(rows: Sequence[ClaimRow], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("claim", "paper", "measured (mean ± std, min to max)", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rows:
        c = _COLOUR[r.verdict]
        table.add_row(r.claim, r.paper_text(), r.measured_text(), f"[{c}]{r.verdict.value}[/{c}]")
    Console().print(table)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in row) + " |" for row in rows]
    return out


def report_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"{REPORT_PREFIX}{name}.md"


def write_report(exp: Experiment, out_dir: Path, command: str) -> Path:
    """``<out_dir>/reproduce-<name>.md``: setup, the claims table, the verdict counts, extra tables,
    figures and notes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {v: sum(r.verdict is v for r in exp.rows) for v in Verdict}
    lines = [f"# Reproduction: {exp.title}", "", f"Command: `{command}`", ""]
    lines += [
        f"Verdicts: {counts[Verdict.REPRODUCED]} reproduced, {counts[Verdict.DIRECTION_ONLY]} direction only, "
        f"{counts[Verdict.NOT_REPRODUCED]} not reproduced, of {len(exp.rows)} claims. Seeds: "
        f"{', '.join(map(str, exp.seeds))} (one run per seed and setting; each value is the mean over seeds, "
        "± the sample standard deviation, with the smallest and largest seed value).",
        "",
        "How to read a row: the verdict rule is written in the code before the run and printed in the row. "
        "*Reproduced*: the mean lies in the stated band around the paper's figure (both sides). *Direction "
        "only*: the effect has the claimed sign but lies outside the band. *Not reproduced*: no effect or "
        "the opposite one; the reason column gives what the measurements say.",
        "",
        "Where the claims come from: each row's figure is the paper's as issue 24 quotes it; the papers' own "
        "text was not available offline, so the claim column restates the figure with its metric and setting, "
        "and the source column names the kind of experiment, not a figure or table number.",
        "",
    ]
    lines += ["## Setup", ""] + [f"- {s}" for s in exp.setup] + [""]
    lines += ["## Claims", ""]
    lines += _md_table(
        ["claim (paper)", "source", "paper", "setting headway ran", "measured", "rule", "verdict", "reason"],
        [
            [
                r.claim,
                r.source,
                r.paper_text(),
                r.setting,
                r.measured_text(),
                r.rule.describe(r.unit),
                r.verdict.value if r.reproduced else f"**{r.verdict.value}**",
                r.reason,
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
    lines += ["", f"Simulated in {exp.wall_time:.0f} s wall time.", ""]
    path = report_path(out_dir, exp.name)
    write_atomic(path, "\n".join(lines))
    return path
