"""Tenants: who sends each request, and at which quality-of-service tier."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from headway.core import Tier
from headway.workload._arrivals import Seed, make_rng
from headway.workload._spec import Workload

__all__ = ["DEFAULT_TENANT_MIX", "Tenant", "TenantMix", "assign_tenants"]

SHARE_TOLERANCE = 1e-9
"""How far the shares of a :class:`TenantMix` may sum from 1."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant: its id, the share of requests it sends, and its tier."""

    tenant_id: str
    share: float
    tier: Tier = Tier.STANDARD

    def __post_init__(self) -> None:
        if not isinstance(self.tenant_id, str) or not self.tenant_id:
            raise ValueError(f"tenant_id must be a non-empty string, got {self.tenant_id!r}")
        share = self.share
        if isinstance(share, bool) or not (isinstance(share, int | float) and math.isfinite(share) and share > 0.0):
            raise ValueError(f"tenant {self.tenant_id!r}: share must be a positive number, got {share!r}")
        object.__setattr__(self, "tier", Tier.parse(self.tier))


@dataclass(frozen=True, slots=True)
class TenantMix:
    """Tenants and the share of requests each sends; shares are positive and sum to 1 (± 1e-9)."""

    tenants: tuple[Tenant, ...]

    def __post_init__(self) -> None:
        tenants = tuple(self.tenants)
        object.__setattr__(self, "tenants", tenants)
        if not tenants:
            raise ValueError("a tenant mix needs at least one tenant")
        for t in tenants:
            if not isinstance(t, Tenant):
                raise ValueError(f"tenant mix entries must be Tenant, got {t!r}")
        ids = [t.tenant_id for t in tenants]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"tenant mix: duplicate tenant_id(s) {', '.join(map(repr, dupes))}")
        total = math.fsum(t.share for t in tenants)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            shares = ", ".join(f"{t.tenant_id}={t.share!r}" for t in tenants)
            raise ValueError(f"tenant mix: shares must sum to 1, got {shares} (sum {total!r})")

    @classmethod
    def of(cls, *entries: tuple[str, float, Tier | str | int]) -> TenantMix:
        """``TenantMix.of(("acme", 0.2, "premium"), ("web", 0.8, "standard"))``."""
        return cls(tuple(Tenant(tid, share, Tier.parse(tier)) for tid, share, tier in entries))

    @property
    def shares(self) -> tuple[float, ...]:
        """The shares, in tenant order."""
        return tuple(t.share for t in self.tenants)


DEFAULT_TENANT_MIX = TenantMix.of(
    ("premium", 0.2, Tier.PREMIUM),
    ("standard", 0.5, Tier.STANDARD),
    ("batch", 0.3, Tier.BATCH),
)
"""Three tenants: 20% premium, 50% standard, 30% batch traffic."""


def assign_tenants(workload: Workload, mix: TenantMix, seed: Seed = 0) -> Workload:
    """A copy of ``workload`` where each request's tenant is drawn i.i.d. from ``mix``.

    Sets ``tenant_id`` and ``tier`` (nothing else); draws come from
    ``numpy.random.default_rng(seed)`` in workload order.
    """
    specs = workload.requests
    if not specs:
        return Workload(workload.name, specs, dict(workload.meta))
    p = np.array(mix.shares, dtype=np.float64)
    p /= p.sum()
    picks = make_rng(seed).choice(len(mix.tenants), size=len(specs), p=p)
    out = tuple(
        dataclasses.replace(spec, tenant_id=mix.tenants[k].tenant_id, tier=mix.tenants[k].tier)
        for spec, k in zip(specs, picks.tolist(), strict=True)
    )
    meta = dict(workload.meta)
    meta["tenants"] = {t.tenant_id: (t.share, t.tier.name.lower()) for t in mix.tenants}
    return Workload(workload.name, out, meta)
