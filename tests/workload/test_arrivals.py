from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.workload import (
    BurstArrivals,
    GammaArrivals,
    PoissonArrivals,
    TraceArrivals,
    burst_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    replay_arrivals,
)

rates = st.floats(min_value=0.01, max_value=1000.0)
burstiness = st.floats(min_value=0.05, max_value=20.0)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@given(n=st.integers(0, 400), rate=rates, b=burstiness, seed=seeds, start=st.floats(0, 1e4))
def test_gamma_times_non_decreasing_and_deterministic(
    n: int, rate: float, b: float, seed: int, start: float
) -> None:
    a = gamma_arrivals(n, rate, b, seed, start=start)
    again = gamma_arrivals(n, rate, b, seed, start=start)
    assert a.dtype == np.float64
    assert a.shape == (n,)
    assert a.tobytes() == again.tobytes()
    assert np.all(np.isfinite(a))
    assert np.all(np.diff(a) >= 0.0)
    if n:
        assert a[0] == start


@given(n=st.integers(0, 400), rate=rates, seed=seeds)
def test_poisson_equals_gamma_with_burstiness_one_bit_for_bit(n: int, rate: float, seed: int) -> None:
    p = poisson_arrivals(n, rate, seed)
    assert p.tobytes() == gamma_arrivals(n, rate, 1.0, seed).tobytes()
    assert p.tobytes() == PoissonArrivals(rate).sample(n, seed).tobytes()
    assert np.all(np.diff(p) >= 0.0)


@given(n=st.integers(1, 300), k=st.integers(0, 300), b=burstiness, seed=seeds)
def test_samples_are_prefix_stable(n: int, k: int, b: float, seed: int) -> None:
    k = min(k, n)
    process = GammaArrivals(3.0, b)
    assert process.sample(n, seed)[:k].tobytes() == process.sample(k, seed).tobytes()


def test_different_seeds_differ() -> None:
    assert not np.array_equal(gamma_arrivals(50, 5.0, 0.5, 1), gamma_arrivals(50, 5.0, 0.5, 2))


@settings(max_examples=15)  # 100k draws each
@given(rate=st.floats(0.1, 100.0), b=st.floats(0.1, 10.0), seed=seeds)
def test_gamma_mean_gap_and_cv_match_rate_and_burstiness(rate: float, b: float, seed: int) -> None:
    n = 100_001
    gaps = np.diff(GammaArrivals(rate, b).sample(n, seed))
    cv = 1.0 / math.sqrt(b)
    # standard error of the mean gap is cv / sqrt(n) relative; allow 6 of them
    assert gaps.mean() * rate == pytest.approx(1.0, abs=6 * cv / math.sqrt(n - 1))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_vllm_gamma_parameterisation() -> None:
    """Shape = burstiness, scale = 1 / (rate * burstiness), as vllm bench serve draws."""
    rate, b, seed, n = 7.0, 0.3, 11, 50
    expected_gaps = np.random.default_rng(seed).gamma(shape=b, scale=1.0 / (rate * b), size=n - 1)
    times = gamma_arrivals(n, rate, b, seed)
    assert np.array_equal(times, np.concatenate([[0.0], np.cumsum(expected_gaps)]))


def test_burst_all_at_one_instant() -> None:
    assert np.array_equal(burst_arrivals(2000), np.zeros(2000))
    assert np.all(BurstArrivals(at=3.5).sample(10, seed=123) == 3.5)


def test_replay_shifts_to_zero_and_keeps_gaps() -> None:
    out = replay_arrivals([100.0, 101.5, 101.5, 104.0])
    assert out.tolist() == [0.0, 1.5, 1.5, 4.0]


