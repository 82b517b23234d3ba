"""``headway sweep --grid FILE``: a grid of simulations on Ray, one table and report."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from headway._files import save_figure, staged_dir
from headway._help import CLIError, HelpFormatter, default_out_dir, nonempty, prepare_out_dir
from headway._optional import available
from headway.sweep._grid import load_grid
from headway.sweep._resume import finished_tasks, resumed_line, sweep_identity
from headway.sweep._runner import METRIC_NAMES, TaskResult, aggregate, max_rates, ray_missing, run_sweep

__all__ = ["add_sweep_parser"]


def add_sweep_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of simulations (policies x workloads x rates x seeds x presets) on Ray",
        description=(
            "Run every combination of a grid file (TOML or JSON with keys policies, workloads, "
            "rates, seeds, presets, num_requests, slo, policy_args, max_num_seqs, "
            "max_num_batched_tokens, max_model_len, scorer_tau, router, async_scheduling, "
            "enable_prefix_caching, limits) as Ray tasks, locally or on a cluster, and write one table and "
            "report (latency vs load per policy). A preset entry may name a fleet ('llama3-8b-h100:4', "
            "routed by router: default least-outstanding). With limits (e.g. [limits] ttft_p99 = 2.0, "
            "e2e_mean = 10.0: seconds, as the table's columns; slo_attainment = 0.9, a floor) it also "
            "reports the highest rate meeting them per preset, workload and policy (capacity.csv). Names, "
            "types and the SLO are checked before any task runs; a task that fails is reported with its "
            "parameters and the others' results are kept. An interrupted sweep (Ctrl-C, SIGTERM) writes the "
            "tasks that finished as a partial report; --resume with the same grid and --out runs only the rest."
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("--grid", type=nonempty, required=True, help="grid file (.toml or .json)")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (default: a local Ray)")
    p.add_argument("--num-cpus", type=int, default=None, help="local Ray workers (default: all cores)")
    p.add_argument("--no-ray", action="store_true", help="run the tasks in this process instead")
    p.add_argument("--out", type=nonempty, default=None, help="report folder (default: headway-out/sweep-<time>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the sweep whose report is in --out, partial or complete: reuse the tasks it finished, "
        "run only the others (and those that failed) and write one complete report. Refused, naming what "
        "differs, where that report is of another grid (limits aside), a workload file changed since, or "
        "another headway version",
    )
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=max(Console().width, 140))
    if args.num_cpus is not None and args.num_cpus < 1:
        raise CLIError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    if args.no_ray and (args.ray_address is not None or args.num_cpus is not None):
        flag = "--ray-address" if args.ray_address is not None else "--num-cpus"
        raise CLIError(f"{flag} sets up Ray, and --no-ray runs the tasks without it: drop one of them")
    if args.ray_address is not None and args.num_cpus is not None:
        raise CLIError("--num-cpus sizes a local Ray, and --ray-address joins a running cluster: drop one of them")
    if not args.no_ray and not available("ray"):  # said before the header and an empty progress bar
        raise ray_missing()
    if args.resume and args.out is None:
        raise CLIError("--resume continues the sweep whose report is in --out: name that folder")
    grid = load_grid(args.grid)
    identity = sweep_identity(grid)
    resumed = finished_tasks(Path(args.out), grid, identity) if args.resume else None
    reused = resumed.results if resumed is not None else []
    out = prepare_out_dir(args.out or default_out_dir("sweep"))
    tasks = grid.tasks()
    said = f"[bold]sweep[/] {len(tasks)} tasks ({'in-process' if args.no_ray else 'Ray'})"
    console.print(f"{said}: {resumed_line(resumed, len(tasks))}" if resumed is not None else said)
    if oracle := _noisy_oracle_note(grid):
        console.print(f"[dim]{oracle}[/]")
    failures: list[TaskResult] = []
    finished: list[TaskResult] = list(reused)
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            what = f"simulating ({len(reused)} resumed)" if reused else "simulating"
            bar = progress.add_task(what, total=len(tasks), completed=len(reused))

            def on_result(r: TaskResult) -> None:
                finished.append(r)
                progress.advance(bar)
                if r.error is not None:
                    failures.append(r)
                    progress.console.print(f"[red]task failed[/] {r.task.params()}: {r.error}")

            results = run_sweep(
                grid,
                use_ray=not args.no_ray,
                ray_address=args.ray_address,
                num_cpus=args.num_cpus,
                on_result=on_result,
                done=reused,
            )
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the tasks that finished, then end as interrupted
        _keep_finished(console, out, finished, len(tasks), identity)
        raise
    rows = aggregate(results)
    _print_table(console, _table(rows))
    if same := _seeds_alike(rows):
        console.print(f"[yellow]{same}[/]")
    capacity = max_rates(rows, grid.limits) if grid.limits else None
    if capacity:
        _print_table(console, _capacity_table(capacity, grid.limits))
        console.print(f"[dim]{_capacity_note(grid.limits)}[/]")
    paths = write_sweep_report(out, results, rows, identity, capacity=capacity)
    console.print(f"report: {', '.join(str(p) for p in paths)}")
    if resumed is not None and (partial := out / "interrupted" / "results.json") in resumed.sources:
        _discard_report(partial.parent)  # its tasks are in the complete report now
        console.print(f"[dim]the partial report resumed from {partial.parent} is removed: its tasks are in {out}[/]")
    if failures:
        console.print(f"[red]{len(failures)} of {len(tasks)} tasks failed[/] (listed above and in results.csv)")
    return 1 if failures else 0


def _keep_finished(
    console: Any, out: Path, finished: Sequence[TaskResult], total: int, identity: Mapping[str, Any]
) -> None:
    """The report of an interrupted sweep: the ``finished`` tasks alone (in grid order), with
    ``"complete": false`` in results.json, and a line saying so. Where ``out`` holds a complete
    report already (an earlier run's), this one goes to ``out/interrupted`` instead of replacing it."""
    if not finished:
        console.print(f"[yellow]interrupted before any of the {total} tasks finished: no report[/]")
        return
    where = out / "interrupted" if _complete_report(out) else out
    done = sorted(finished, key=lambda r: r.task.index)
    paths = write_sweep_report(where, done, aggregate(done), identity, total=total)
    kept = f" (the complete report already in {out} is kept)" if where != out else ""
    console.print(
        f"[yellow]interrupted: {len(done)} of {total} tasks finished; their report (partial: results.json "
        f'has "complete": false) is in {paths[0].parent}{kept}[/]'
    )


def _complete_report(out: Path) -> bool:
    """Whether ``out/results.json`` is a complete sweep's report."""
    try:
        return json.loads((out / "results.json").read_text()).get("complete") is True
    except (OSError, ValueError, AttributeError):
        return False


def _noisy_oracle_note(grid: Any) -> str | None:
    """What scores the grid's score-ranked policies get where a workload has none (every built-in
    but a prompt log scored beforehand): a noisy oracle at ``scorer_tau`` unless ``policy_args`` names a
    scorer; None when no policy is scored that way."""
    from headway.policies import noisy_oracle_defaults

    scored = [p for p in grid.policies if noisy_oracle_defaults(p, grid.policy_args.get(p), tau=0.0, seed=0)]
    if not scored:
        return None
    return (
        f"{', '.join(scored)}: ranked by a noisy oracle's length scores at Kendall tau {grid.scorer_tau} "
        "(scorer_tau) where a workload has no scores; policy_args.NAME.scorer picks a predictor instead"
    )


def _seeds_alike(rows: Sequence[dict[str, Any]]) -> str | None:
    """A note naming the rows whose seeds all gave the same run (their "mean over seeds" is one run)."""
    alike = [r for r in rows if r["seeds"] - r["failed"] > 1 and r["distinct_runs"] == 1]
    if not alike:
        return None
    which = "; ".join(f"{r['policy']} on {r['workload']} at rate {_fmt(r['rate'])}" for r in alike)
    return (
        f"every seed gave the same run for {which}: nothing there draws from the seed (a replayed trace "
        "keeps its recorded arrivals, scaled to the rate, and its lengths), so each row is one run, not a mean"
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.4g}"
    return "–" if v is None else str(v)


def _table(rows: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="sweep (mean over seeds)")
    cols = [
        "preset",
        "workload",
        "policy",
        "rate",
        "seeds",
        "failed",
        "e2e_mean",
        "e2e_p99",
        "ttft_p99",
        "norm_mean",
        "goodput_rps",
    ]
    if any((row.get("prefix_cache_hit_rate") or 0.0) > 0 for row in rows):  # (NaN compares false)
        cols.insert(cols.index("goodput_rps"), "prefix_cache_hit_rate")
    for c in cols:
        name = _HEADS.get(c, c)
        head = f"{name}\n({_UNITS[c]})" if c in _UNITS else name
        _add_column(table, c, head)
    for row in rows:
        table.add_row(*(Text(_fmt(row[c])) for c in cols))
    return table


_HEADS = {"prefix_cache_hit_rate": "prefix hit", "goodput_rps": "goodput"}
"""Headers shorter than the metric's name (the CSV and JSON keep the names), as simulate's table says them."""

_UNITS = {
    "e2e_mean": "s",
    "e2e_p99": "s",
    "ttft_mean": "s",
    "ttft_p99": "s",
    "norm_mean": "s/token",
    "norm_p99": "s/token",
    "goodput_rps": "req/s",
    "slo_attainment": "share",
    "prefix_cache_hit_rate": "share",
}


def _add_column(table: Any, name: str, head: str) -> None:
    """A column of the sweep's tables: names and headers whole (:func:`_print_table` widens the
    output to fit them), never cut short as rich would cut them ('llama3-8b-h1…' for both
    'llama3-8b-h100:4' and 'llama3-8b-h100:5'), nor folded mid-word."""
    from rich.text import Text

    # (a metric's header whole too, its unit on a line of its own: not 'prefix_c…' nor 'e2e_mea / n')
    justify = "left" if name in ("preset", "workload", "policy") else "right"
    table.add_column(Text(head), justify=justify, no_wrap=True)


def _print_table(console: Any, table: Any) -> None:
    """Print ``table`` at least as wide as its names and headers need, whole (a narrower terminal
    wraps the lines)."""
    from rich.cells import cell_len
    from rich.measure import Measurement

    for column in table.columns:  # each column as wide as its widest line (rich would cut it short)
        lines = (line for cell in (column.header, *column.cells) for line in str(cell).splitlines())
        column.min_width = max((cell_len(line) for line in lines), default=0)
    need = Measurement.get(console, console.options, table).minimum
    console.print(table, width=max(console.width, need), crop=False)


def _capacity_table(capacity: Sequence[dict[str, Any]], limits: Any) -> Any:
    """The highest rate meeting the grid's limits, a row per (preset, workload, policy)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="highest rate meeting the limits")
    for name in ("preset", "workload", "policy"):
        _add_column(table, name, name)
    _add_column(table, "max_rate", "max rate")
    for name in limits:
        _add_column(table, name, f"{name} there ({_UNITS[name]})")
    _add_column(table, "next", "the next rate missed")
    for row in capacity:
        if row["max_rate"] is None:
            rate = f"< {_fmt(row['next_rate'])}"  # the lowest rate missed
        elif row["next_rate"] is None:
            rate = f"≥ {_fmt(row['max_rate'])}"  # every rate swept met the limits
        else:
            rate = _fmt(row["max_rate"])
        missed = "–" if row["next_rate"] is None else f"{_fmt(row['next_rate'])}: {row['missed']}"
        cells = [row["preset"], row["workload"], row["policy"], rate]
        cells += [_fmt(row[name]) for name in limits]
        table.add_row(*(Text(c) for c in [*cells, missed]))
    return table


def _capacity_note(limits: Any) -> str:
    bounds = ", ".join(
        f"{name} >= {bound:g}" if name == "slo_attainment" else f"{name} <= {bound:g} {_UNITS[name]}"
        for name, bound in limits.items()
    )
    return (
        f"max rate: the highest rate swept at which {bounds} (means over seeds), every lower rate meeting "
        "them too; ≥: every rate swept met them; <: the lowest missed. Rates between those swept are not "
        "tried: add rates to narrow it. Rates are requests/s (sharegpt-sessions: conversations/s)"
    )


def write_sweep_report(
    out: Path,
    results: Sequence[TaskResult],
    rows: Sequence[dict[str, Any]],
    identity: Mapping[str, Any],
    *,
    total: int | None = None,
    capacity: Sequence[dict[str, Any]] | None = None,
) -> list[Path]:
    """results.csv (every task), aggregate.csv, results.json and curves.png in ``out``, and with
    ``capacity`` (:func:`headway.sweep.max_rates`) capacity.csv and results.json's ``"capacity"``.
    ``identity``: what the results depend on (:func:`~headway.sweep._resume.sweep_identity`), recorded
    as results.json's ``"sweep"`` for ``--resume``. ``total``: the grid's number of tasks, when
    ``results`` holds fewer (an interrupted sweep): results.json then says ``"complete": false`` and
    counts both."""
    total = len(results) if total is None else total
    doc = {
        "complete": len(results) == total,
        "tasks_finished": len(results),
        "tasks_in_grid": total,
        "sweep": dict(identity),
        "tasks": [r.row() for r in results],
        "aggregate": list(rows),
    }
    if capacity:
        doc["capacity"] = list(capacity)
    # written to a staging folder and moved into place once all are: an interrupt while writing leaves
    # the folder's earlier report whole
    with staged_dir(out) as stage:
        with (stage / "results.csv").open("w", newline="") as f:
            writer = csv.DictWriter(
                f, fieldnames=["policy", "workload", "rate", "seed", "preset", "error", *METRIC_NAMES]
            )
            writer.writeheader()
            for r in results:
                writer.writerow(r.row())
        with (stage / "aggregate.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["policy"])
            writer.writeheader()
            writer.writerows(rows)
        if capacity:
            with (stage / "capacity.csv").open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(capacity[0]))
                writer.writeheader()
                writer.writerows(capacity)
        (stage / "results.json").write_text(json.dumps(doc, indent=1, default=lambda v: None))
        png = _plot_curves(stage / "curves.png", rows)
    paths = [out / "results.csv", out / "aggregate.csv", out / "results.json"]
    if capacity:
        paths.append(out / "capacity.csv")
    else:  # not an earlier sweep's, left in the same folder
        (out / "capacity.csv").unlink(missing_ok=True)
    if png is not None:
        paths.append(out / "curves.png")
    return paths


_REPORT_FILES = ("results.csv", "aggregate.csv", "results.json", "capacity.csv", "curves.png")
"""The files :func:`write_sweep_report` may write."""


def _discard_report(folder: Path) -> None:
    """Remove a report's files from ``folder``, and the folder once empty (anything else stays)."""
    for name in _REPORT_FILES:
        (folder / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def _plot_curves(path: Path, rows: Sequence[dict[str, Any]]) -> Path | None:
    """Latency vs load per policy: one column per (preset, workload)."""
    points = [r for r in rows if r["rate"] is not None]
    if not points:
        return None
    from matplotlib.figure import Figure

    panels = sorted({(r["preset"], r["workload"]) for r in points})
    fig = Figure(figsize=(5.5 * len(panels), 7.5))
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (preset, workload) in enumerate(panels):
        mine = [r for r in points if (r["preset"], r["workload"]) == (preset, workload)]
        for i, policy in enumerate(sorted({r["policy"] for r in mine})):
            series = sorted((r["rate"], r["norm_mean"], r["e2e_p99"]) for r in mine if r["policy"] == policy)
            style = ("-", "--", ":", "-.")[(i // 10) % 4]
            rates = [s[0] for s in series]
            axes[0][j].plot(
                rates, [s[1] * 1e3 for s in series], marker="o", linestyle=style, color=f"C{i % 10}", label=policy
            )
            axes[1][j].plot(
                rates, [s[2] for s in series], marker="o", linestyle=style, color=f"C{i % 10}", label=policy
            )
        axes[0][j].set_title(f"{workload} on {preset}")
        axes[0][j].set_ylabel("mean normalized latency (ms/token)")
        axes[1][j].set_ylabel("P99 end-to-end latency (s)")
        axes[1][j].set_xlabel(_rate_label(workload))
        for ax in (axes[0][j], axes[1][j]):
            ax.set_yscale("log")
            _widen_flat(ax)
            ax.grid(True, alpha=0.3)
        axes[0][j].legend(fontsize="small")
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def _widen_flat(ax: Any) -> None:
    """Give a log axis whose points all sit at one value (to rounding: policies that decided alike, a
    single rate) a decade around it; left alone, matplotlib draws it as a sliver a few ulps high, its
    ticks unreadable and the panels misplaced."""
    values = [v for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(v) and v > 0]
    if values and max(values) <= min(values) * (1 + 1e-9):
        ax.set_ylim(min(values) / math.sqrt(10), max(values) * math.sqrt(10))


def _rate_label(workload: str) -> str:
    """What a grid's rate is on ``workload``: requests a second, or on ``sharegpt-sessions``
    conversations started a second (each sends several turns: 6/s is about 19 requests/s)."""
    if workload == "sharegpt-sessions":
        return "conversation rate (conversations/s)"
    return "arrival rate (requests/s)"
