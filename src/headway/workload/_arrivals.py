"""Arrival processes: when each request of a workload reaches the server.

Every process returns a ``float64`` array of ``n`` non-decreasing arrival times in
seconds. Random processes draw from ``numpy.random.default_rng(seed)``, so the same seed
gives the same array bit for bit.

Poisson and Gamma arrivals are renewal processes, placed as follows by default: the
first request arrives at ``start`` and request ``i`` at ``start + gap_0 + ... +
gap_{i-1}``, with only the ``n - 1`` gaps between requests drawn. The rate is met on
average (the mean gap is ``1 / rate``), not exactly: the times are not rescaled, so a
sample's realised rate ``(n - 1) / span`` moves with the seed (on the default workload,
2,000 Gamma arrivals at 6 req/s with burstiness 0.5, seeds 0-4 give 5.87-6.21 req/s).
In exchange samples are prefix-stable: the first ``k`` times of an ``n``-request sample
equal a ``k``-request sample with the same seed.

``vllm bench serve`` (0.32, ``get_request``) draws the same gap distribution but places
it differently: it draws ``n`` gaps, so its first request comes one gap after the start,
then rescales every time so that the last arrival is exactly ``n / rate`` (its comment:
this removes a 1-2 % rate error between seeds), i.e. ``t = cumsum(g) * (n / rate) /
sum(g)``. ``GammaArrivals(..., vllm_placement=True)`` (``arrivals="gamma-vllm"`` in
:func:`~headway.workload.load_workload`) reproduces that placement; its samples are not
prefix-stable.

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

Generated and time-scaled arrivals may span at most ``MAX_TRACE_SPAN_S`` (about ten
years, the limit the trace readers apply); a longer span (a rate such as ``1e-300``)
raises ``ValueError`` naming the rate. Rates, times and burstiness accept any real
number (``int``, ``float``, numpy scalars) but not ``bool``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_TRACE_SPAN_S",
    "ArrivalProcess",
    "BurstArrivals",
    "FloatArray",
    "GammaArrivals",
    "PoissonArrivals",
    "Seed",
    "TraceArrivals",
    "arrivals_meta",
    "burst_arrivals",
    "gamma_arrivals",
    "is_finite_real",
    "make_rng",
    "poisson_arrivals",
    "replay_arrivals",
]

Seed: TypeAlias = int | np.random.SeedSequence | np.random.Generator
"""An integer seed, a ``SeedSequence``, or a ``Generator`` to draw from directly."""

FloatArray: TypeAlias = npt.NDArray[np.float64]

MAX_TRACE_SPAN_S = 10 * 366 * 86_400.0
"""Longest span of arrival times a timed trace may have (about ten years): a longer one holds a
corrupt timestamp, and would put a request ages after the others."""


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


def is_finite_real(x: object) -> bool:
    """A finite real number (``int``, ``float``, numpy scalar, ...) that is not a ``bool``."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _check_rate(rate: float, what: str = "rate") -> None:
    if not (is_finite_real(rate) and rate > 0.0):
        raise ValueError(f"{what} must be a positive finite number of requests/s, got {rate!r}")


def _check_time(t: float, what: str) -> None:
    if not (is_finite_real(t) and t >= 0.0):
        raise ValueError(f"{what} must be a finite time >= 0 s, got {t!r}")


def _check_span(span: float, n: int, rate: float, what: str = "arrivals") -> None:
    """Refuse ``n`` generated arrivals at ``rate`` spanning more than ``MAX_TRACE_SPAN_S``."""
    if not span <= MAX_TRACE_SPAN_S:  # also NaN / inf
        raise ValueError(
            f"{n} {what} at rate {rate!r} requests/s span {span:.3g} s, more than "
            f"{MAX_TRACE_SPAN_S / 86_400:,.0f} days (about ten years): the rate is too low"
        )


