"""A backend's 5xx: which the gateway retries and which it passes on as vLLM sent it; and the log of
full backends and limited warnings, which counts what it does not write one by one."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from headway.serve import BackendConfig
from headway.serve._logging import LimitedWarnings

from .test_gateway import COMPLETION
from .test_gateway_midstream import _event

BUG = "'list' object has no attribute 'get'"
"""vLLM 0.32's 500 for ``"structured_outputs": []`` (``check_structured_outputs_count`` calls ``.get`` on
it; ``create_error_response`` maps the ``AttributeError`` to a 500 ``InternalServerError``)."""
DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
"""vLLM's ``EngineDeadError`` (a 500 too, after which its server exits)."""


def _failed(*stubs) -> list[int]:
    return [s.stub.stats.failed for s in stubs]


@pytest.mark.parametrize("status", [500, 501])
def test_a_body_every_backend_fails_on_alike_ends_with_the_backends_answer(make_stub, make_gateway, status):
    stubs = [make_stub(fail_status=status, fail_message=BUG) for _ in range(3)]
    gw = make_gateway([s.url for s in stubs], max_attempts=3)
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    error = {"message": BUG, "type": "InternalServerError" if status == 500 else "NotImplementedError"}
    assert r.status_code == status and r.json() == {"error": {**error, "param": None, "code": status}}, r.text
    assert r.headers["content-type"] == "application/json"
    assert sum(_failed(*stubs)) == 2  # a second backend said the same: not a third try
    assert all(b.in_flight == 0 for b in gw.gateway.backends)
    assert f'headway_rejections_total{{reason="backend_{status}"' in httpx.get(gw.url + "/metrics").text
    # the one backend there is: its answer at once
    only = make_stub(fail_status=status, fail_message=BUG)
    gw = make_gateway([only.url], max_attempts=3)
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert r.status_code == status and r.json()["error"]["message"] == BUG and _failed(only) == [1]


def test_a_500_another_backend_serves_is_retried(make_stub, make_gateway):
    # (vLLM's GenerationError, a request's finish_reason "error", may pass on another backend)
    bad, good = make_stub(fail_status=500, fail_message="Internal server error"), make_stub()
    gw = make_gateway([BackendConfig(bad.url, max_concurrency=8), BackendConfig(good.url, max_concurrency=8)])
    with gw.client() as c:
        for _ in range(6):
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    assert bad.stub.stats.failed > 0 and good.stub.stats.completed == 6


def test_different_5xx_answers_and_503s_still_end_in_a_502(make_stub, make_gateway):
    one, two = make_stub(fail_status=500, fail_message="a"), make_stub(fail_status=500, fail_message="b")
    gw = make_gateway([one.url, two.url])
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
    assert _failed(one, two) == [1, 1]
    # an overloaded or unavailable backend's 503 (vLLM's RetryableRequestError) is the backend's, not
    # the request's: retried on each backend, then the gateway's 502
    busy = [make_stub(fail_status=503, fail_message="Request failed; please retry") for _ in range(3)]
    gw = make_gateway([s.url for s in busy], max_attempts=3)
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 502 and _failed(*busy) == [1, 1, 1], r.text


def test_a_dead_engine_s_500_is_retried_and_its_backend_skipped(make_stub, make_gateway):
    dead, good = make_stub(fail_status=500, fail_message=DEAD), make_stub()
    gw = make_gateway([dead.url, good.url], backend_down_s=30)
    with gw.client() as c:
        for _ in range(4):
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    assert _failed(dead) == [1]  # marked down at its first 500: not tried again
    # alone, it is never passed on as the request's answer: each try waits for the backend again
    dead = make_stub(fail_status=500, fail_message=DEAD)
    gw = make_gateway([dead.url], backend_down_s=0.05, max_attempts=2)
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 502 and _failed(dead) == [2], r.text


