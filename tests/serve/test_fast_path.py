"""The scorer's fast path: a request nothing competes with is dispatched before its score is known.

Dispatch decisions are exact (Dispatcher.dispatch_unscored, a property over the counts); the
gateway tests use a scorer held shut by a gate, so that "before its score" is certain, not timed.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core import Request, RequestState, make_policy
from headway.policies.pars import PARSPolicy
from headway.serve import BackendConfig, GatewayConfig, create_app
from headway.serve._dispatch import Backend, Dispatcher

from .conftest import wait_until


def _req(i: int, score: float | None = None) -> Request:
    return Request(request_id=f"r{i}", arrival_time=0.0, num_prompt_tokens=8, max_tokens=16, score=score)


class _Recording(PARSPolicy):
    """PARS that records each hook call with the score the request had then."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, float | None]] = []

    def on_arrival(self, request: Request, now: float) -> None:
        self.events.append(("arrival", request.request_id, request.score))
        super().on_arrival(request, now)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        self.events.append(("progress", request.request_id, float(num_new_tokens)))

    def on_finish(self, request: Request, now: float) -> None:
        self.events.append(("finish", request.request_id, request.score))


# ------------------------------------------------------------------ the decision
def test_dispatch_unscored_takes_a_lone_request_and_leaves_the_policy_untold() -> None:
    async def main() -> None:
        pol = _Recording()
        d = Dispatcher(pol, [Backend(BackendConfig("http://127.0.0.1:9", max_concurrency=2), 0)], max_queue_len=10)
        req = _req(0)
        backend = d.dispatch_unscored(req)
        assert backend is d.backends[0] and backend.in_flight == 1
        assert req.state is RequestState.RUNNING and req.seq == 0 and req.first_scheduled_time is not None
        assert pol.events == []  # told once the score is known (the gateway's Arrivals)

    asyncio.run(main())


@given(
    limit=st.integers(0, 4),
    in_flight=st.integers(0, 4),
    scoring=st.integers(0, 5),
    arriving=st.integers(0, 5),
    queued=st.integers(0, 2),
    down=st.booleans(),
    polled=st.booleans(),
)
def test_dispatch_unscored_exactly_when_every_competitor_would_get_a_slot(
    limit: int, in_flight: int, scoring: int, arriving: int, queued: int, down: bool, polled: bool
) -> None:
    in_flight = min(in_flight, limit) if limit else in_flight
    polled = polled or not limit  # a backend needs one bound or the other

    async def main() -> bool:
        config = BackendConfig("http://127.0.0.1:9", max_concurrency=limit, metrics_poll_s=0.5 if polled else 0.0)
        backend = Backend(config, 0)
        backend.in_flight = in_flight
        d = Dispatcher(make_policy("pars"), [backend], max_queue_len=100)
        if down:
            d.mark_down(backend, 60.0)
        for i in range(queued):  # waiting for a backend excluded, say: the order matters again
            d.queue.add(_req(100 + i, 1.0), 0.0)
        d.scoring, d.arriving = scoring, arriving
        return d.dispatch_unscored(_req(0)) is not None

    taken = asyncio.run(main())
    if down:
        free = 0.0
    else:
        free = float(limit - in_flight) if limit else float("inf")
        free = min(free, 1.0) if polled else free
    assert taken == (not queued and free > scoring + arriving)


