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

from headway.workload._arrivals import Seed, is_finite_real, make_rng
from headway.workload._spec import DEFAULT_MAX_TOKENS, Workload

__all__ = [
    "OUTPUT_LENGTH_CAP_META",
    "RESAMPLING_CV",
    "lognormal_noise_sigma",
    "noisy_lengths",
    "resample_output_lengths",
]

RESAMPLING_CV = 0.19
"""Median per-prompt CV of output length across resamples (sequence_scheduling data)."""

OUTPUT_LENGTH_CAP_META = "output_length_cap"
"""``Workload.meta`` key holding the workload's largest possible output length (a client cap), when known."""


def lognormal_noise_sigma(cv: float) -> float:
    """``sigma`` of a mean-1 lognormal with coefficient of variation ``cv``: ``sqrt(ln(1 + cv^2))``."""
    if not (is_finite_real(cv) and cv >= 0.0):
        raise ValueError(f"cv must be a finite number >= 0, got {cv!r}")
    cv = float(cv)
    return math.sqrt(math.log1p(cv * cv))


def _workload_cap(meta: dict[str, object]) -> int:
    cap = meta.get(OUTPUT_LENGTH_CAP_META)
    if cap is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 1:
        raise ValueError(f"workload meta {OUTPUT_LENGTH_CAP_META!r} must be a positive integer, got {cap!r}")
    return int(cap)


def noisy_lengths(lengths: list[int], cv: float, seed: Seed = 0) -> list[int]:
    """``max(1, round(L * X))`` for each length ``L``, in order, with the mean-1 lognormal noise ``X`` of
    :func:`resample_output_lengths` (no cap); ``cv = 0`` returns the lengths unchanged."""
    sigma = lognormal_noise_sigma(cv)
    if sigma == 0.0 or not lengths:
        return list(lengths)
    noise = make_rng(seed).lognormal(mean=-0.5 * sigma * sigma, sigma=sigma, size=len(lengths))
    scaled = np.maximum(np.rint(np.array(lengths, dtype=np.float64) * noise), 1.0)
    return [int(x) for x in scaled]


def resample_output_lengths(workload: Workload, cv: float, seed: Seed = 0, *, cap: int | None = None) -> Workload:
    """A copy of ``workload`` whose output lengths are multiplied by mean-1 lognormal noise.

    Each length ``L`` becomes ``min(max(1, round(L * X)), C)`` with
    ``X ~ LogNormal(mu=-sigma^2/2, sigma=sqrt(ln(1 + cv^2)))`` (so ``E[X] = 1`` and
    ``CV[X] = cv``). The cap ``C`` is the request's ``max_tokens`` when it has one, else
    the workload's cap: ``cap`` when given, else ``workload.meta["output_length_cap"]``
    when the loader knows one (the synthetic default: 1,000, Azure conv's largest
    output), else :data:`~headway.workload._spec.DEFAULT_MAX_TOKENS` (4,096, the
    ``max_tokens`` such a request is sent with); a request already longer than that cap
    keeps its own length as its cap. Noise is drawn in workload order from
    ``numpy.random.default_rng(seed)``; ``cv = 0`` returns the lengths unchanged.
    Everything else about each request is kept; ``meta["output_cv"]`` records ``cv``. A workload
    with requests that follow others (:attr:`~headway.workload.RequestSpec.after`, a conversation's
    turns, whose prompts hold the earlier answers) is refused (ValueError).

    Two effects move the result off ``E[X] = 1``, ``CV[X] = cv``:

    - the cap clips the upper tail, so the mean and spread come out lower than the
      noise alone gives (an ad hoc check on 19,366 default-workload requests, cap
      1,000: at ``cv = 0.19`` 0.01 % of lengths reach the cap and the mean stays 210;
      at ``cv = 1.0`` 2.6 % reach it and the mean drops from 210 to 196);
    - ``max(1, round(...))`` lifts very short outputs: a 1-token output can only stay
      at 1 or grow, so its mean rises (same check, ``L = 1``: x1.01 at ``cv = 0.19``,
      x1.15 at 0.5, x1.30 at 1.0); from ``L = 3`` up the mean stays within about 1 %.
    """
    lognormal_noise_sigma(cv)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 1):
        raise ValueError(f"cap must be a positive integer number of tokens, got {cap!r}")
    workload_cap = int(cap) if cap is not None else _workload_cap(workload.meta)
    specs = list(workload.requests)
    if any(s.after is not None for s in specs):
        raise ValueError(
            f"workload {workload.name!r} has requests that follow others (a conversation's turns), whose prompts "
            "hold the earlier answers: resampling the answers alone would break that history; resample the "
            "conversations' answer lengths before building the turns (load_workload's output_cv does)"
        )
    new_lengths = noisy_lengths([s.num_output_tokens for s in specs], cv, seed)
    out = []
    for spec, n in zip(specs, new_lengths, strict=True):
        limit = spec.max_tokens if spec.max_tokens is not None else max(workload_cap, spec.num_output_tokens)
        out.append(dataclasses.replace(spec, num_output_tokens=min(n, limit)))
    meta = dict(workload.meta)
    meta["output_cv"] = float(cv)
    return Workload(workload.name, tuple(out), meta)