def test_a_streams_first_server_error_event_alike_everywhere_is_relayed(make_raw_backend, make_gateway):
    error = {"error": {"message": BUG, "type": "InternalServerError", "param": None, "code": 500}}
    answer = _event(error) + b"data: [DONE]\n\n"
    backends = [make_raw_backend("end", answer) for _ in range(3)]
    gw = make_gateway([url for url, _ in backends], max_attempts=3)
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "stream": True})
    # as vLLM sent it: its 200, the error event, [DONE]
    assert r.status_code == 200 and r.text == answer.decode(), r.text
    assert sum(len(seen) for _, seen in backends) == 2
    # a dead engine's event is not the request's failure, even from the last backend to try
    dead = {"error": {**error["error"], "message": DEAD}}
    url, seen = make_raw_backend("end", _event(dead) + b"data: [DONE]\n\n")
    gw = make_gateway([url], max_attempts=1)
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error" and seen == [1], r.text


# ---------------------------------------------------------------------------------- the log
def test_a_full_backend_s_503s_are_logged_as_failures_are_every_one_counted(make_stub, make_gateway, caplog):
    stub = make_stub(max_num_seqs=1, token_delay_s=0.01, max_num_queued_reqs=2)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=8)], retry_after_s=60)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            rs = await asyncio.gather(*[c.post("/v1/completions", json=COMPLETION) for _ in range(16)])
        return [r.status_code for r in rs]

    with caplog.at_level(logging.INFO, logger="headway.serve"):
        assert asyncio.run(burst()) == [200] * 16
        gw.gateway.exchange.full.flush()
    lines = [r.getMessage() for r in caplog.records if r.name == "headway.serve" and "full" in r.getMessage()]
    assert stub.stub.stats.rejected >= 3  # (enough to tell one line a request from a few)
    assert len(lines) <= 3, lines  # the first in full, then a summary at most every 5 s
    logged = 1 + sum(int(line.split(": full: ")[1].rstrip(")")) for line in lines[1:])
    assert logged == stub.stub.stats.rejected, lines
    retries = httpx.get(gw.url + "/metrics").text.split("headway_retries_total{")[1].split("\n")[0]
    assert float(retries.rsplit(" ", 1)[1]) == stub.stub.stats.rejected


def test_limited_warnings_left_out_reach_the_log(caplog):
    log = logging.getLogger("test.limited")
    warn = LimitedWarnings(log, every_s=0.1)

    async def quiet_after_a_burst() -> None:
        for i in range(5):
            warn("redis", "redis down (%d)", i)
        await asyncio.sleep(0.5)  # no more of that kind: its timer writes the latest left out
        warn("redis", "redis down (%d)", 5)

    with caplog.at_level(logging.WARNING, logger="test.limited"):
        asyncio.run(quiet_after_a_burst())
        assert [r.getMessage() for r in caplog.records] == [
            "redis down (0)",
            "redis down (4) (3 more like it not logged)",
            "redis down (5)",
        ]
        caplog.clear()
        warn("score", "cannot score %s", "a")  # (no event loop: no timer)
        warn("score", "cannot score %s", "b")
        warn("score", "cannot score %s", "c")
        assert [r.getMessage() for r in caplog.records] == ["cannot score a"]
        warn.flush()  # (at shutdown)
        assert [r.getMessage() for r in caplog.records][1:] == ["cannot score c (1 more like it not logged)"]
        warn.flush()
        assert len(caplog.records) == 2


def test_the_gateway_writes_its_warnings_left_out_at_shutdown(make_stub, make_gateway, servers, caplog):
    gw = make_gateway([make_stub().url])
    with caplog.at_level(logging.WARNING, logger="headway.serve"):
        for i in range(3):
            gw.gateway._log_limited("auth", "redis-%d: answered 503", i)
        servers.close()  # the gateway shuts down
    lines = [r.getMessage() for r in caplog.records if r.name == "headway.serve"]
    assert lines[0] == "redis-0: answered 503" and "redis-2: answered 503 (1 more like it not logged)" in lines


def test_the_stub_answers_a_failure_as_vllm_does(make_stub):
    stub = make_stub(fail_status=400, fail_message="bad")
    r = httpx.post(stub.url + "/v1/completions", json=COMPLETION)
    assert r.status_code == 400 and json.loads(r.text) == {
        "error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    }