def test_replay_time_scales_to_target_rate() -> None:
    ts = np.cumsum(np.random.default_rng(0).exponential(0.5, size=200))
    out = replay_arrivals(ts, target_rate=20.0)
    assert (out.size - 1) / out[-1] == pytest.approx(20.0)
    # burst pattern kept: gaps scaled by one factor
    ratio = np.diff(out) / np.diff(ts)
    assert np.allclose(ratio, ratio[0])
    assert TraceArrivals(tuple(ts.tolist()), 20.0).sample(50).tolist() == out[:50].tolist()


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: PoissonArrivals(0.0), "0.0"),
        (lambda: PoissonArrivals(-2.0), "-2.0"),
        (lambda: GammaArrivals(float("nan")), "nan"),
        (lambda: GammaArrivals(float("inf")), "inf"),
        (lambda: GammaArrivals(1.0, 0.0), "burstiness must be a positive finite number, got 0.0"),
        (lambda: GammaArrivals(1.0, -1.0), "got -1.0"),
        (lambda: BurstArrivals(at=-1.0), "got -1.0"),
        (lambda: TraceArrivals((0.0, float("nan"))), "#1"),
        (lambda: replay_arrivals([1.0, float("nan")]), "#1"),
        (lambda: replay_arrivals([2.0, 2.0], target_rate=1.0), "simultaneous"),
        (lambda: replay_arrivals([0.0, 1.0], target_rate=0.0), "got 0.0"),
        (lambda: GammaArrivals(1.0).sample(-1), "got -1"),
        (lambda: GammaArrivals(1.0).sample(3, seed=-5), "got -5"),
        (lambda: TraceArrivals((0.0, 1.0)).sample(3), "cannot replay 3"),
    ],
)
def test_invalid_arrival_parameters_name_the_value(make: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        make()  # type: ignore[operator]
    assert fragment in str(info.value)


def _vllm_get_request_times(gaps: np.ndarray, n: int, rate: float) -> list[float]:
    """vllm bench serve 0.32's get_request (fixed rate, finite burstiness), on given gaps.

    It sums the n gaps as a running list, then multiplies every delay by
    ``(n / rate) / delays[-1]``: t = cumsum(g) * (n / rate) / sum(g).
    """
    delays = [float(g) for g in gaps]
    for i in range(1, len(delays)):
        delays[i] += delays[i - 1]
    if delays[-1] != 0:
        factor = (n / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return delays


@pytest.mark.parametrize(
    ("n", "rate", "b", "seed"), [(1, 3.0, 0.5, 1), (5, 2.0, 1.0, 0), (1000, 6.0, 0.5, 3), (2000, 7, 2.5, 11)]
)
def test_vllm_placement_reproduces_vllm_get_request_times(n: int, rate: float, b: float, seed: int) -> None:
    gaps = np.random.default_rng(seed).gamma(shape=b, scale=1.0 / (rate * b), size=n)  # the same n draws
    expected = _vllm_get_request_times(gaps, n, rate)
    times = GammaArrivals(rate, b, vllm_placement=True).sample(n, seed)
    assert times.tolist() == expected  # bit for bit
    assert np.allclose(times, np.cumsum(gaps) * (n / rate) / np.sum(gaps), rtol=1e-12, atol=0.0)
    assert times[0] > 0.0 and times[-1] == pytest.approx(n / rate, rel=1e-12)
    shifted = gamma_arrivals(n, rate, b, seed, start=10.0, vllm_placement=True)
    assert shifted.tolist() == [10.0 + t for t in expected]


@given(n=st.integers(2, 300), rate=rates, b=burstiness, seed=seeds)
def test_vllm_placement_meets_the_rate_exactly_and_the_default_on_average(
    n: int, rate: float, b: float, seed: int
) -> None:
    vllm = gamma_arrivals(n, rate, b, seed, vllm_placement=True)
    assert n / vllm[-1] == pytest.approx(rate, rel=1e-9)
    assert np.all(np.diff(vllm) >= 0.0)
    default = gamma_arrivals(n, rate, b, seed)
    assert default[0] == 0.0  # a renewal process from t = 0, not rescaled
    gaps = np.random.default_rng(seed).gamma(shape=b, scale=1.0 / (rate * b), size=n - 1)
    assert default.tolist() == np.concatenate([[0.0], np.cumsum(gaps)]).tolist()


def test_gamma_repr_names_the_placement_only_when_it_is_vllms() -> None:
    assert repr(GammaArrivals(6.0, 0.5)) == "GammaArrivals(rate=6.0, burstiness=0.5, start=0.0)"
    assert repr(GammaArrivals(6.0, 0.5, vllm_placement=True)) == (
        "GammaArrivals(rate=6.0, burstiness=0.5, start=0.0, vllm_placement=True)"
    )
    assert GammaArrivals(6.0, 0.5) != GammaArrivals(6.0, 0.5, vllm_placement=True)


def test_numpy_numbers_are_accepted_as_their_python_values() -> None:
    expected = gamma_arrivals(20, 3.0, 2.0, 5, start=1.0)
    got = gamma_arrivals(20, np.int64(3), np.float32(2.0), 5, start=np.float64(1.0))  # type: ignore[arg-type]
    assert got.tobytes() == expected.tobytes()
    assert poisson_arrivals(20, np.float32(2.0)).tobytes() == poisson_arrivals(20, 2.0).tobytes()  # type: ignore[arg-type]
    ts = [0.0, 1.0, 3.0]
    assert replay_arrivals(ts, np.float32(4.0)).tolist() == replay_arrivals(ts, 4.0).tolist()  # type: ignore[arg-type]
    assert BurstArrivals(np.float32(1.5)).sample(2).tolist() == [1.5, 1.5]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: gamma_arrivals(3, True), "rate must be a positive finite number of requests/s, got True"),
        (lambda: GammaArrivals(1.0, True), "burstiness must be a positive finite number, got True"),
        (lambda: PoissonArrivals(True), "got True"),
        (lambda: PoissonArrivals(1.0, start=True), "start must be a finite time >= 0 s, got True"),
        (lambda: BurstArrivals(at=True), "got True"),
        (lambda: TraceArrivals((0.0, True)), "#1"),
        (lambda: GammaArrivals(1.0, vllm_placement=1), "vllm_placement must be True or False, got 1"),
        (lambda: PoissonArrivals(10**400), "got 1000"),
    ],
)
def test_bools_are_not_numbers(make: object, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        make()  # type: ignore[operator]
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: poisson_arrivals(3, 1e-300), "3 arrivals at rate 1e-300 requests/s span"),
        (lambda: gamma_arrivals(10, 1e-300, 0.5), "rate 1e-300"),
        (lambda: gamma_arrivals(3, 1e-9, 2.0), "rate 1e-09"),
        (lambda: gamma_arrivals(2, 1e-300, vllm_placement=True), "2 arrivals at rate 1e-300 requests/s span 2e+300 s"),
        (lambda: replay_arrivals([0.0, 1.0, 2.0], target_rate=1e-300), "3 replayed arrivals at rate 1e-300"),
        (lambda: gamma_arrivals(3, 1e-200, 1e-200), "too small to draw gaps"),
    ],
)
def test_arrivals_spanning_more_than_a_trace_may_are_refused(make: object, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        make()  # type: ignore[operator]
    assert fragment in str(info.value)
    assert "3,660 days" in str(info.value) or "too small" in str(info.value)


def test_a_low_rate_within_the_span_limit_is_fine() -> None:
    assert poisson_arrivals(1, 1e-300).tolist() == [0.0]  # one arrival spans nothing
    times = poisson_arrivals(10, 1e-6, seed=1)  # about 10^7 s, under ten years
    assert 0.0 < times[-1] < 10 * 366 * 86_400.0
