"""Arrival processes: when each request of a workload reaches the server.

Every process returns a ``float64`` array of ``n`` non-decreasing arrival times in
seconds. Random processes draw from ``numpy.random.default_rng(seed)``, so the same seed
gives the same array bit for bit. The first request arrives at ``start`` and request
``i`` at ``start + gap_0 + ... + gap_{i-1}``; only ``n - 1`` gaps are drawn, so the
first ``k`` times of an ``n``-request sample equal a ``k``-request sample with the same
seed (prefix-stable).

- :class:`PoissonArrivals`: exponential gaps with mean ``1 / rate``.
- :class:`GammaArrivals`: Gamma gaps with ``shape = burstiness`` and
  ``scale = 1 / (rate * burstiness)``, the distribution ``vllm bench serve
  --request-rate R --burstiness B`` draws. The mean gap stays ``1 / rate``; the gap CV
  is ``1 / sqrt(burstiness)``: below 1 is burstier than Poisson, above 1 smoother.
  ``burstiness = 1`` is Poisson, bit for bit the same array as :class:`PoissonArrivals`
  with the same seed (numpy draws a shape-1 Gamma as an exponential).
- :class:`BurstArrivals`: all requests at one instant (PARS uses a burst of 2,000).
- :class:`TraceArrivals`: replay recorded timestamps, optionally time-scaled to a
  target mean rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "ArrivalProcess",
    "BurstArrivals",
    "FloatArray",
    "GammaArrivals",
    "PoissonArrivals",
    "Seed",
    "TraceArrivals",
    "burst_arrivals",
    "gamma_arrivals",
    "make_rng",
    "poisson_arrivals",
    "replay_arrivals",
]

Seed: TypeAlias = int | np.random.SeedSequence | np.random.Generator
"""An integer seed, a ``SeedSequence``, or a ``Generator`` to draw from directly."""

FloatArray: TypeAlias = npt.NDArray[np.float64]


def make_rng(seed: Seed) -> np.random.Generator:
    """``numpy.random.default_rng(seed)``, or ``seed`` itself when it is a Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or (isinstance(seed, int) and seed < 0):
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(seed)


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"number of arrivals must be a non-negative integer, got {n!r}")


def _check_rate(rate: float, what: str = "rate") -> None:
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0.0):
        raise ValueError(f"{what} must be a positive finite number of requests/s, got {rate!r}")


def _check_time(t: float, what: str) -> None:
    if not (isinstance(t, int | float) and math.isfinite(t) and t >= 0.0):
        raise ValueError(f"{what} must be a finite time >= 0 s, got {t!r}")


