"""Run a grid of simulations as Ray tasks (or in-process), keeping every result."""

from __future__ import annotations

import logging
import math
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headway._optional import MissingExtraError, install_hint
from headway.sweep._grid import Grid, Task

if TYPE_CHECKING:
    from headway.metrics import RunSummary

__all__ = ["TaskResult", "max_rates", "run_sweep", "run_task"]

_METRICS: tuple[tuple[str, Callable[[RunSummary], float | int | None]], ...] = (
    ("e2e_mean", lambda s: s.e2e.mean),
    ("e2e_p99", lambda s: s.e2e.p99),
    ("ttft_mean", lambda s: s.ttft.mean),
    ("ttft_p99", lambda s: s.ttft.p99),
    ("norm_mean", lambda s: s.normalized_latency.mean),
    ("norm_p99", lambda s: s.normalized_latency.p99),
    ("throughput_rps", lambda s: s.request_throughput),
    ("goodput_rps", lambda s: s.goodput),
    ("slo_attainment", lambda s: s.slo_attainment),
    ("prefix_cache_hit_rate", lambda s: s.prefix_cache_hit_rate),
    ("preemptions", lambda s: s.num_preemptions),
    ("completed", lambda s: s.num_completed),
)
METRIC_NAMES = tuple(name for name, _ in _METRICS)


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What one task produced: metrics, or the error that stopped it."""

    task: Task
    metrics: dict[str, float] | None
    error: str | None = None
    wall_time: float = 0.0

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.task.params(), "error": self.error or ""}
        for name in METRIC_NAMES:
            out[name] = None if self.metrics is None else self.metrics.get(name)
        return out


def run_task(task: Task, grid: Grid) -> TaskResult:
    """Simulate one grid point; never raises (errors come back in the result)."""
    from headway.metrics import summarize
    from headway.policies import noisy_oracle_defaults
    from headway.sim import simulate
    from headway.sim._fleet import fleet_presets
    from headway.workload import load_workload

    try:
        options: dict[str, Any] = {"seed": task.seed, **grid.workload_options()}
        if task.rate is not None:
            options["rate"] = task.rate
        workload = load_workload(task.workload, **options)
        kwargs = dict(grid.policy_args.get(task.policy, {}))
        if any(spec.score is None for spec in workload.requests):  # as headway simulate does
            kwargs = noisy_oracle_defaults(task.policy, kwargs, tau=grid.scorer_tau, seed=task.seed) or kwargs
        presets = fleet_presets(task.preset)
        res = simulate(
            workload,
            task.policy,
            preset=presets,
            scheduler=grid.scheduler(),
            cache=grid.cache(),
            policy_kwargs=kwargs,
            router=grid.router if len(presets) > 1 else None,  # a fleet entry ("llama3-8b-h100:2")
        )
        summary = summarize(res.requests, slo=grid.slo, name=task.policy)
        metrics = {}
        for name, get in _METRICS:
            value = get(summary)
            metrics[name] = float("nan") if value is None else float(value)
        return TaskResult(task, metrics, wall_time=res.wall_time)
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return TaskResult(task, None, error=detail)


def _local(tasks: Sequence[Task], grid: Grid) -> Iterator[TaskResult]:
    for task in tasks:
        yield run_task(task, grid)


def ray_missing() -> MissingExtraError:
    """The error of a sweep on Ray without Ray installed."""
    return MissingExtraError(f"Ray is not installed: {install_hint('sweep')} or run with --no-ray", name="ray")


def _ray(tasks: Sequence[Task], grid: Grid, address: str | None, num_cpus: int | None) -> Iterator[TaskResult]:
    try:
        import ray
    except ImportError:
        raise ray_missing() from None
    started = not ray.is_initialized()
    # ray.init takes SIGTERM over (its core worker prints a stack dump and exits 1): the handler from
    # before is put back, so that SIGTERM unwinds as Ctrl-C does (headway.cli) and ray.shutdown() runs
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    if started:
        ray.init(
            address=address,
            num_cpus=None if address else num_cpus,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        grid_ref = ray.put(grid)
        pending = {remote.remote(task, grid_ref): task for task in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:
                    yield TaskResult(task, None, error=f"Ray task failed: {type(exc).__name__}: {exc}")
    finally:
        if started:
            ray.shutdown()
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)


def run_sweep(
    grid: Grid,
    *,
    use_ray: bool = True,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    on_result: Callable[[TaskResult], None] | None = None,
    done: Sequence[TaskResult] = (),
) -> list[TaskResult]:
    """Run every task of ``grid``; results come back in grid order.

    With ``use_ray`` the tasks are Ray tasks on a local Ray (``num_cpus`` workers) or
    on the cluster at ``ray_address``; without it they run in this process. Both give
    identical numbers: each task is a deterministic simulation. ``done``: results of this
    grid's tasks that an earlier run finished (``headway sweep --resume``), taken as they
    are; only the other tasks run (and reach ``on_result``), Ray not started when none is left.
    """
    tasks = grid.tasks()
    results = {r.task.index: r for r in done}
    if any(i >= len(tasks) or tasks[i] != r.task for i, r in results.items()):
        raise ValueError("done holds results of tasks that are not this grid's")
    todo = [t for t in tasks if t.index not in results]
    if todo:
        stream = _ray(todo, grid, ray_address, num_cpus) if use_ray else _local(todo, grid)
        for result in stream:
            results[result.task.index] = result
            if on_result is not None:
                on_result(result)
    return [results[t.index] for t in tasks]


def aggregate(results: Sequence[TaskResult]) -> list[dict[str, Any]]:
    """Mean over seeds of each (preset, workload, policy, rate), in grid order, with how many of its
    seeds' runs differ (``distinct_runs``)."""
    groups: dict[tuple[str, str, str, float | None], list[TaskResult]] = {}
    for r in results:
        t = r.task
        groups.setdefault((t.preset, t.workload, t.policy, t.rate), []).append(r)
    rows = []
    for (preset, workload, policy, rate), members in groups.items():
        ok = [m.metrics for m in members if m.metrics is not None]
        row: dict[str, Any] = {
            "preset": preset,
            "workload": workload,
            "policy": policy,
            "rate": rate,
            "seeds": len(members),
            "failed": len(members) - len(ok),
        }
        for name in METRIC_NAMES:
            vals = [m[name] for m in ok if not math.isnan(m[name])]
            row[name] = sum(vals) / len(vals) if vals else float("nan")
        # runs whose metrics differ: 1 of several seeds means nothing drew from the seed (a replayed
        # trace with its own times and lengths, a policy without random draws): one run, not a mean
        row["distinct_runs"] = len({tuple(repr(m[name]) for name in METRIC_NAMES) for m in ok})
        rows.append(row)
    return rows


