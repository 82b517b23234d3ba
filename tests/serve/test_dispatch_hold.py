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


def test_rescore_moves_a_queued_request_and_replaces_the_cached_score() -> None:
    async def main() -> tuple[list[str], list[str], str, float]:
        d = _dispatcher(hold=0.0)
        d.backends[0].in_flight = 1  # the one slot is taken: everything stays queued
        reqs = [_req(i, s) for i, s in enumerate((1.0, 2.0, 3.0))]
        for r in reqs:
            d.submit(r)
        before = [r.request_id for r in d.queue]
        d.rescore(reqs[2], 0.5)
        elsewhere = _req(9, 0.1)  # not queued (dispatched, or not submitted yet): only its score changes
        d.rescore(elsewhere, 0.2)
        await asyncio.sleep(0.01)
        after = [r.request_id for r in d.queue]
        d.backends[0].in_flight = 0
        d.dispatch()
        first = next(r.request_id for r in reqs if r not in d.queue)
        return before, after, first, d.policy.score_of(elsewhere)  # type: ignore[attr-defined]

    before, after, first, elsewhere = asyncio.run(main())
    assert before == ["r0", "r1", "r2"]
    assert after == ["r2", "r0", "r1"]
    assert first == "r2"
    assert elsewhere == 0.2