def _renewal(start: float, gaps: FloatArray) -> FloatArray:
    out = np.empty(gaps.size + 1, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    out += start
    return out


def _checked_renewal(start: float, gaps: FloatArray, rate: float) -> FloatArray:
    out = _renewal(start, gaps)
    _check_span(float(out[-1]) - float(start), out.size, rate)
    return out


def _vllm_placement(start: float, gaps: FloatArray, rate: float) -> FloatArray:
    """``vllm bench serve``'s times for ``n`` drawn gaps: ``cumsum(gaps) * (n / rate) / sum(gaps)``.

    The first request comes one (scaled) gap after ``start`` and the last exactly
    ``n / rate`` after it. As in vLLM, times whose gaps sum to 0 are left unscaled.
    """
    delays: FloatArray = np.cumsum(gaps)
    if delays.size and delays[-1] != 0.0:
        target = delays.size / float(rate)
        delays = delays * (target / float(delays[-1]))
    return delays + start


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
        gaps = make_rng(seed).exponential(1.0 / float(self.rate), size=n - 1)
        return _checked_renewal(self.start, gaps, self.rate)


@dataclass(frozen=True, slots=True, repr=False)
class GammaArrivals:
    """Gamma renewal arrivals as ``vllm bench serve --burstiness``.

    Gaps are ``Gamma(shape=burstiness, scale=1 / (rate * burstiness))``: mean
    ``1 / rate``, coefficient of variation ``1 / sqrt(burstiness)``.

    By default the first request arrives at ``start`` and ``n - 1`` gaps follow, not
    rescaled: the rate is met on average, and samples are prefix-stable (see the module
    documentation). ``vllm_placement=True`` places them as ``vllm bench serve`` does:
    ``n`` gaps ``g`` drawn from the same generator, times ``start + cumsum(g) * (n /
    rate) / sum(g)``, so the first request comes after one gap and the last exactly
    ``n / rate`` after ``start`` (the realised rate ``n / span`` is exact for every
    seed); such samples are not prefix-stable.
    """

    rate: float
    burstiness: float = 1.0
    start: float = 0.0
    vllm_placement: bool = False

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        b = self.burstiness
        if not (is_finite_real(b) and b > 0.0):
            raise ValueError(f"burstiness must be a positive finite number, got {b!r}")
        _check_time(self.start, "start")
        if not isinstance(self.vllm_placement, bool):
            raise ValueError(f"vllm_placement must be True or False, got {self.vllm_placement!r}")

    def __repr__(self) -> str:
        placement = ", vllm_placement=True" if self.vllm_placement else ""
        return f"GammaArrivals(rate={self.rate!r}, burstiness={self.burstiness!r}, start={self.start!r}{placement})"

    def sample(self, n: int, seed: Seed = 0) -> FloatArray:
        """``n`` arrival times: the first at ``start`` (``vllm_placement``: the last at ``start + n / rate``)."""
        _check_n(n)
        if n == 0:
            return np.empty(0, dtype=np.float64)
        b = float(self.burstiness)
        inv_scale = float(self.rate) * b
        if inv_scale == 0.0:  # underflow
            raise ValueError(f"rate * burstiness ({self.rate!r} * {self.burstiness!r}) is too small to draw gaps")
        scale = 1.0 / inv_scale
        if self.vllm_placement:
            _check_span(n / float(self.rate), n, self.rate)
            return _vllm_placement(self.start, make_rng(seed).gamma(shape=b, scale=scale, size=n), self.rate)
        gaps = make_rng(seed).gamma(shape=b, scale=scale, size=n - 1)
        return _checked_renewal(self.start, gaps, self.rate)


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
            if not is_finite_real(t):
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


def gamma_arrivals(
    n: int,
    rate: float,
    burstiness: float = 1.0,
    seed: Seed = 0,
    *,
    start: float = 0.0,
    vllm_placement: bool = False,
) -> FloatArray:
    """``n`` Gamma arrival times as ``vllm bench serve --request-rate rate --burstiness b``.

    The gap distribution is vLLM's; the placement is headway's (first at ``start``, not
    rescaled) unless ``vllm_placement`` (see :class:`GammaArrivals`).
    """
    return GammaArrivals(rate, burstiness, start, vllm_placement).sample(n, seed)


def burst_arrivals(n: int, at: float = 0.0) -> FloatArray:
    """``n`` arrivals all at time ``at`` (PARS: 2,000 at t = 0)."""
    return BurstArrivals(at).sample(n)


def replay_arrivals(timestamps: Sequence[float] | FloatArray, target_rate: float | None = None) -> FloatArray:
    """Recorded timestamps shifted to start at 0, optionally scaled to ``target_rate`` req/s.

    With ``target_rate`` every time is multiplied by ``observed / target_rate``, where
    ``observed = (n - 1) / (max - min)``: the replay's rate over its whole span is then
    ``target_rate`` exactly, and the gaps keep their proportions. Raises ``ValueError``
    naming the first non-finite timestamp, when a trace whose timestamps are all equal
    (no rate) is asked for a ``target_rate``, and when the scaled replay would span more
    than ``MAX_TRACE_SPAN_S``.
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
        out = out * (observed / float(target_rate))
        _check_span(float(out.max()), times.size, target_rate, "replayed arrivals")
    return out


def arrivals_meta(process: object) -> dict[str, object]:
    """A workload's ``meta`` entries for the arrivals ``process`` generated: ``"arrivals"``, its repr,
    and for Gamma and Poisson arrivals what ``vllm bench serve`` calls their ``request_rate``
    (``"arrival_rate"``, requests/s) and ``burstiness`` (the Gamma shape of the gaps; 1 for Poisson),
    which ``headway bench serve --save-result`` writes (a burst or a trace's times have no such shape)."""
    meta: dict[str, object] = {"arrivals": repr(process)}
    if isinstance(process, GammaArrivals):
        meta |= {"arrival_rate": float(process.rate), "burstiness": float(process.burstiness)}
    elif isinstance(process, PoissonArrivals):
        meta |= {"arrival_rate": float(process.rate), "burstiness": 1.0}
    return meta