def _misses(row: dict[str, Any], limits: Mapping[str, float]) -> list[str]:
    """The limits a row of :func:`aggregate` does not meet, as ``"ttft_p99 2.31 > 2"``; a metric
    without a value (every seed failed) misses."""
    out = []
    for name, bound in limits.items():
        value = row[name]
        lower = name == "slo_attainment"  # a share to reach; the latencies are ceilings
        if math.isnan(value):
            out.append(f"{name}: no value (every seed failed, or no request completed)")
        elif value < bound if lower else value > bound:
            out.append(f"{name} {value:.4g} {'<' if lower else '>'} {bound:g}")
    return out


def max_rates(rows: Sequence[dict[str, Any]], limits: Mapping[str, float]) -> list[dict[str, Any]]:
    """The highest swept rate at which every limit holds, per (preset, workload, policy) of the rows of
    :func:`aggregate` (means over seeds), in their order.

    Rates are walked upward and the first that misses a limit ends the walk, so ``max_rate`` is the
    highest rate meeting the limits with every lower rate meeting them too (None: the lowest misses);
    ``next_rate`` is the rate that missed (None: every rate met them, so the capacity is at least
    ``max_rate``) and ``missed`` what it missed; the limited metrics are those at ``max_rate``. Rows
    without a rate (a workload's own arrivals) are left out.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["rate"] is not None:
            groups.setdefault((row["preset"], row["workload"], row["policy"]), []).append(row)
    out = []
    for (preset, workload, policy), members in groups.items():
        best: dict[str, Any] | None = None
        after: dict[str, Any] | None = None
        missed: list[str] = []
        for row in sorted(members, key=lambda r: r["rate"]):
            missed = _misses(row, limits)
            if missed:
                after = row
                break
            best = row
        found: dict[str, Any] = {
            "preset": preset,
            "workload": workload,
            "policy": policy,
            "max_rate": None if best is None else best["rate"],
            "next_rate": None if after is None else after["rate"],
            "missed": "; ".join(missed) if after is not None else "",
        }
        for name in limits:
            found[name] = float("nan") if best is None else best[name]
        out.append(found)
    return out
