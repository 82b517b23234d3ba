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


def test_dispatch_looks_past_requests_for_a_busy_model_but_only_so_far() -> None:
    """Queued requests for a model whose backend is full do not hold up another model's request
    behind them, as long as it is within LOOK_PAST of the head (each dispatch's cost stays bounded)."""
    from headway.serve._dispatch import LOOK_PAST

    backends = [Backend(BackendConfig(f"http://127.0.0.1:{9 + i}", max_concurrency=1), i) for i in range(2)]
    backends[0].models, backends[1].models = ("llama",), ("qwen",)
    dispatcher = Dispatcher(make_policy("fcfs"), backends, max_queue_len=10_000)

    def req(i: int, model: str) -> Request:
        r = Request(request_id=f"{model}{i}", arrival_time=float(i), num_prompt_tokens=8, max_tokens=8)
        r.extra["model"] = model
        return r

    async def run(depth: int) -> bool:
        """Whether a qwen request queued behind ``depth`` llama ones (their backend busy) goes at once."""
        first = dispatcher.submit(req(0, "llama"), dispatcher.not_serving("llama"))
        waiting = [dispatcher.submit(req(i, "llama"), dispatcher.not_serving("llama")) for i in range(1, depth + 1)]
        qwen = dispatcher.submit(req(depth + 1, "qwen"), dispatcher.not_serving("qwen"))
        await asyncio.sleep(0)
        went = qwen.done()
        dispatcher.fail_all(RuntimeError("end"))
        for fut in (first, *waiting, qwen):
            if fut.done() and fut.exception() is None:
                dispatcher.release(fut.result())
        return went

    assert asyncio.run(run(3))
    assert asyncio.run(run(LOOK_PAST))
    assert not asyncio.run(run(LOOK_PAST + 1))  # past the bound it waits for the head
