"""Boost priority math (Yu & Scully) and the gamma-Ada tail-slope estimator."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

__all__ = ["GammaAda", "b_gamma", "b_gamma_from_log_mgf"]


def b_gamma(w: float, gamma: float) -> float:
    """Boost ``b_gamma(w) = (1/gamma) log(1 / (1 - exp(-gamma w)))`` (same units as ``w``).

    Decreasing in ``w``: infinite at ``w = 0``, ``~ (1/gamma) log(1/(gamma w))`` for
    ``gamma w << 1`` (LAS-like: fresh work is boosted a lot), ``~ exp(-gamma w)/gamma``
    for ``gamma w >> 1`` (FCFS-like: no boost).
    """
    if w <= 0.0:
        return math.inf
    x = gamma * w
    if x > 700.0:
        return 0.0
    return -math.log(-math.expm1(-x)) / gamma


def b_gamma_from_log_mgf(log_m: float, gamma: float) -> float:
    """Partial-information boost ``(1/gamma) log(M / (M - 1))`` from ``log M``, ``M = E[e^{gamma S}]``."""
    if log_m <= 0.0:
        return math.inf
    return -math.log(-math.expm1(-log_m)) / gamma


class GammaAda:
    """gamma-Ada: gamma from the log-linear slope of the response-time tail.

    Estimator (exact): over the last ``window`` response times (TTLT, seconds) take
    the empirical quantiles ``t95`` and ``t99`` (numpy's linear interpolation). If the
    tail is exponential, ``P(T > t) ~ C exp(-theta t)``, the survival function falls
    from 0.05 to 0.01 between them, so ``theta = ln(0.05/0.01) / (t99 - t95) =
    ln 5 / (t99 - t95)`` (1/s): the tail's decay rate, which is the gamma at which
    gamma-Boost is strongly tail-optimal in the light-tailed M/G/1. Then
    ``gamma <- clamp(theta, gamma_min, gamma_max)``.

    Rate limit and clamps: a refit runs every ``refit_every`` finishes once
    ``min_samples`` are in the window; the new gamma is adopted only if it moved by more
    than ``deadband`` (relative), so cached keys are invalidated (``key_epoch``) at most
    once per ``refit_every`` finishes. ``t99 - t95 <= 1e-9`` (no spread) keeps gamma.
    Large gamma -> boosts vanish (FCFS-like); small gamma -> long boosts for little
    attained work (LAS-like).
    """

    def __init__(
        self,
        gamma: float,
        *,
        window: int = 2000,
        refit_every: int = 100,
        min_samples: int = 200,
        gamma_min: float = 0.005,
        gamma_max: float = 5.0,
        deadband: float = 0.05,
    ) -> None:
        if not (0.0 < gamma_min <= gamma <= gamma_max):
            raise ValueError(
                f"gamma-Ada needs 0 < gamma_min <= gamma <= gamma_max, got "
                f"gamma_min={gamma_min}, gamma={gamma}, gamma_max={gamma_max}"
            )
        for name, v in (("window", window), ("refit_every", refit_every), ("min_samples", min_samples)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"gamma-Ada: {name} must be an int >= 1, got {v!r}")
        if min_samples > window:
            raise ValueError(f"gamma-Ada: min_samples ({min_samples}) must be <= window ({window})")
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"gamma-Ada: deadband must be in [0, 1), got {deadband!r}")
        self.gamma = float(gamma)
        self.gamma_min = float(gamma_min)
        self.gamma_max = float(gamma_max)
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.deadband = float(deadband)
        self._times: deque[float] = deque(maxlen=window)
        self._since = 0
        self.history: list[float] = [self.gamma]

    @staticmethod
    def estimate(times: np.ndarray) -> float | None:
        """``ln 5 / (t99 - t95)``, or None when the tail has no spread."""
        t95, t99 = np.quantile(times, [0.95, 0.99])
        spread = float(t99 - t95)
        if spread <= 1e-9:
            return None
        return math.log(5.0) / spread

    def observe(self, response_time: float) -> bool:
        """Record one finished request; returns True when gamma changed."""
        self._times.append(response_time)
        self._since += 1
        if self._since < self.refit_every or len(self._times) < self.min_samples:
            return False
        self._since = 0
        theta = self.estimate(np.fromiter(self._times, dtype=float))
        if theta is None:
            return False
        new = min(max(theta, self.gamma_min), self.gamma_max)
        if abs(new - self.gamma) <= self.deadband * self.gamma:
            return False
        self.gamma = new
        self.history.append(new)
        return True
