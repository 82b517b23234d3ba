"""Shortcuts of the simulator's preemption paths must not change what it computes.

It skips displacement checks that cannot succeed, and fast-forwards decode stretches up to the
next announced rekey point; both must give the same requests' timelines as checking every step.
"""

from __future__ import annotations

import pytest

from headway.core import Request, make_policy, set_displacement
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import default_workload


def _always_checked(name: str, mode: str):  # type: ignore[no-untyped-def]
    """The same policy with a no-op progress hook: the simulator then checks at every step."""

    class Checked(type(make_policy(name))):  # type: ignore[misc]
        def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
            pass

    policy = Checked()
    set_displacement(policy, mode)
    return policy


@pytest.mark.parametrize("name", ["srpt-oracle", "uniboost-base", "uniboost-memguard", "uniboost"])
@pytest.mark.parametrize(
    ("mode", "rate", "max_num_seqs", "num_gpu_blocks"),
    [("evict", 6.0, 64, 1500), ("pause", 6.0, 64, 1500), ("pause", 12.0, 8, None)],
)
def test_skipped_checks_change_nothing(
    name: str, mode: str, rate: float, max_num_seqs: int, num_gpu_blocks: int | None
) -> None:
    """Evict mode displaces only for KV blocks (a small cache), pause mode for slots too."""
    wl = default_workload(num_requests=600, rate=rate)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs)
    cache = CacheConfig(num_gpu_blocks=num_gpu_blocks)
    fast = simulate(wl, make_policy(name, displacement=mode), scheduler=sched, cache=cache)
    slow = simulate(wl, _always_checked(name, mode), scheduler=sched, cache=cache)
    assert sum(r.num_preemptions for r in fast.requests) > 0  # the scenario exercises displacement
    if num_gpu_blocks is None:
        assert sum(r.num_pauses for r in fast.requests) > 0

    def outcome(res):  # type: ignore[no-untyped-def]
        return sorted(
            (r.request_id, r.finish_time, r.first_token_time, r.num_preemptions, r.num_recomputed_tokens)
            for r in res.requests
        )

    assert outcome(fast) == outcome(slow)


@pytest.mark.parametrize("name", ["uniboost-memguard", "uniboost"])
def test_memguard_band_flips_are_seen_at_the_step_they_happen(name: str) -> None:
    """MemGuard's can_preempt turns true at band boundaries below the prompt floor too (where w~,
    the key, does not change); the boundary must be announced, or the fast-forward notices the flip
    only at the end of a decode stretch, and this scenario differed from step-by-step mode."""
    wl = default_workload(num_requests=600, rate=6.0)
    cache = CacheConfig(num_gpu_blocks=1500)
    fast = simulate(wl, name, scheduler=SchedulerConfig(max_num_seqs=64), cache=cache)
    exact = simulate(wl, name, scheduler=SchedulerConfig(max_num_seqs=64, max_steps_per_event=1), cache=cache)
    assert sum(r.num_preemptions for r in exact.requests) > 0
    for a, b in zip(fast.requests, exact.requests, strict=True):
        assert a.request_id == b.request_id and a.num_preemptions == b.num_preemptions
        assert a.finish_time == pytest.approx(b.finish_time, rel=1e-9)
        assert a.first_token_time == pytest.approx(b.first_token_time, rel=1e-9)
