from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.workload import RESAMPLING_CV, RequestSpec, Workload, resample_output_lengths


def workload(lengths: list[int], max_tokens: int | None = None) -> Workload:
    specs = [
        RequestSpec(f"r{i}", float(i), 10, n, max_tokens=max_tokens, prompt=f"p{i}", tenant_id="t")
        for i, n in enumerate(lengths)
    ]
    return Workload.from_specs("w", specs, {"k": 1})


@given(
    lengths=st.lists(st.integers(1, 100_000), min_size=0, max_size=60),
    cv=st.floats(0.0, 3.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_resampling_keeps_lengths_positive_and_is_deterministic(
    lengths: list[int], cv: float, seed: int
) -> None:
    w = workload(lengths)
    out = resample_output_lengths(w, cv, seed)
    assert out == resample_output_lengths(w, cv, seed)
    assert len(out) == len(w)
    assert all(isinstance(s.num_output_tokens, int) and s.num_output_tokens >= 1 for s in out)
    # only the output length changes
    for a, b in zip(w, out, strict=True):
        assert (a.request_id, a.arrival_time, a.num_prompt_tokens, a.prompt) == (
            b.request_id,
            b.arrival_time,
            b.num_prompt_tokens,
            b.prompt,
        )
    assert out.meta["output_cv"] == cv and out.meta["k"] == 1


# tolerance on the sample CV: >= 4 standard errors (lognormal tails widen it as cv grows)
@pytest.mark.parametrize(("cv", "rel"), [(RESAMPLING_CV, 0.04), (0.5, 0.05), (1.0, 0.1)])
def test_resampling_noise_has_mean_one_and_the_requested_cv(cv: float, rel: float) -> None:
    n, base = 20_000, 1000
    out = resample_output_lengths(workload([base] * n), cv, seed=7, cap=100 * base)  # no cap in the way
    ratio = np.array([s.num_output_tokens for s in out]) / base
    assert ratio.mean() == pytest.approx(1.0, abs=5 * cv / np.sqrt(n))
    assert ratio.std() / ratio.mean() == pytest.approx(cv, rel=rel)


def test_zero_cv_is_identity_and_short_lengths_clamp_to_one() -> None:
    w = workload([1, 2, 3, 500])
    assert [s.num_output_tokens for s in resample_output_lengths(w, 0.0, 1)] == [1, 2, 3, 500]
    out = resample_output_lengths(workload([1] * 2000), 2.0, 3)
    lengths = [s.num_output_tokens for s in out]
    assert min(lengths) == 1 and max(lengths) > 1


def test_resampling_respects_max_tokens() -> None:
    out = resample_output_lengths(workload([100] * 500, max_tokens=110), 1.0, 0)
    lengths = [s.num_output_tokens for s in out]
    assert max(lengths) == 110
    assert min(lengths) < 100


def test_different_seeds_give_different_noise() -> None:
    w = workload([300] * 50)
    assert resample_output_lengths(w, 0.2, 1) != resample_output_lengths(w, 0.2, 2)


@pytest.mark.parametrize("cv", [-0.1, float("nan"), float("inf")])
def test_bad_cv_is_rejected_naming_the_value(cv: float) -> None:
    with pytest.raises(ValueError, match=f"cv must be a finite number >= 0, got {cv!r}"):
        resample_output_lengths(workload([5]), cv, 0)


def test_resampling_caps_at_the_workloads_known_output_cap() -> None:
    from headway.workload import default_workload, load_workload

    w = default_workload(3000, seed=1)
    assert w.meta["output_length_cap"] == 1000  # Azure conv's largest output
    noisy = resample_output_lengths(w, 1.0, 2)
    lengths = [s.num_output_tokens for s in noisy]
    assert max(lengths) == 1000 and sum(n == 1000 for n in lengths) > 10
    loaded = [s.num_output_tokens for s in load_workload("default", num_requests=3000, output_cv=1.0)]
    assert max(loaded) == 1000
    capped = resample_output_lengths(w, 1.0, 2, cap=700)
    assert all(b.num_output_tokens <= max(700, a.num_output_tokens) for a, b in zip(w, capped, strict=True))
    assert sum(b.num_output_tokens == 700 for b in capped) > 10


def test_resampling_caps_at_the_default_max_tokens_when_the_cap_is_unknown() -> None:
    from headway.workload._spec import DEFAULT_MAX_TOKENS

    out = resample_output_lengths(workload([3000] * 500), 1.0, 0)
    lengths = [s.num_output_tokens for s in out]
    assert max(lengths) == DEFAULT_MAX_TOKENS == 4096
    # a request already longer than the cap keeps its own length as its cap
    long = [s.num_output_tokens for s in resample_output_lengths(workload([6000] * 500), 1.0, 0)]
    assert max(long) == 6000 and min(long) < 6000
    # the request's own max_tokens still wins
    assert max(s.num_output_tokens for s in resample_output_lengths(workload([3000] * 500, 3100), 1.0, 0)) == 3100


@pytest.mark.parametrize("cap", [0, -5, True, 2.5])
def test_bad_cap_is_rejected_naming_the_value(cap: object) -> None:
    with pytest.raises(ValueError, match=f"got {cap!r}"):
        resample_output_lengths(workload([5]), 0.5, 0, cap=cap)  # type: ignore[arg-type]


def test_cv_must_be_a_real_number_not_a_bool() -> None:
    from headway.workload._resample import lognormal_noise_sigma

    with pytest.raises(ValueError, match="got True"):
        lognormal_noise_sigma(True)
    with pytest.raises(ValueError, match="got True"):
        resample_output_lengths(workload([5]), True, 0)
    assert lognormal_noise_sigma(np.float32(0.5)) == lognormal_noise_sigma(0.5)  # type: ignore[arg-type]
    w = workload([100] * 50)
    assert resample_output_lengths(w, np.float64(0.3), 1) == resample_output_lengths(w, 0.3, 1)  # type: ignore[arg-type]
