"""Request builders for the metrics tests: finished/aborted requests with set times."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from headway.core import Request, RequestState, Tier

FinishedFactory = Callable[..., Request]


def finished(
    rid: str,
    arrival: float,
    *,
    ttft: float,
    e2e: float,
    n_out: int,
    queue: float = 0.0,
    prompt: int = 10,
    tenant: str = "default",
    tier: Tier = Tier.STANDARD,
    preemptions: int = 0,
    recomputed: int = 0,
) -> Request:
    """A FINISHED request whose last token is its finish."""
    r = Request(rid, arrival, prompt, max(n_out, 1) + 100, tenant_id=tenant, tier=tier)
    r.state = RequestState.FINISHED
    r.num_output_tokens = n_out
    r.num_computed_tokens = prompt + n_out
    r.first_scheduled_time = arrival + queue
    r.first_token_time = arrival + ttft
    r.last_token_time = arrival + e2e
    r.finish_time = arrival + e2e
    r.num_preemptions = preemptions
    r.num_recomputed_tokens = recomputed
    return r


def aborted(
    rid: str,
    arrival: float,
    *,
    reason: str | None = None,
    finish: float | None = None,
    tenant: str = "default",
    tier: Tier = Tier.STANDARD,
    preemptions: int = 0,
    recomputed: int = 0,
) -> Request:
    r = Request(rid, arrival, 10, 100, tenant_id=tenant, tier=tier)
    r.state = RequestState.ABORTED
    r.finish_time = finish
    r.num_preemptions = preemptions
    r.num_recomputed_tokens = recomputed
    if reason is not None:
        r.extra["abort_reason"] = reason
    return r


@pytest.fixture(scope="session")
def mk_finished() -> Callable[..., Request]:
    return finished


@pytest.fixture(scope="session")
def mk_aborted() -> Callable[..., Request]:
    return aborted


@pytest.fixture
def example_run() -> list[Request]:
    """Five requests with hand-computed metrics (see test_summary.py)."""
    return [
        # ttft 1, tpot (4-1)/3 = 1, e2e 4, norm 1, queue 0
        finished("A", 0.0, ttft=1.0, e2e=4.0, n_out=4, tenant="a", preemptions=1, recomputed=8),
        # ttft 2, tpot (5-3)/4 = 0.5, e2e 4, norm 0.8, queue 1
        finished("B", 1.0, ttft=2.0, e2e=4.0, n_out=5, queue=1.0, tenant="a"),
        # ttft 0.5, tpot None (1 token), e2e 2, norm 2, queue 0
        finished("C", 2.0, ttft=0.5, e2e=2.0, n_out=1, tenant="b", tier=Tier.PREMIUM),
        aborted("D", 3.0, reason="client_gone", tenant="b", tier=Tier.PREMIUM, preemptions=2, recomputed=5),
        aborted("E", 3.5, tenant="a"),
    ]
