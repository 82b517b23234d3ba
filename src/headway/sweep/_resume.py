"""``headway sweep --resume``: the tasks an earlier run of the same sweep finished, read back from its
report, so that only the others run.

A report's results.json records what its results depend on beyond each task's parameters
(:func:`sweep_identity`, under ``"sweep"``): the grid's settings, headway's version and a digest of
each workload file the grid names. A report is resumed from only where all of these are as now
(``limits`` aside: they decide the capacity table, computed afresh from all the results), so that the
resumed report is the one an uninterrupted run would have written, never a mix of two sweeps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headway._help import CLIError, describe_error
from headway.sweep._grid import Grid, Task, _is_number
from headway.sweep._runner import METRIC_NAMES, TaskResult

__all__ = ["Resumed", "finished_tasks", "resumed_line", "sweep_identity"]

_POST_PROCESSING = ("limits",)
"""Grid settings that change no task's result (the report computes from them afresh)."""


def sweep_identity(grid: Grid) -> dict[str, Any]:
    """What the results of ``grid``'s tasks depend on beyond their parameters, as JSON data: the grid's
    settings, headway's version, a SHA-256 of each workload the grid names by path (a file, or a
    folder's files), of the data each built-in workload it names reads from the shared data folder
    (``$HEADWAY_DATA_DIR``; None where it is not there), and of the file defining each policy from
    outside headway (a plugin: its class's module, not the modules that one imports)."""
    from headway import __version__
    from headway.workload import available_workloads

    built_in = set(available_workloads())
    files = {w: _digest(Path(w)) for w in grid.workloads if w not in built_in and Path(w).exists()}
    data = {w: _data_digest(w) for w in grid.workloads if w in built_in}
    code = {p: c for p in grid.policies if (c := _plugin_digest(p)) is not None}
    identity = {
        "grid": grid.settings(), "headway_version": __version__, "workload_files": files, "workload_data": data,
        "policy_code": code,
    }  # fmt: skip
    plain: dict[str, Any] = json.loads(json.dumps(identity, default=str))  # as results.json reads back
    return plain


def _data_digest(name: str) -> dict[str, str | None] | None:
    """The path and SHA-256 of what built-in workload ``name`` reads (None: it reads no data); both None
    where the data is not there."""
    from headway.workload import workload_data_path

    try:
        path = workload_data_path(name)
    except FileNotFoundError:
        return {"path": None, "sha256": None}
    return None if path is None else {"path": str(path), "sha256": _digest(path)}


def _plugin_digest(policy: str) -> dict[str, str] | None:
    """The path and SHA-256 of the file defining ``policy``'s class where it comes from outside headway;
    None for one of headway's own (its version covers them) or one whose file cannot be read."""
    import inspect

    from headway.core import get_policy_class

    try:
        cls = get_policy_class(policy)
        if cls.__module__ == "headway" or cls.__module__.startswith("headway."):
            return None
        source = inspect.getsourcefile(cls)
    except (LookupError, TypeError, OSError):  # not a policy (the grid refuses it), or a class without a file
        return None
    if source is None or not Path(source).is_file():
        return None
    return {"path": source, "sha256": _digest(Path(source))}


def _digest(path: Path) -> str:
    """SHA-256 of a file's bytes, or of a folder's files, names and bytes."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        h.update(f.relative_to(path).as_posix().encode() + b"\0")  # ('.' for the file itself)
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def _differences(recorded: Any, now: Mapping[str, Any]) -> list[str]:
    """What differs between a report's ``"sweep"`` record and ``now`` (:func:`sweep_identity`)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("grid"), dict):
        return ["it does not record the grid it ran (a report of a headway from before --resume)"]
    out = []
    grid, then = now["grid"], recorded["grid"]
    for key in dict.fromkeys([*grid, *then]):
        if key not in _POST_PROCESSING and then.get(key) != grid.get(key):
            out.append(f"{key} {_show(then.get(key))} there, {_show(grid.get(key))} now")
    if recorded.get("headway_version") != now["headway_version"]:
        out.append(f"headway {recorded.get('headway_version')} wrote it, this is headway {now['headway_version']}")
    files, then_files = now["workload_files"], recorded.get("workload_files") or {}
    for name in sorted(set(files) | set(then_files)):
        if files.get(name) != then_files.get(name):
            out.append(f"workload file {name} is not what it was (its SHA-256 differs)")
    out += _changed(now["workload_data"], recorded.get("workload_data"), "workload {}'s data")
    out += _changed(now["policy_code"], recorded.get("policy_code"), "policy {}'s code")
    return out


