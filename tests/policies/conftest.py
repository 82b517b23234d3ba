from __future__ import annotations

import itertools

import pytest

from headway.core import Request, RequestState, Tier

_ids = itertools.count()


def make_request(
    *,
    arrival: float = 0.0,
    prompt_tokens: int = 100,
    max_tokens: int = 4096,
    tier: Tier = Tier.STANDARD,
    prompt: str | None = None,
    category: str | None = None,
    score: float | None = None,
    tenant: str = "default",
    rid: str | None = None,
) -> Request:
    seq = next(_ids)
    return Request(
        request_id=rid or f"r{seq}",
        arrival_time=arrival,
        num_prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        tier=tier,
        prompt=prompt,
        category=category,
        score=score,
        tenant_id=tenant,
        seq=seq,
    )


def run(req: Request) -> Request:
    """Move a waiting request to RUNNING as an engine would when scheduling it."""
    req.transition(RequestState.RUNNING)
    return req


@pytest.fixture
def mk():
    return make_request
