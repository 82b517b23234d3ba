"""Synthetic step logs from a known cost model plus noise (the calibration audit's generator)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from headway.sim._calibrate import StepLog, capacity_cost_model
from headway.sim._cost import CostModel

HEADER: dict[str, Any] = {
    "type": "header", "vllm": "0.32.0", "num_gpu_blocks": 300, "block_size": 128, "max_num_seqs": 8,
    "max_num_batched_tokens": 2048, "max_model_len": 2048, "enable_chunked_prefill": True,
}  # fmt: skip
TRUE = {"step_overhead": 4e-3, "per_token": 6e-5, "per_seq": 2e-4, "per_kv_token": 3e-7, "per_prefill_step": 2e-3,
        "per_arrival": 1.5e-3}  # fmt: skip
Comp = tuple[int, int, int, int]
"""A step's composition: (tokens, sequences, KV tokens, requests arriving while it runs)."""


def base_model() -> CostModel:
    return capacity_cost_model(
        "b", step_overhead=1e-3, per_token=0.0, per_seq=0.0, per_kv_token=0.0, capacity_tokens=1000,
        kv_bytes_per_token=1.0,
    )  # fmt: skip


def true_time(n: int, s: int, kv: int, arrivals: int = 0, t: dict[str, float] = TRUE) -> float:
    d = t["step_overhead"] + t["per_token"] * n + t["per_seq"] * s + t["per_kv_token"] * kv
    return d + (t["per_prefill_step"] if n > s else 0.0) + t["per_arrival"] * arrivals


def rows(
    comps: Sequence[Comp], noise: float = 0.02, seed: int = 0, new_shape_cost: float = 0.0, gap: float = 1e-4
) -> list[dict[str, Any]]:
    """Step-log lines of back-to-back busy steps; ``new_shape_cost``: the one-time extra of a step of
    a token count not run before."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    shapes: set[int] = set()
    t = 100.0
    seen = 0  # requests that arrived during the previous step: this step's line counts them
    for i, (tokens, seqs, kv, during) in enumerate(comps):
        d = true_time(tokens, seqs, kv, during) * (1 + rng.gauss(0, noise))
        d += new_shape_cost if tokens not in shapes else 0.0
        shapes.add(tokens)
        out.append({"step": i + 1, "t0": t, "t1": t + 1e-4, "t2": t + 2e-4, "t3": t + d - gap, "num_tokens": tokens,
                    "num_seqs": seqs, "num_kv_tokens": kv, "busy": True, "arrivals": seen})  # fmt: skip
        seen = during
        t += d
    return out


def log(comps: Sequence[Comp], **kw: Any) -> StepLog:
    return StepLog(dict(HEADER), rows(comps, **kw), [])


def mixed(n: int, seed: int, sizes: Sequence[int] | None = None, pre_frac: float = 0.25) -> list[Comp]:
    """Decode steps of 1-8 sequences, a ``pre_frac`` share holding a prefill chunk (of a size from
    ``sizes``, else 16-1024 tokens), 0-2 arrivals."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seqs = rng.randint(1, 8)
        pre = rng.random() < pre_frac
        prefill = (rng.choice(sizes) if sizes else rng.randint(16, 1024)) if pre else 0
        out.append((seqs + prefill, seqs, seqs * rng.randint(16, 1500), rng.choice([0, 0, 0, 1, 2])))
    return out