def _changed(now: Mapping[str, Any], then: Any, what: str) -> list[str]:
    """What differs between ``now`` (name -> its path and SHA-256, or None) and ``then``, a report's
    record of the same (a report from before it was recorded holds none)."""
    then = then if isinstance(then, dict) else {}
    out = []
    for name in sorted(set(now) | set(then)):
        new: Any = now.get(name)
        was: Any = then.get(name)
        if _sha(new) == _sha(was):
            continue
        thing = what.format(name)
        if _sha(new) is None:
            out.append(f"{thing} ({was.get('path')}) is not there now")
        elif not isinstance(was, dict):
            out.append(f"{thing} ({new['path']}) is not recorded there")
        elif was.get("sha256") is None:
            out.append(f"{thing} ({new['path']}) was not there then")
        else:
            out.append(f"{thing} ({new['path']}) is not what it was (its SHA-256 differs)")
    return out


def _sha(entry: Any) -> Any:
    return entry.get("sha256") if isinstance(entry, dict) else None


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Resumed:
    """The finished tasks of an earlier run of the same sweep."""

    results: list[TaskResult]
    """The tasks that finished without an error, in grid order (a failed task runs again)."""
    sources: list[Path]
    """The results.json files they were read from."""


def finished_tasks(out: Path, grid: Grid, identity: Mapping[str, Any]) -> Resumed:
    """The tasks of ``grid`` finished by an earlier run whose report is in ``out``: its results.json, and
    an interrupted run's in ``out/interrupted`` (where the folder held a complete report already). A
    report of another sweep (a difference :func:`sweep_identity` records) is not used; CLIError where
    no report of this sweep is there, naming what differs."""
    candidates = [p for p in (out / "results.json", out / "interrupted" / "results.json") if p.is_file()]
    if not candidates:
        raise CLIError(f"--resume: {out} holds no sweep report (results.json) to resume")
    by_params = {_key(t.params()): t for t in grid.tasks()}
    found: dict[int, TaskResult] = {}
    sources: list[Path] = []
    refused: list[str] = []
    for path in candidates:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            refused.append(f"{path} cannot be read ({describe_error(exc)})")
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list):
            refused.append(f"{path} is not a sweep's report (it has no list of tasks)")
        elif differ := _differences(doc.get("sweep"), identity):
            refused.append(f"{path} is another sweep's report: {'; '.join(differ)}")
        else:
            sources.append(path)
            for row in doc["tasks"]:
                if (result := _finished(row, by_params)) is not None:
                    found.setdefault(result.task.index, result)
    if not sources:
        raise CLIError(
            f"--resume: {'. '.join(refused)}. Resuming would mix two sweeps' results: run the sweep "
            "without --resume to start it afresh, or with the --out of this sweep's earlier run"
        )
    return Resumed([found[i] for i in sorted(found)], sources)


def _key(params: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(params[k] for k in ("policy", "workload", "rate", "seed", "preset"))


def _finished(row: Any, tasks: Mapping[tuple[Any, ...], Task]) -> TaskResult | None:
    """A task's row of results.json as its result; None for a row of a task that failed (it runs
    again) or that is not whole."""
    if not isinstance(row, dict) or row.get("error"):
        return None
    try:
        task = tasks.get(_key(row))
    except (KeyError, TypeError):
        return None
    metrics = {name: row[name] for name in METRIC_NAMES if _is_number(row.get(name))}
    if task is None or len(metrics) < len(METRIC_NAMES):
        return None
    return TaskResult(task, {name: float(v) for name, v in metrics.items()})


def resumed_line(resumed: Resumed, total: int) -> str:
    """The header's account of a resumed sweep: how many tasks were resumed and from where."""
    where = " and ".join(str(p) for p in resumed.sources)
    left = total - len(resumed.results)
    if not left:
        return f"all {total} resumed from {where}: nothing to run"
    return f"{len(resumed.results)} resumed from {where}, {left} to run"
