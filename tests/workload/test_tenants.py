from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core import Tier
from headway.workload import DEFAULT_TENANT_MIX, RequestSpec, Tenant, TenantMix, Workload, assign_tenants


def workload(n: int) -> Workload:
    return Workload.from_specs("w", [RequestSpec(f"r{i}", i * 0.1, 10 + i, 5) for i in range(n)])


def test_mix_accepts_shares_summing_to_one_within_tolerance() -> None:
    mix = TenantMix.of(("a", 0.1, "premium"), ("b", 0.2, Tier.STANDARD), ("c", 0.7, 2))
    assert mix.shares == (0.1, 0.2, 0.7)
    assert [t.tier for t in mix.tenants] == [Tier.PREMIUM, Tier.STANDARD, Tier.BATCH]
    TenantMix.of(("a", 0.5 + 5e-10, "batch"), ("b", 0.5, "batch"))


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ((("a", 0.5, "premium"), ("b", 0.4, "batch")), "a=0.5, b=0.4 (sum 0.9)"),
        ((("a", 0.5, "premium"), ("b", 0.5 + 1e-6, "batch")), "b=0.500001"),
        ((("a", 1.2, "premium"), ("b", -0.2, "batch")), "share must be a positive number, got -0.2"),
        ((("a", 0.0, "premium"), ("b", 1.0, "batch")), "got 0.0"),
        ((("a", float("nan"), "premium"),), "got nan"),
        ((("a", 0.5, "premium"), ("a", 0.5, "batch")), "duplicate tenant_id(s) 'a'"),
        ((("a", 1.0, "gold"),), "unknown tier 'gold'"),
        ((("", 1.0, "batch"),), "tenant_id must be a non-empty string"),
        ((), "at least one tenant"),
    ],
)
def test_invalid_mix_names_the_values(entries: tuple[tuple[str, float, str], ...], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        TenantMix.of(*entries)
    assert fragment in str(info.value)


def test_assign_tenants_is_deterministic_and_matches_shares() -> None:
    w = workload(20_000)
    out = assign_tenants(w, DEFAULT_TENANT_MIX, seed=5)
    assert out == assign_tenants(w, DEFAULT_TENANT_MIX, seed=5)
    assert out != assign_tenants(w, DEFAULT_TENANT_MIX, seed=6)
    counts = Counter(s.tenant_id for s in out)
    for t in DEFAULT_TENANT_MIX.tenants:
        assert counts[t.tenant_id] / len(w) == pytest.approx(t.share, abs=0.015)
    tiers = {t.tenant_id: t.tier for t in DEFAULT_TENANT_MIX.tenants}
    assert all(s.tier == tiers[s.tenant_id] for s in out)


@given(n=st.integers(0, 50), seed=st.integers(0, 2**32 - 1))
def test_assign_tenants_changes_only_tenant_and_tier(n: int, seed: int) -> None:
    w = workload(n)
    mix = TenantMix((Tenant("x", 0.25, Tier.PREMIUM), Tenant("y", 0.75)))
    out = assign_tenants(w, mix, seed)
    assert [(s.request_id, s.arrival_time, s.num_prompt_tokens) for s in out] == [
        (s.request_id, s.arrival_time, s.num_prompt_tokens) for s in w
    ]
    assert {s.tenant_id for s in out} <= {"x", "y"}
    assert all(s.tier == (Tier.PREMIUM if s.tenant_id == "x" else Tier.STANDARD) for s in out)