# ------------------------------------------------------------------ the gateway
class _Gate:
    """A scorer that scores ``"p<n>"`` as n, once the gate opens (from the test's thread)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls: list[list[str]] = []

    def score(self, prompts: list[str]) -> list[float]:
        self.calls.append(list(prompts))
        assert self.open.wait(10.0), "the gate never opened"
        return [float(p[1:]) for p in prompts]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Gate]:
    g = _Gate()
    mod = types.ModuleType("hw_gate_scorer")
    mod.score = g.score  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hw_gate_scorer", mod)
    yield g
    g.open.set()  # never leave a scoring thread waiting


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _post(url: str, prompt: str, out: dict[str, httpx.Response]) -> Callable[[], None]:
    def send() -> None:
        out[prompt] = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3})

    return send


def test_a_lone_request_is_answered_before_its_score_then_scored_and_told(make_stub, make_gateway, gate):
    stub = make_stub()
    pol = _Recording()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy_obj=pol, scorer="hw_gate_scorer:score")
    r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "p7", "max_tokens": 3}, timeout=5)
    assert r.status_code == 200  # the gate is still shut: the request did not wait for its score
    wait_until(lambda: gate.calls == [["p7"]], what="scoring to start")  # in the background, held shut
    (req,) = gw.gateway.finished_requests
    assert req.score is None and pol.events == []
    assert _metric(gw.url, "headway_unscored_dispatches_total") == 1.0
    gate.open.set()
    wait_until(lambda: len(pol.events) == 3, what="the policy to be told")
    rid = req.request_id
    assert req.score == 7.0
    assert pol.events == [("arrival", rid, 7.0), ("progress", rid, 3.0), ("finish", rid, 7.0)]
    assert _metric(gw.url, "headway_score_wait_seconds_count") == 1.0
    assert gw.gateway.dispatcher.scoring == 0 and gw.gateway.num_score_fallbacks == 0


def test_without_the_fast_path_a_lone_request_waits_for_its_score(make_stub, make_gateway, gate):
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], scorer="hw_gate_scorer:score",
                      scorer_fast_path=False)  # fmt: skip
    out: dict[str, httpx.Response] = {}
    t = threading.Thread(target=_post(gw.url, "p7", out))
    t.start()
    wait_until(lambda: gate.calls == [["p7"]], what="scoring to start")
    time.sleep(0.2)
    assert stub.stub.stats.started == 0 and not out
    gate.open.set()
    t.join(5)
    assert out["p7"].status_code == 200 and gw.gateway.finished_requests[0].score == 7.0
    assert _metric(gw.url, "headway_unscored_dispatches_total") == 0.0


def test_a_burst_while_the_slot_is_busy_is_served_in_score_order(make_stub, make_gateway, gate):
    stub = make_stub(token_delay_s=0.05)  # "p9" holds the only slot 2 s (40 tokens)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy="pars", scorer="hw_gate_scorer:score")
    out: dict[str, httpx.Response] = {}
    first = threading.Thread(
        target=lambda: out.setdefault(
            "p9", httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "p9", "max_tokens": 40})
        )
    )
    first.start()
    wait_until(lambda: stub.stub.stats.started == 1, what="the first request to start")  # fast path
    threads = [threading.Thread(target=_post(gw.url, f"p{n}", out)) for n in (5, 2, 8, 3)]
    for t in threads:
        t.start()
    wait_until(lambda: gw.gateway.dispatcher.scoring == 4, what="the burst to be scored")
    gate.open.set()
    for t in [first, *threads]:
        t.join(10)
    assert sorted(r.status_code for r in out.values()) == [200] * 5
    assert stub.stub.stats.order == ["p9", "p2", "p3", "p5", "p8"]
    assert _metric(gw.url, "headway_unscored_dispatches_total") == 1.0


def test_a_burst_arriving_together_at_an_idle_gateway_is_served_in_score_order(make_stub, gate):
    stub = make_stub()
    config = GatewayConfig(
        backends=(BackendConfig(stub.url, max_concurrency=1),), policy="pars", scorer="hw_gate_scorer:score"
    )
    app = create_app(config)
    gateway = app.state.gateway

    async def main() -> list[int]:
        await gateway.startup()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=10) as c:
                sends = [
                    asyncio.ensure_future(c.post("/v1/completions", json={"model": "m", "prompt": f"p{n}"}))
                    for n in (6, 4, 9, 1, 7)
                ]  # all in the same turn of the event loop: one slot, five competitors
                for _ in range(500):
                    if gateway.dispatcher.scoring == 5:
                        break
                    await asyncio.sleep(0.01)
                assert stub.stub.stats.started == 0
                gate.open.set()
                return [r.status_code for r in await asyncio.gather(*sends)]
        finally:
            await gateway.shutdown()

    assert asyncio.run(main()) == [200] * 5
    assert stub.stub.stats.order == ["p1", "p4", "p6", "p7", "p9"]
    assert gateway.metrics.registry.get_sample_value("headway_unscored_dispatches_total") == 0.0


def test_a_retry_of_a_request_dispatched_before_its_score_is_queued_with_it(make_stub, make_gateway, gate):
    bad, good = make_stub(fail_status=500), make_stub()
    pol = _Recording()
    gw = make_gateway(
        [BackendConfig(bad.url, max_concurrency=1), BackendConfig(good.url, max_concurrency=1)],
        policy_obj=pol,
        scorer="hw_gate_scorer:score",
    )  # the least-outstanding router sends the first request to the first backend
    out: dict[str, httpx.Response] = {}
    t = threading.Thread(target=_post(gw.url, "p4", out))
    t.start()
    wait_until(lambda: gate.calls == [["p4"]], what="scoring to start")
    time.sleep(0.2)
    assert not out and good.stub.stats.started == 0  # the retry waits for the score
    gate.open.set()
    t.join(5)
    assert out["p4"].status_code == 200 and good.stub.stats.started == 1
    (req,) = gw.gateway.finished_requests
    rid = req.request_id
    assert pol.events[0] == ("arrival", rid, 4.0) and pol.events[-1] == ("finish", rid, 4.0)


def test_a_stream_dispatched_before_its_score_tells_the_policy_its_tokens_after_the_arrival(
    make_stub, make_gateway, gate
):
    stub = make_stub()
    pol = _Recording()  # it has on_progress: the gateway reports streamed tokens one by one
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy_obj=pol, scorer="hw_gate_scorer:score")
    body = {"model": "m", "prompt": "p3", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=5) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "data: [DONE]" and len(events) == 5
    wait_until(lambda: gate.calls == [["p3"]], what="scoring to start")
    assert pol.events == []  # four tokens and the finish, held back until the policy knows of it
    gate.open.set()
    wait_until(lambda: len(pol.events) == 3, what="the policy to be told")
    rid = gw.gateway.finished_requests[0].request_id
    assert pol.events == [("arrival", rid, 3.0), ("progress", rid, 4.0), ("finish", rid, 3.0)]


def test_a_request_that_ends_before_its_score_lands_is_never_reported_to_the_policy(make_stub, make_gateway, gate):
    stub = make_stub(token_delay_s=0.2)
    pol = _Recording()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy_obj=pol, scorer="hw_gate_scorer:score")
    body = {"model": "m", "prompt": "p5", "max_tokens": 50, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=5) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))  # then the client goes away
    done = gw.gateway.finished_requests
    wait_until(lambda: len(done) == 1 and done[0].state is RequestState.ABORTED, what="the abort")
    gate.open.set()
    wait_until(lambda: done[0].score == 5.0, what="the score")  # still recorded
    wait_until(lambda: not gw.gateway.arrivals._unscored, what="the background scoring to end")
    assert pol.events == []  # never told of its arrival, so never of its end either
