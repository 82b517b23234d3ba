"""Percentile statistics and Jain's fairness index, with hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.metrics import LatencyStats, jain_index, latency_stats


def test_percentiles_linear_interpolation() -> None:
    s = latency_stats([4.0, 1.0, 3.0, 2.0])
    assert s.count == 4
    assert s.mean == 2.5
    assert (s.min, s.max) == (1.0, 4.0)
    # position q/100 * (n - 1) between sorted values 1, 2, 3, 4
    assert s.p50 == pytest.approx(2.5, abs=1e-12)
    assert s.p90 == pytest.approx(3.7, abs=1e-12)
    assert s.p95 == pytest.approx(3.85, abs=1e-12)
    assert s.p99 == pytest.approx(3.97, abs=1e-12)


def test_percentiles_eleven_values_hit_order_statistics() -> None:
    s = latency_stats(float(v) for v in range(11))  # 0..10: p50 = 5, p90 = 9 exactly
    assert (s.p50, s.p90) == (5.0, 9.0)
    assert s.p99 == pytest.approx(9.9, abs=1e-12)


def test_single_value() -> None:
    s = latency_stats([0.25])
    assert s == LatencyStats(1, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25)


def test_empty_gives_nan_and_none_in_dict() -> None:
    s = latency_stats([])
    assert s.count == 0 and math.isnan(s.mean) and math.isnan(s.p99)
    d = s.to_dict()
    assert d["count"] == 0 and all(d[k] is None for k in d if k != "count")
    back = LatencyStats.from_dict(d)
    assert back.count == 0 and math.isnan(back.max)


def test_nan_rejected() -> None:
    with pytest.raises(ValueError, match="NaN"):
        latency_stats([1.0, math.nan])


def test_stats_dict_round_trip() -> None:
    s = latency_stats([0.1, 0.2, 0.7])
    assert LatencyStats.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 1.0),
        ([1.0, 0.0, 0.0, 0.0], 0.25),  # one tenant gets everything: 1/n
        ([1.0, 2.0, 3.0], 36.0 / 42.0),  # 6^2 / (3 * 14)
        ([2.0, 1.0], 9.0 / 10.0),  # 3^2 / (2 * 5)
        ([5.0], 1.0),
    ],
)
def test_jain_known_values(values: list[float], expected: float) -> None:
    assert jain_index(values) == pytest.approx(expected, abs=1e-12)


def test_jain_undefined_and_invalid() -> None:
    assert math.isnan(jain_index([]))
    assert math.isnan(jain_index([0.0, 0.0]))
    with pytest.raises(ValueError, match="non-negative"):
        jain_index([1.0, -1.0])


finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60))
def test_percentiles_monotone(values: list[float]) -> None:
    s = latency_stats(values)
    assert s.count == len(values)
    assert s.min <= s.p50 <= s.p90 <= s.p95 <= s.p99 <= s.max
    tol = 1e-9 * max(1.0, s.max)
    assert s.min - tol <= s.mean <= s.max + tol
    assert latency_stats(reversed(values)) == s  # order does not matter


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=1, max_size=30))
def test_jain_bounds(values: list[float]) -> None:
    j = jain_index(values)
    if sum(values) == 0.0:
        assert math.isnan(j)
    else:
        assert 1.0 / len(values) - 1e-9 <= j <= 1.0 + 1e-9
