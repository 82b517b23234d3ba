from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headway.core import Tier
from headway.workload import (
    DEFAULT_RATE,
    BurstArrivals,
    default_workload,
    load_workload,
    sample_output_lengths,
    sample_prompt_lengths,
)


def test_default_workload_is_deterministic_per_seed() -> None:
    a = default_workload(300, seed=4)
    assert a == default_workload(300, seed=4)
    assert a != default_workload(300, seed=5)
    assert len(a) == 300
    assert len({s.request_id for s in a}) == 300
    times = [s.arrival_time for s in a]
    assert times == sorted(times) and times[0] == 0.0


def test_output_lengths_reproduce_azure_conv_statistics() -> None:
    # Azure conv 2023 (data README): mean 211, p50 129, p90 424, p99 601, max 1000
    out = sample_output_lengths(200_000, seed=1)
    assert out.min() >= 1 and out.max() <= 1000
    assert out.mean() == pytest.approx(211, rel=0.03)
    p50, p90, p99 = np.percentile(out, [50, 90, 99])
    assert p50 == pytest.approx(129, rel=0.06)
    assert p90 == pytest.approx(424, rel=0.03)
    assert p99 == pytest.approx(601, rel=0.03)


def test_prompt_lengths_reproduce_azure_conv_statistics() -> None:
    # AzureLLMInferenceTrace_conv.csv ContextTokens: mean 1155, p10 207, p50 1020, p90 2734, p99 4142
    p = sample_prompt_lengths(200_000, seed=2)
    assert p.min() >= 1
    assert p.mean() == pytest.approx(1155, rel=0.03)
    p10, p50, p90, p99 = np.percentile(p, [10, 50, 90, 99])
    assert p10 == pytest.approx(207, rel=0.05)
    assert p50 == pytest.approx(1020, rel=0.03)
    assert p90 == pytest.approx(2734, rel=0.05)
    assert p99 == pytest.approx(4142, rel=0.03)


def test_default_arrivals_run_at_the_default_rate() -> None:
    w = default_workload(20_000, seed=0, tenants=None)
    times = np.array([s.arrival_time for s in w])
    assert (len(times) - 1) / times[-1] == pytest.approx(DEFAULT_RATE, rel=0.05)
    assert {s.tenant_id for s in w} == {"default"}


def test_changing_arrivals_keeps_lengths_and_tenants() -> None:
    gamma = default_workload(200, seed=9)
    burst = default_workload(200, seed=9, arrivals=BurstArrivals())
    assert all(s.arrival_time == 0.0 for s in burst)
    key = lambda s: (s.request_id, s.num_prompt_tokens, s.num_output_tokens, s.tenant_id)  # noqa: E731
    assert sorted(map(key, gamma)) == sorted(map(key, burst))


def test_default_has_three_tiers() -> None:
    w = default_workload(2000, seed=0)
    assert {s.tier for s in w} == {Tier.PREMIUM, Tier.STANDARD, Tier.BATCH}
    assert {s.tenant_id for s in w} == {"premium", "standard", "batch"}


def test_default_needs_no_data_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADWAY_DATA_DIR", "/nonexistent/headway-data")
    monkeypatch.chdir(str(tmp_path))
    w = load_workload("default")
    assert w == default_workload()
    assert len(w) == 2000


@pytest.mark.parametrize(("kw", "fragment"), [({"num_requests": -1}, "got -1"), ({"seed": -2}, "got -2")])
def test_default_rejects_bad_arguments(kw: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        default_workload(**kw)
