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
    out = resample_output_lengths(workload([base] * n), cv, seed=7)
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
