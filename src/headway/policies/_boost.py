"""Boost priority math (Yu & Scully) and the gamma-Ada tail-slope estimator."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

__all__ = ["GAMMA_FLOOR", "GammaAda", "b_gamma", "b_gamma_from_log_mgf", "check_count", "check_gamma"]

GAMMA_FLOOR = 1e-9
"""Smallest gamma (1/s) a policy accepts: a boost time scale of ~30 years. Below it the boosts
(``~ (1/gamma) log(1/(gamma w))``) grow so large that arrival times are lost in their rounding, and
from ~1e-307 on they overflow to infinity (every key ``-inf``)."""


def check_gamma(name: str, value: float, policy: str) -> float:
    """``value`` as float if it is a finite number >= :data:`GAMMA_FLOOR`, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{policy}: {name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= GAMMA_FLOOR):
        raise ValueError(f"{policy}: {name} must be finite and >= {GAMMA_FLOOR:g} (1/s), got {value!r}")
    return float(value)


def check_count(name: str, value: int, policy: str) -> int:
    """``value`` if it is an int >= 1 (not a bool), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{policy}: {name} must be an int >= 1, got {value!r}")
    return value


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
    if x < 1e-300:  # 1 - exp(-x) = x to double precision; and x may have underflowed to 0
        return -(math.log(gamma) + math.log(w)) / gamma  # inf if that overflows
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
    attained work (LAS-like). A non-finite response time is not recorded (it would make
    the quantiles, and so gamma, NaN); ``gamma_min`` must be at least :data:`GAMMA_FLOOR`.
    ``name`` prefixes the error messages (the policy that owns the estimator).
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
        name: str = "gamma-Ada",
    ) -> None:
        gamma = check_gamma("gamma", gamma, name)
        gamma_min = check_gamma("gamma_min", gamma_min, name)
        gamma_max = check_gamma("gamma_max", gamma_max, name)
        if not (gamma_min <= gamma <= gamma_max):
            raise ValueError(
                f"{name}: gamma-Ada needs gamma_min <= gamma <= gamma_max, got "
                f"gamma_min={gamma_min!r}, gamma={gamma!r}, gamma_max={gamma_max!r}"
            )
        window = check_count("window", window, name)
        refit_every = check_count("refit_every", refit_every, name)
        min_samples = check_count("min_samples", min_samples, name)
        if min_samples > window:
            raise ValueError(f"{name}: min_samples ({min_samples}) must be <= window ({window})")
        if isinstance(deadband, bool) or not isinstance(deadband, (int, float)) or not 0.0 <= deadband < 1.0:
            raise ValueError(f"{name}: deadband must be in [0, 1), got {deadband!r}")
        self.gamma = gamma
        self.gamma_min = gamma_min
        self.gamma_max = gamma_max
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.deadband = float(deadband)
        self._times: deque[float] = deque(maxlen=window)
        self._since = 0
        self.history: list[float] = [self.gamma]

    @staticmethod
    def estimate(times: np.ndarray) -> float | None:
        """``ln 5 / (t99 - t95)``, or None unless that spread is finite and > 1e-9."""
        with np.errstate(invalid="ignore"):  # inf - inf in the interpolation: NaN, refused below
            t95, t99 = np.quantile(times, [0.95, 0.99])
        spread = float(t99 - t95)
        if not (math.isfinite(spread) and spread > 1e-9):
            return None
        return math.log(5.0) / spread

    def observe(self, response_time: float) -> bool:
        """Record one finished request; returns True when gamma changed (never for a non-finite time)."""
        if not math.isfinite(response_time):
            return False
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