def _renewal(start: float, gaps: FloatArray) -> FloatArray:
    out = np.empty(gaps.size + 1, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    out += start
    return out


@runtime_checkable
class ArrivalProcess(Protocol):
    """Anything that can produce ``n`` arrival times from a seed."""

    def sample(self, n: int, seed: Seed = 0) -> FloatArray:
        """``n`` non-decreasing arrival times in seconds."""
        ...


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Poisson arrivals: independent exponential gaps with mean ``1 / rate`` seconds."""

    rate: float
    start: float = 0.0

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _check_time(self.start, "start")

    def sample(self, n: int, seed: Seed = 0) -> FloatArray:
        """``n`` arrival times, the first at ``start``."""
        _check_n(n)
        if n == 0:
            return np.empty(0, dtype=np.float64)
        gaps = make_rng(seed).exponential(1.0 / self.rate, size=n - 1)
        return _renewal(self.start, gaps)


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma renewal arrivals as ``vllm bench serve --burstiness``.

    Gaps are ``Gamma(shape=burstiness, scale=1 / (rate * burstiness))``: mean
    ``1 / rate``, coefficient of variation ``1 / sqrt(burstiness)``.
    """

    rate: float
    burstiness: float = 1.0
    start: float = 0.0

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        if not (isinstance(self.burstiness, int | float) and math.isfinite(self.burstiness) and self.burstiness > 0.0):
            raise ValueError(f"burstiness must be a positive finite number, got {self.burstiness!r}")
        _check_time(self.start, "start")

    def sample(self, n: int, seed: Seed = 0) -> FloatArray:
        """``n`` arrival times, the first at ``start``."""
        _check_n(n)
        if n == 0:
            return np.empty(0, dtype=np.float64)
        scale = 1.0 / (self.rate * self.burstiness)
        gaps = make_rng(seed).gamma(shape=self.burstiness, scale=scale, size=n - 1)
        return _renewal(self.start, gaps)


@dataclass(frozen=True, slots=True)
class BurstArrivals:
    """All requests arrive at the same instant ``at`` (default t = 0)."""

    at: float = 0.0

    def __post_init__(self) -> None:
        _check_time(self.at, "burst time")

    def sample(self, n: int, seed: Seed = 0) -> FloatArray:
        """``n`` copies of ``at`` (the seed is unused)."""
        _check_n(n)
        return np.full(n, float(self.at), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """Replay recorded timestamps (any unit offset), optionally time-scaled.

    Times are shifted so the earliest is 0. With ``target_rate`` they are multiplied by
    ``observed_rate / target_rate`` where ``observed_rate = (n - 1) / (max - min)``, so
    the replay keeps the trace's burst pattern at the requested mean rate. Order is kept
    (the output is non-decreasing when the input is).
    """

    timestamps: tuple[float, ...]
    target_rate: float | None = None

    def __post_init__(self) -> None:
        for i, t in enumerate(self.timestamps):
            if not (isinstance(t, int | float | np.floating | np.integer) and math.isfinite(t)):
                raise ValueError(f"trace timestamp #{i} must be a finite number, got {t!r}")
        if self.target_rate is not None:
            _check_rate(self.target_rate, "target_rate")

    def sample(self, n: int | None = None, seed: Seed = 0) -> FloatArray:
        """The first ``n`` replayed times (all of them when ``n`` is None)."""
        times = replay_arrivals(self.timestamps, self.target_rate)
        if n is None:
            return times
        _check_n(n)
        if n > times.size:
            raise ValueError(f"trace has {times.size} timestamps, cannot replay {n} arrivals")
        return times[:n]


def poisson_arrivals(n: int, rate: float, seed: Seed = 0, *, start: float = 0.0) -> FloatArray:
    """``n`` Poisson arrival times at ``rate`` requests/s (first at ``start``)."""
    return PoissonArrivals(rate, start).sample(n, seed)


def gamma_arrivals(n: int, rate: float, burstiness: float = 1.0, seed: Seed = 0, *, start: float = 0.0) -> FloatArray:
    """``n`` Gamma arrival times as ``vllm bench serve --request-rate rate --burstiness b``."""
    return GammaArrivals(rate, burstiness, start).sample(n, seed)


def burst_arrivals(n: int, at: float = 0.0) -> FloatArray:
    """``n`` arrivals all at time ``at`` (PARS: 2,000 at t = 0)."""
    return BurstArrivals(at).sample(n)


def replay_arrivals(timestamps: Sequence[float] | FloatArray, target_rate: float | None = None) -> FloatArray:
    """Recorded timestamps shifted to start at 0, optionally scaled to ``target_rate`` req/s.

    Raises ``ValueError`` naming the first non-finite timestamp, and when a trace whose
    timestamps are all equal (no rate) is asked for a ``target_rate``.
    """
    times = np.asarray(timestamps, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raise ValueError(f"trace timestamp #{int(bad[0])} must be a finite number, got {times[bad[0]]!r}")
    if target_rate is not None:
        _check_rate(target_rate, "target_rate")
    if times.size == 0:
        return times.copy()
    out: FloatArray = times - times.min()
    if target_rate is not None and times.size > 1:
        span = float(out.max())
        if span <= 0.0:
            raise ValueError(
                f"cannot time-scale a trace of {times.size} simultaneous arrivals to {target_rate} requests/s"
            )
        observed = (times.size - 1) / span
        out = out * float(observed / target_rate)
    return out
