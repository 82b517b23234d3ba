"""The dispatcher's score hold: free backends wait while more requests are being scored than queued."""

from __future__ import annotations

import asyncio

from headway.core import Request, make_policy
from headway.serve._config import BackendConfig
from headway.serve._dispatch import Backend, Dispatcher


def _req(i: int, score: float) -> Request:
    return Request(request_id=f"r{i}", arrival_time=0.0, num_prompt_tokens=8, max_tokens=16, score=score)


def _dispatcher(hold: float, slots: int = 1) -> Dispatcher:
    backend = Backend(BackendConfig("http://127.0.0.1:9", max_concurrency=slots), 0)
    return Dispatcher(make_policy("pars"), [backend], max_queue_len=100, score_hold_s=hold)


def test_holds_while_more_are_scored_than_queued_then_takes_the_best() -> None:
    async def main() -> list[str]:
        d = _dispatcher(hold=5.0)
        d.scoring = 3  # three requests still being scored
        first = d.submit(_req(0, 9.0))  # scored first, but long
        await asyncio.sleep(0.01)
        assert not first.done()  # 3 being scored > 1 queued: the free backend waits

        for i, score in ((1, 5.0), (2, 1.0), (3, 7.0)):  # the rest land, as a scored batch does
            d.scoring -= 1
            d.submit(_req(i, score))
        await asyncio.sleep(0.01)
        for r, (fut, _) in list(d._waiters.items()):
            assert not fut.done(), r.request_id
        order = [r.request_id for r in d.queue]
        return order

    # one slot: r2 (score 1) got it; the others wait in score order
    assert asyncio.run(main()) == ["r1", "r3", "r0"]


def test_no_hold_once_as_many_are_queued_as_are_being_scored() -> None:
    async def main() -> bool:
        d = _dispatcher(hold=5.0)
        d.scoring = 1
        d.submit(_req(0, 9.0))
        fut = d.submit(_req(1, 3.0))
        await asyncio.sleep(0.01)
        return fut.done()

    assert asyncio.run(main())


def test_a_hold_ends_after_score_hold_s_and_zero_never_holds() -> None:
    async def main(hold: float) -> tuple[bool, bool]:
        d = _dispatcher(hold=hold)
        d.scoring = 5  # a scorer that never answers
        fut = d.submit(_req(0, 1.0))
        await asyncio.sleep(0.01)
        early = fut.done()
        await asyncio.sleep(0.1)
        return early, fut.done()

    assert asyncio.run(main(0.05)) == (False, True)
    assert asyncio.run(main(0.0)) == (True, True)
