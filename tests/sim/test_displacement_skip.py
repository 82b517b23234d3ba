"""The simulator skips displacement checks that cannot succeed; the results must not change."""

from __future__ import annotations

import pytest

from headway.core import Request, make_policy
from headway.sim import SchedulerConfig, simulate
from headway.workload import default_workload


def _always_checked(name: str):  # type: ignore[no-untyped-def]
    """The same policy with a no-op progress hook: the simulator then checks at every step."""

    class Checked(type(make_policy(name))):  # type: ignore[misc]
        def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
            pass

    return Checked()


@pytest.mark.parametrize("name", ["srpt-oracle", "uniboost-base"])
@pytest.mark.parametrize(("rate", "max_num_seqs"), [(6.0, 64), (12.0, 8)])
def test_skipped_checks_change_nothing(name: str, rate: float, max_num_seqs: int) -> None:
    wl = default_workload(num_requests=600, rate=rate)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs)
    fast = simulate(wl, make_policy(name), scheduler=sched)
    slow = simulate(wl, _always_checked(name), scheduler=sched)
    assert sum(r.num_preemptions for r in fast.requests) > 0  # the scenario exercises displacement

    def outcome(res):  # type: ignore[no-untyped-def]
        return sorted(
            (r.request_id, r.finish_time, r.first_token_time, r.num_preemptions, r.num_recomputed_tokens)
            for r in res.requests
        )

    assert outcome(fast) == outcome(slow)
