"""Distribution statistics and Jain's fairness index.

Percentiles use :func:`numpy.percentile` with ``method="linear"`` (numpy's default,
Hyndman & Fan type 7): for sorted values ``x[0..n-1]`` the ``q``-th percentile is
``x[i] + f * (x[i+1] - x[i])`` with ``i + f = q/100 * (n - 1)``. So ``p50`` of
``[1, 2, 3, 4]`` is 2.5 and ``p90`` is 3.7.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import numpy as np

__all__ = ["LatencyStats", "jain_index", "latency_stats"]


def _nan_to_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _none_to_nan(value: object) -> float:
    if value is None:
        return math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"expected a number or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Summary of one per-request metric over the requests that have it.

    All values are in the metric's unit (seconds; seconds per token for normalized
    latency). With ``count == 0`` every value is NaN (``None`` in :meth:`to_dict`).
    """

    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def empty(cls) -> LatencyStats:
        nan = math.nan
        return cls(count=0, mean=nan, min=nan, p50=nan, p90=nan, p95=nan, p99=nan, max=nan)

    def to_dict(self) -> dict[str, int | float | None]:
        """Plain JSON-safe dict; NaN becomes ``None``."""
        out: dict[str, int | float | None] = {"count": self.count}
        for f in fields(self):
            if f.name != "count":
                out[f.name] = _nan_to_none(getattr(self, f.name))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> LatencyStats:
        """Inverse of :meth:`to_dict`."""
        count = data["count"]
        if not isinstance(count, int):
            raise TypeError(f"count must be an int, got {count!r}")
        kwargs = {f.name: _none_to_nan(data[f.name]) for f in fields(cls) if f.name != "count"}
        return cls(count=count, **kwargs)


def latency_stats(values: Iterable[float]) -> LatencyStats:
    """Mean, min, p50/p90/p95/p99 (linear interpolation) and max of ``values``.

    The values are sorted first, so the result does not depend on their order.
    Empty input gives :meth:`LatencyStats.empty`. NaN values are rejected.
    """
    raw = values if isinstance(values, np.ndarray) else list(values)  # an array (e.g. all ITL gaps) as is
    arr = np.sort(np.asarray(raw, dtype=np.float64).ravel())
    if arr.size == 0:
        return LatencyStats.empty()
    if np.isnan(arr).any():
        raise ValueError("latency values must not be NaN")
    p50, p90, p95, p99 = (float(v) for v in np.percentile(arr, [50, 90, 95, 99], method="linear"))
    return LatencyStats(
        count=int(arr.size),
        mean=float(np.mean(arr)),
        min=float(arr[0]),
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        max=float(arr[-1]),
    )


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` of non-negative ``values``.

    It is 1 when all values are equal and ``1/n`` when one value holds everything.
    Returns NaN for no values or all zeros (fairness undefined).
    """
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return math.nan
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError(f"Jain's index needs non-negative values, got {arr.tolist()}")
    sq = float(np.sum(arr * arr))
    if sq == 0.0:
        return math.nan
    total = float(np.sum(arr))
    return total * total / (arr.size * sq)
