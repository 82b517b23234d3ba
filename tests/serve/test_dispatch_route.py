"""The dispatcher's routing among backends with room."""

from __future__ import annotations

import asyncio

import pytest

from headway.core import Request, make_policy
from headway.routers import make_router
from headway.serve._config import BackendConfig
from headway.serve._dispatch import Backend, Dispatcher


def _req(i: int, hashes: tuple[int, ...]) -> Request:
    r = Request(request_id=f"r{i}", arrival_time=0.0, num_prompt_tokens=160, max_tokens=16)
    r.block_hashes = hashes
    return r


@pytest.mark.parametrize("router", ["cache-aware", "prefix-aware"])
def test_a_prefix_router_learns_where_a_request_went_when_only_one_backend_had_room(router: str) -> None:
    """With one backend with room the dispatcher skipped a router that needs no length estimate
    (nothing to choose), so cache-aware never indexed that request's blocks there and sent the next
    request with the same prefix wherever load said."""
    backends = [Backend(BackendConfig(f"http://127.0.0.1:{9 + i}", max_concurrency=1), i) for i in range(2)]
    dispatcher = Dispatcher(make_policy("fcfs"), backends, max_queue_len=10, router=make_router(router))
    shared = tuple(range(100, 110))

    async def run() -> tuple[int, int]:
        first = await dispatcher.submit(_req(0, (1, 2, 3)))  # both idle: the router's choice
        only = await dispatcher.submit(_req(1, shared))  # the other backend is full: one candidate
        return first.index, only.index

    first, only = asyncio.run(run())
    assert first != only
    index = dispatcher.router
    assert index.hit_tokens(_req(2, shared), only) == 159  # type: ignore[attr-defined]
    assert index.hit_tokens(_req(2, shared), first) == 0  # type: ignore[attr-defined]
