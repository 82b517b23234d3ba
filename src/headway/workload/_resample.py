"""Output-length resampling: the same prompt does not produce the same length twice.

Sampling at temperature > 0 makes a request's output length a random variable around a
per-prompt typical length. The shared ``sequence_scheduling`` data (Vicuna-7B, four
samples per prompt) shows a per-prompt coefficient of variation of about 0.19 (median),
exported here as :data:`RESAMPLING_CV`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from headway.workload._arrivals import Seed, make_rng
from headway.workload._spec import Workload

__all__ = ["RESAMPLING_CV", "lognormal_noise_sigma", "resample_output_lengths"]

RESAMPLING_CV = 0.19
"""Median per-prompt CV of output length across resamples (sequence_scheduling data)."""


def lognormal_noise_sigma(cv: float) -> float:
    """``sigma`` of a mean-1 lognormal with coefficient of variation ``cv``: ``sqrt(ln(1 + cv^2))``."""
    if not (isinstance(cv, int | float) and math.isfinite(cv) and cv >= 0.0):
        raise ValueError(f"cv must be a finite number >= 0, got {cv!r}")
    return math.sqrt(math.log1p(cv * cv))


def resample_output_lengths(workload: Workload, cv: float, seed: Seed = 0) -> Workload:
    """A copy of ``workload`` whose output lengths are multiplied by mean-1 lognormal noise.

    Each length ``L`` becomes ``max(1, round(L * X))`` with
    ``X ~ LogNormal(mu=-sigma^2/2, sigma=sqrt(ln(1 + cv^2)))`` (so ``E[X] = 1`` and
    ``CV[X] = cv``), capped at the request's ``max_tokens`` when it has one. Noise is
    drawn in workload order from ``numpy.random.default_rng(seed)``; ``cv = 0`` returns
    the lengths unchanged. Everything else about each request is kept.
    """
    sigma = lognormal_noise_sigma(cv)
    specs = list(workload.requests)
    if sigma == 0.0 or not specs:
        new_lengths = [s.num_output_tokens for s in specs]
    else:
        noise = make_rng(seed).lognormal(mean=-0.5 * sigma * sigma, sigma=sigma, size=len(specs))
        base = np.array([s.num_output_tokens for s in specs], dtype=np.float64)
        scaled = np.maximum(np.rint(base * noise), 1.0)
        new_lengths = [int(x) for x in scaled]
    out = []
    for spec, n in zip(specs, new_lengths, strict=True):
        if spec.max_tokens is not None:
            n = min(n, spec.max_tokens)
        out.append(dataclasses.replace(spec, num_output_tokens=n))
    meta = dict(workload.meta)
    meta["output_cv"] = float(cv)
    return Workload(workload.name, tuple(out), meta)
