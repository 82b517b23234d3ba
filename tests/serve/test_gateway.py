"""Gateway behaviour against the stub backend (real uvicorn servers on free ports)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core import Request, Tier, available_policies, make_policy
from headway.policies import FCFSPolicy
from headway.serve import BackendConfig, TenantConfig, free_port, hash_api_key, serve_in_thread

from .conftest import wait_until

COMPLETION = {"model": "m", "prompt": "hello there", "max_tokens": 5}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class RecordingPolicy(FCFSPolicy):
    def __init__(self) -> None:
        self.arrivals: list[str] = []
        self.progress: dict[str, int] = {}
        self.finished: dict[str, int] = {}

    def on_arrival(self, request: Request, now: float) -> None:
        self.arrivals.append(request.request_id)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        self.progress[request.request_id] = self.progress.get(request.request_id, 0) + num_new_tokens

    def on_finish(self, request: Request, now: float) -> None:
        self.finished[request.request_id] = request.num_output_tokens


def sse_events(resp: httpx.Response) -> list[str]:
    return [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]


# ------------------------------------------------------------------ pass-through
def test_non_streaming_completion_and_chat_feed_the_policy(make_stub, make_gateway):
    stub = make_stub()
    pol = RecordingPolicy()
    gw = make_gateway([stub.url], policy_obj=pol)
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == " tok" * 4
    first, second = pol.arrivals
    assert pol.finished == {first: 5, second: 4}
    assert pol.progress == {first: 5, second: 4}
    done = gw.gateway.finished_requests
    assert [r.state.name for r in done] == ["FINISHED", "FINISHED"]
    assert all(r.first_token_time is not None and r.finish_time is not None for r in done)


def test_request_ids_are_random_so_they_tell_a_tenant_nothing_about_other_traffic(make_stub, make_gateway):
    gw = make_gateway([make_stub().url])
    with gw.client() as c:
        ids = [c.post("/v1/completions", json=COMPLETION).headers["x-request-id"] for _ in range(4)]
    assert all(re.fullmatch(r"hw-[0-9a-f]{16}", rid) for rid in ids), ids
    assert len(set(ids)) == 4


def test_streaming_passes_events_through_and_counts_tokens(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.002)
    pol = RecordingPolicy()
    gw = make_gateway([stub.url], policy_obj=pol)
    with gw.client() as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 6, "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
        # the usage chunk the gateway asked for is not shown to a client that did not ask
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert len(chunks) == 6 and all(ch["choices"] for ch in chunks)
        with c.stream(
            "POST",
            "/v1/completions",
            json={**COMPLETION, "stream": True, "stream_options": {"include_usage": True}},
        ) as r:
            events = sse_events(r)
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 5
    first, second = pol.arrivals
    assert pol.progress == {first: 6, second: 5}
    assert pol.finished == {first: 6, second: 5}
    req = gw.gateway.finished_requests[0]
    assert req.first_token_time is not None and req.last_token_time is not None
    assert req.last_token_time > req.first_token_time  # tokens arrived one by one


def test_models_health_and_metrics(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url])
    with gw.client() as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "stub-model"
        assert c.get("/health").json()["status"] == "ok"
        c.post("/v1/completions", json=COMPLETION)
        c.post("/v1/completions", content=b"{nope")
        text = c.get("/metrics").text
    assert f'headway_dispatches_total{{backend="{stub.url}"}} 1.0' in text
    assert 'headway_rejections_total{reason="invalid",tenant="default",tier="standard"} 1.0' in text
    assert f'headway_backend_in_flight{{backend="{stub.url}"}} 0.0' in text
    assert "headway_queue_wait_seconds_count" in text


# ------------------------------------------------------------------- scheduling
def _fire(
    url: str,
    bodies: list[dict],
    headers: dict | None = None,
    delay: float = 0.03,
    after: Callable[[int], bool] | None = None,
) -> list[httpx.Response]:
    """POST ``bodies`` from threads, in order; after each, sleep ``delay`` or wait for ``after(i)``."""
    out: list[httpx.Response | None] = [None] * len(bodies)

    def go(i: int) -> None:
        out[i] = httpx.post(url + "/v1/completions", json=bodies[i], headers=headers, timeout=30)

    threads = []
    for i in range(len(bodies)):
        t = threading.Thread(target=go, args=(i,))
        t.start()
        threads.append(t)
        if after is not None:
            wait_until(lambda i=i: after(i), timeout=10, what=f"request {i} to settle")
        else:
            time.sleep(delay)  # arrival order = list order
    for t in threads:
        t.join(timeout=60)
    return [r for r in out if r is not None]


def test_queue_is_served_in_policy_order(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.02)  # the first request holds the backend ~3 s while the rest queue
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy="sjf-oracle")
    lengths = [150, 25, 3, 12, 6]  # the first occupies the backend; the rest queue
    bodies = [{"model": "m", "prompt": f"p{n}", "max_tokens": n} for n in lengths]
    d = gw.gateway.dispatcher
    rs = _fire(gw.url, bodies, after=lambda i: d.backends[0].in_flight == 1 and len(d.queue) == i)
    assert [r.status_code for r in rs] == [200] * 5
    assert stub.stub.stats.order == ["p150", "p3", "p6", "p12", "p25"]


@pytest.mark.parametrize("name", available_policies())
def test_every_registered_policy_serves(make_stub, make_gateway, name):
    stub = make_stub()
    # score-ranked policies (pars, ltr, ...) get their scores from the gateway's batch scorer
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=1)],
        policy=name,
        scorer="headway.serve._stub:prompt_length_scores",
    )
    rs = _fire(gw.url, [{"model": "m", "prompt": f"p{i}", "max_tokens": 2 + i} for i in range(3)], delay=0.0)
    assert [r.status_code for r in rs] == [200, 200, 200], [r.text for r in rs]


def test_least_loaded_backend_gets_the_request(make_stub, make_gateway):
    a, b = make_stub(token_delay_s=0.01), make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(a.url, max_concurrency=2), BackendConfig(b.url, max_concurrency=2)])
    rs = _fire(gw.url, [{**COMPLETION, "max_tokens": 60}] * 4, delay=0.0)
    assert all(r.status_code == 200 for r in rs)
    assert a.stub.stats.started == 2 and b.stub.stats.started == 2


def test_saturation_signal_from_backend_metrics(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.005, max_num_seqs=1)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=0, metrics_poll_s=0.02, max_waiting=0)])
    seen_waiting: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen_waiting.append(stub.stub.stats.waiting)
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    rs = _fire(gw.url, [{**COMPLETION, "max_tokens": 10}] * 4, delay=0.0)
    stop.set()
    w.join()
    assert all(r.status_code == 200 for r in rs)
    # the gateway held requests back instead of piling them into the engine's queue
    assert max(seen_waiting) <= 1


# ---------------------------------------------------------------------- tenants
def test_api_keys_map_to_tenant_and_tier(make_stub, make_gateway):
    stub = make_stub()
    pol = RecordingPolicy()
    tenants = (
        TenantConfig("acme", Tier.PREMIUM, (hash_api_key("sk-acme"),)),
        TenantConfig("bulk", Tier.BATCH, (hash_api_key("sk-bulk"),)),
    )
    gw = make_gateway([stub.url], policy_obj=pol, tenants=tenants)
    with gw.client() as c:
        for headers in ({}, {"Authorization": "Bearer sk-nope"}, {"Authorization": "Basic sk-acme"}):
            r = c.post("/v1/completions", json=COMPLETION, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            assert "acme" not in r.text and "bulk" not in r.text
        assert c.get("/v1/models").status_code == 401
        r = c.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer sk-bulk"})
        assert r.status_code == 200
        r = c.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer sk-acme"})
        assert r.status_code == 200
    done = gw.gateway.finished_requests
    assert [(q.tenant_id, q.tier) for q in done] == [("bulk", Tier.BATCH), ("acme", Tier.PREMIUM)]
    assert stub.stub.stats.started == 2  # nothing unauthenticated reached the backend


def test_queue_length_per_tenant_in_metrics(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("k1"),)),)
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=1)], tenants=tenants, admin_api_key_sha256=(hash_api_key("adm"),)
    )
    th = threading.Thread(
        target=_fire,
        args=(gw.url, [{**COMPLETION, "max_tokens": 100}] * 3, {"Authorization": "Bearer k1"}, 0.0),
    )
    th.start()
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 2, what="two queued")
    text = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer adm"}).text
    own = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer k1"}).text
    anonymous = httpx.get(gw.url + "/metrics")
    th.join()
    assert 'headway_queue_length{tenant="acme",tier="premium"} 2.0' in text
    assert f'headway_backend_in_flight{{backend="{stub.url}"}} 1.0' in text
    # a tenant's key sees its own series only; with keys required, no key sees nothing
    assert 'headway_queue_length{tenant="acme",tier="premium"} 2.0' in own and "backend" not in own
    assert anonymous.status_code == 401


def test_an_empty_queue_reads_0_not_no_series(make_stub, make_gateway):
    """headway_queue_length had a series only while a tenant had requests queued: idle, it vanished,
    so avg_over_time() counted only the busy moments, sum() of an idle gateway was no data (not 0)
    and an alert on it read nothing. A configured tenant reads 0 from the start, and every tenant
    and tier that queued reads 0 again once its queue is empty."""
    from prometheus_client.parser import text_string_to_metric_families

    def queued(text: str) -> dict[tuple[str, str], float]:
        return {
            (s.labels["tenant"], s.labels["tier"]): s.value
            for f in text_string_to_metric_families(text)
            if f.name == "headway_queue_length"
            for s in f.samples
        }

    stub = make_stub(token_delay_s=0.01)
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("k1"),)),
               TenantConfig("bulk", Tier.BATCH, (hash_api_key("k2"),)))  # fmt: skip
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=1)], tenants=tenants, admin_api_key_sha256=(hash_api_key("adm"),)
    )
    admin = {"Authorization": "Bearer adm"}
    assert queued(httpx.get(gw.url + "/metrics", headers=admin).text) == {("acme", "premium"): 0.0,
                                                                          ("bulk", "batch"): 0.0}  # fmt: skip
    _fire(gw.url, [{**COMPLETION, "max_tokens": 20}] * 3, {"Authorization": "Bearer k1"}, 0.0)
    wait_until(lambda: not gw.gateway.ledger.active, what="all answered")
    assert queued(httpx.get(gw.url + "/metrics", headers=admin).text) == {("acme", "premium"): 0.0,
                                                                          ("bulk", "batch"): 0.0}  # fmt: skip
    own = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer k2"}).text
    assert queued(own) == {("bulk", "batch"): 0.0}  # a tenant's own view, before it sent anything


def test_with_api_keys_off_the_queue_length_reads_0_when_idle(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)])
    assert 'headway_queue_length{tenant="default",tier="standard"} 0.0' in httpx.get(gw.url + "/metrics").text


# ------------------------------------------------------------------------ trouble
def test_client_disconnect_while_queued_leaves_the_queue(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)])
    blocker = threading.Thread(target=_fire, args=(gw.url, [{**COMPLETION, "max_tokens": 150}]))
    blocker.start()
    wait_until(lambda: gw.gateway.backends[0].in_flight == 1, what="blocker running")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=0.2)
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 0, what="queue emptied")
    blocker.join()
    assert stub.stub.stats.started == 1  # the abandoned request never reached the backend
    assert gw.gateway.finished_requests[0].state.name == "ABORTED"
    assert (
        'headway_rejections_total{reason="client_disconnected",tenant="default",tier="standard"} 1.0'
        in httpx.get(gw.url + "/metrics").text
    )


def test_a_client_that_leaves_once_it_has_read_done_was_served(servers, make_gateway):
    """A client that closes its connection as soon as it reads ``[DONE]`` (as SDKs do) got its whole
    answer: the request finished, however long the backend takes to close its end of the stream
    (it was counted as a client_disconnected abort, and not learned from, when the client left first)."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    usage = '{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}'

    async def completions(request: HttpRequest) -> StreamingResponse:
        await request.body()

        async def events():  # type: ignore[no-untyped-def]
            for _ in range(3):
                yield 'data: {"choices":[{"text":"t"}]}\n\n'
            yield f"data: {usage}\n\n"
            yield "data: [DONE]\n\n"
            await asyncio.sleep(3.0)  # the backend closes its end late

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    backend = servers.enter_context(serve_in_thread(app))
    gw = make_gateway([backend])
    body = {**COMPLETION, "stream": True}
    with httpx.Client(base_url=gw.url, timeout=10) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # and leave at once
    wait_until(lambda: gw.gateway.finished_requests, what="the request ended")
    (req,) = gw.gateway.finished_requests
    assert (req.state.name, req.num_output_tokens) == ("FINISHED", 3)
    assert "client_disconnected" not in httpx.get(gw.url + "/metrics").text


def test_client_disconnect_while_streaming_cancels_upstream(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([stub.url])
    body = {**COMPLETION, "max_tokens": 500, "stream": True}
    with httpx.Client(base_url=gw.url, timeout=10) as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert next(r.iter_lines()).startswith("data: ")
    wait_until(lambda: stub.stub.stats.aborted == 1, what="upstream aborted")
    wait_until(lambda: gw.gateway.backends[0].in_flight == 0, what="slot released")
    assert stub.stub.stats.completed == 0


def test_queue_full_gives_429_with_retry_after(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], max_queue_len=1, retry_after_s=3)
    th = threading.Thread(target=_fire, args=(gw.url, [{**COMPLETION, "max_tokens": 150}] * 2, None, 0.0))
    th.start()
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 1, what="one queued")
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION)
    th.join()
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["code"] == "queue_full"


def test_queue_ttl_gives_408(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], queue_ttl_s=0.3)
    first = gw.gateway.backends[0]
    rs = _fire(gw.url, [{**COMPLETION, "max_tokens": 100}, COMPLETION], after=lambda i: first.in_flight == 1)
    assert rs[0].status_code == 200
    assert rs[1].status_code == 408
    assert rs[1].json()["error"]["code"] == "queue_timeout"
    assert len(gw.gateway.dispatcher.queue) == 0


def test_backend_down_is_retried_on_another(make_stub, make_gateway):
    stub = make_stub()
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, max_concurrency=8), BackendConfig(stub.url, max_concurrency=1)])
    with gw.client() as c:
        for _ in range(3):
            r = c.post("/v1/completions", json=COMPLETION)
            assert r.status_code == 200
        with c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
            assert r.status_code == 200
            assert sse_events(r)[-1] == "[DONE]"


def test_backend_errors_retry_then_clear_502(make_stub, make_gateway):
    bad, good = make_stub(fail_status=500), make_stub()
    gw = make_gateway([BackendConfig(bad.url, max_concurrency=8), BackendConfig(good.url, max_concurrency=1)])
    with gw.client() as c:
        assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        good.config.fail_status = 503
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={**COMPLETION, "stream": True})
        assert r.status_code == 502
        assert time.monotonic() - t0 < 2
        assert "no backend could serve" in r.json()["error"]["message"]
        # a client error from the backend is passed through, not retried
        bad.config.fail_status = good.config.fail_status = 400
        r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 400
    assert all(b.in_flight == 0 for b in gw.gateway.backends)


def test_a_full_backend_s_503_sends_the_request_back_to_the_queue_not_to_502(make_stub, make_gateway):
    """vLLM's --max-num-queued-reqs answers 503 to a request arriving while that many are unfinished.
    The gateway, allowed 8 at a time there, meets it; with others of its requests running there,
    it takes the 503 as full, not failed: every request is served, none over the limit is open. The
    backend has room again as soon as one of them ends, not retry_after_s (60 s) later."""
    stub = make_stub(max_num_seqs=1, token_delay_s=0.01, max_num_queued_reqs=2)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=8)], retry_after_s=60)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            rs = await asyncio.gather(
                *[c.post("/v1/completions", json={**COMPLETION, "stream": i % 2 == 0}) for i in range(8)]
            )
        return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 8
    assert stub.stub.stats.rejected > 0 and stub.stub.stats.completed == 8
    assert stub.stub.stats.most_unfinished == 2
    text = httpx.get(gw.url + "/metrics").text
    assert re.search(r"headway_retries_total\{[^}]*\} [1-9]", text), text
    assert all(b.in_flight == 0 for b in gw.gateway.backends)


def test_any_503_while_others_run_there_is_full_but_alone_it_fails(make_stub, make_gateway):
    """A 503 that is not vLLM's admission control (a plain body) while another request of the
    gateway's runs on that backend: full, so the request waits for it and is served once the
    backend answers again; the same 503 with nothing else running there is a failure (502)."""
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=4)])
    long = threading.Thread(target=_fire, args=(gw.url, [{**COMPLETION, "max_tokens": 60}]))
    long.start()
    wait_until(lambda: stub.stub.stats.running == 1, what="the long request running")
    stub.config.fail_status = 503
    threading.Timer(0.2, lambda: setattr(stub.config, "fail_status", 0)).start()
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=30).status_code == 200
    long.join(timeout=30)
    stub.config.fail_status = 503
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=30).status_code == 502


def test_mid_stream_failure_ends_with_an_error_event(make_stub, make_gateway):
    stub = make_stub(fail_after_tokens=3)
    gw = make_gateway([stub.url])
    body = {**COMPLETION, "max_tokens": 10, "stream": True}
    with gw.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r)
    assert len(events) == 5  # 3 tokens, error, [DONE]
    assert "failed mid-stream" in json.loads(events[3])["error"]["message"]
    assert gw.gateway.finished_requests[0].state.name == "ABORTED"
    assert gw.gateway.backends[0].in_flight == 0


def test_body_limits_and_validation(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], max_body_bytes=1000)
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "prompt": "x" * 2000})
        assert r.status_code == 413
        r = c.post("/v1/completions", content=b"{not json")
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        cases = [
            ("/v1/completions", {"model": "m"}, "prompt"),
            ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
            ("/v1/completions", {**COMPLETION, "max_tokens": "5.5"}, "max_tokens"),  # ("5" is 5, as in vLLM)
            ("/v1/completions", {**COMPLETION, "stream": "maybe"}, "stream"),  # ("yes" is true)
            ("/v1/completions", {**COMPLETION, "model": 3}, "model"),
            ("/v1/chat/completions", {"model": "m", "messages": "x"}, "messages"),
            ("/v1/chat/completions", {"model": "m", "messages": [{"content": "x"}]}, "messages[0]"),
            (
                "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": 5}]},
                "messages[0].content",
            ),
        ]  # (each refused by vLLM 0.32 too: tests/serve/test_vllm_protocol.py)
        for path, body, field in cases:
            r = c.post(path, json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == field
            assert field.split("[")[0] in r.json()["error"]["message"]
        r = c.post("/v1/completions", json=[1, 2])
        assert r.status_code == 400
    assert stub.stub.stats.started == 0


def test_scorer_runs_batched_off_the_event_loop(make_stub, make_gateway, monkeypatch):
    import sys
    import types

    batches: list[int] = []
    threads: set[str] = set()

    def score(prompts: list[str]) -> list[float]:
        batches.append(len(prompts))
        threads.add(threading.current_thread().name)
        return [float(len(p)) for p in prompts]

    mod = types.ModuleType("hw_test_scorer")
    mod.score = score  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hw_test_scorer", mod)
    stub = make_stub()
    gw = make_gateway([stub.url], scorer="hw_test_scorer:score", scorer_max_wait_s=0.05)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            rs = await asyncio.gather(
                *[c.post("/v1/completions", json={**COMPLETION, "prompt": "x" * (i + 1)}) for i in range(8)]
            )
        return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 8
    assert sum(batches) == 8 and len(batches) < 8
    assert all(not name.startswith("uvicorn") for name in threads)
    wait_until(lambda: all(q.score is not None for q in gw.gateway.finished_requests), what="the scores")
    assert sorted(q.score for q in gw.gateway.finished_requests) == [float(i) for i in range(1, 9)]
    assert gw.gateway.dispatcher.scoring == 0  # every scored request was counted out
    assert "headway_score_wait_seconds_count 8.0" in httpx.get(gw.url + "/metrics").text


SYSTEM = {"role": "system", "content": "You are the shop's assistant. Follow the rules. " * 40}


@pytest.mark.parametrize(
    ("messages", "query"),
    [
        ([SYSTEM, {"role": "user", "content": "Name a color."}], "Name a color."),
        (
            [
                {"role": "user", "content": "Write an essay."},
                {"role": "assistant", "content": "Here is an essay: ..."},
                {"role": "user", "content": [{"type": "text", "text": "Shorter."}, {"type": "image_url"}]},
            ],
            "Shorter.\n",
        ),
        ([SYSTEM, {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}], "Hi."),
        ([SYSTEM], SYSTEM["content"]),  # no user message: every message, as before
        # a blank one: scored blank, as the plugin and the simulator score it (it was every message joined)
        ([SYSTEM, {"role": "user", "content": "  "}], "  "),
    ],
    ids=["system-prompt", "earlier-exchange-and-parts", "after-the-user-message", "no-user-message", "blank"],
)
def test_a_chat_request_is_scored_on_its_last_user_message(messages, query):
    """The predictor reads the message being answered; prefix hashing and the token estimate keep
    every message (benchmarks/results/predictor_chat_input.md: a shared system prompt gave every
    request the same score)."""
    from headway.serve._wire import validate_body

    parsed = validate_body({"model": "m", "messages": messages}, chat=True)
    assert parsed.query_text == query
    joined = "\n".join(
        m["content"] if isinstance(m["content"], str) else "\n".join(str(c.get("text", "")) for c in m["content"])
        for m in messages
    )
    assert parsed.prompt_text == joined
    completion = validate_body({"model": "m", "prompt": "Say hi."}, chat=False)
    assert completion.query_text == completion.prompt_text == "Say hi."
    assert validate_body({"model": "m", "prompt": [1, 2, 3]}, chat=False).query_text is None  # token ids


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        ({"messages": [SYSTEM, {"role": "user", "content": ""}]}, ""),
        ({"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": " "}]}]}, " "),
        ({"prompt": " \n "}, " \n "),
        ({"prompt": [101, 7592]}, None),
    ],
    ids=["empty-message", "blank-part", "blank-completion", "token-ids"],
)
def test_a_blank_prompt_is_scored_blank_and_token_ids_take_the_fallback(body, kept):
    """One prompt, one score whichever front end scores it: a blank last user message was scored as
    every message joined (a system prompt: -2.06 with the shipped predictor) and an empty one got the
    fallback score, where the plugin and the simulator score a blank prompt as the predictor does
    (-2.85). A prompt of token ids has no text here: without ``--tokenizer``, the fallback (with one:
    ``test_tokenizer.py``)."""
    from headway.serve import BackendConfig, GatewayConfig
    from headway.serve._intake import Intake
    from headway.serve._tenants import ANONYMOUS
    from headway.serve._wire import validate_body

    chat = "messages" in body
    body = {"model": "m", **body}
    intake = Intake(GatewayConfig(backends=(BackendConfig("http://b"),), scorer="m:f"), hash_prefixes=False)
    req = intake.new_request("r", 0.0, body, validate_body(body, chat), ANONYMOUS)
    assert req.prompt == kept


_TEXT = st.text(alphabet="ab \n", max_size=6)
_CONTENT = st.one_of(
    st.none(), _TEXT, st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
                                         st.just({"type": "image_url"})), max_size=3),
)  # fmt: skip
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]), "content": _CONTENT}
)


@given(messages=st.lists(_MESSAGE, min_size=1, max_size=6))
def test_the_scored_text_is_the_last_user_messages_or_every_messages(messages):
    """Whatever the messages, the scored text is the last user message's parts (blank or not), else
    (no user message) every message joined, and prefix hashing's text is every message joined."""
    from headway.serve._wire import validate_body

    parsed = validate_body({"model": "m", "messages": messages}, chat=True)

    def parts(m):
        c = m["content"]
        return [] if c is None else [c] if isinstance(c, str) else [str(x.get("text", "")) for x in c]

    assert parsed.prompt_text == "\n".join(p for m in messages for p in parts(m))
    users = [m for m in messages if m["role"] == "user"]
    last = parts(users[-1]) if users else []
    expected = "\n".join(last) if users else parsed.prompt_text
    assert parsed.query_text == expected


def test_the_gateway_scores_a_chat_request_on_its_last_user_message(make_stub, make_gateway, monkeypatch):
    import sys
    import types

    seen: list[str] = []

    def score(prompts: list[str]) -> list[float]:
        seen.extend(prompts)
        return [float(len(p)) for p in prompts]

    mod = types.ModuleType("hw_chat_scorer")
    mod.score = score  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hw_chat_scorer", mod)
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars", scorer="hw_chat_scorer:score")
    body = {**CHAT, "messages": [SYSTEM, {"role": "user", "content": "Name a color."}]}
    with gw.client() as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    wait_until(lambda: bool(seen), what="the prompt scored")
    assert seen == ["Name a color."]
    # an empty last user message is scored as the blank prompt it is (it got the fallback score)
    body = {**CHAT, "messages": [SYSTEM, {"role": "user", "content": ""}]}
    with gw.client() as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    wait_until(lambda: len(seen) == 2, what="the blank prompt scored")
    assert seen[1] == "" and gw.gateway.arrivals.num_score_fallbacks == 0


def test_scorer_in_a_worker_process_scores_and_stops_with_the_gateway(make_stub):
    import math
    import os

    from headway.serve import GatewayConfig, create_app, serve_in_thread

    stub = make_stub()
    config = GatewayConfig(
        backends=(BackendConfig(stub.url, max_concurrency=4),),
        scorer="headway.serve._stub:prompt_length_scores",
        scorer_process=True,
    )
    app = create_app(config)
    gateway = app.state.gateway
    pid = gateway.scorer._fn.pid
    assert pid is not None and pid != os.getpid()
    with serve_in_thread(app) as url:
        rs = _fire(url, [{**COMPLETION, "prompt": "x" * (i + 1)} for i in range(4)], delay=0.0)
        assert [r.status_code for r in rs] == [200] * 4
        # a request dispatched at once (nothing competed with it) is scored in the background
        wait_until(lambda: all(q.score is not None for q in gateway.finished_requests), what="the scores")
        assert sorted(q.score for q in gateway.finished_requests) == [math.log1p(i + 1) for i in range(4)]
    assert gateway.scorer._fn.pid is None  # shut down with the gateway
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


class RefusingPolicy(FCFSPolicy):
    def on_arrival(self, request: Request, now: float) -> None:
        raise ValueError(f"cannot rank request {request.request_id}")


def test_policy_error_is_a_clear_500(make_stub, make_gateway):
    # (a score-ranked policy without a scorer is refused at startup: test_config_cli)
    stub = make_stub()
    gw = make_gateway([stub.url], policy_obj=RefusingPolicy())
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION)
    assert r.status_code == 500
    assert re.fullmatch(r"scheduling policy error: cannot rank request hw-[0-9a-f]{16}", r.json()["error"]["message"])
    assert r.json()["error"]["code"] == "policy_error"
    assert stub.stub.stats.started == 0


class FailingPolicy(FCFSPolicy):
    def on_arrival(self, request: Request, now: float) -> None:
        raise KeyError("oops")  # a bug, not a refusal: its type is part of the message


def test_a_policy_s_error_other_than_a_refusal_names_its_type(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], policy_obj=FailingPolicy())
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "scheduling policy error: KeyError: 'oops'"


def test_policy_sees_requests_through_make_policy(make_stub, make_gateway):
    # any policy instance works; keys are read through the interface only
    stub = make_stub()
    gw = make_gateway([stub.url], policy_obj=make_policy("priority"))
    r = httpx.post(gw.url + "/v1/completions", json={**COMPLETION, "priority": 3})
    assert r.status_code == 200
    assert gw.gateway.finished_requests[0].priority == 3


# --------------------------------------------------------- limits and bad values
def _echo_backend(servers, received: list[dict]) -> str:
    """A backend that records each request body and answers a 1-token completion."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from headway.serve import serve_in_thread

    async def complete(request: HTTPRequest) -> Response:
        received.append(await request.json())
        return JSONResponse({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

    routes = [Route(p, complete, methods=["POST"]) for p in ("/v1/completions", "/v1/chat/completions")]
    return servers.enter_context(serve_in_thread(Starlette(routes=routes)))


def test_max_tokens_limit_caps_the_default_and_names_the_field_sent(servers, make_gateway):
    received: list[dict] = []
    gw = make_gateway([_echo_backend(servers, received)], max_tokens_limit=10, default_max_tokens=256)
    msgs = [{"role": "user", "content": "hi"}]
    with gw.client() as c:
        assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 200
        assert c.post("/v1/chat/completions", json={"messages": msgs}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": "x", "stream": True}).status_code != 400
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_completion_tokens": 20})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "max_completion_tokens"
        assert r.json()["error"]["message"] == "'max_completion_tokens' must be at most 10, got 20"
    assert [b["max_tokens"] for b in received] == [10, 10, 10]
    assert [q.max_tokens for q in gw.gateway.finished_requests[:2]] == [10, 10]


def test_absurd_max_tokens_are_refused(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url])
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "max_tokens": 10**30})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert f"at most {2**31 - 1}" in r.json()["error"]["message"]
        assert c.post("/v1/completions", json={**COMPLETION, "max_tokens": 2**31}).status_code == 400
    assert stub.stub.stats.started == 0


def test_error_codes_are_strings(make_stub, make_gateway):
    stub = make_stub(fail_status=503)
    gw = make_gateway([stub.url], retry_after_s=2)
    with gw.client() as c:
        codes = {
            "invalid_json": c.post("/v1/completions", content=b"{nope"),
            "invalid_value": c.post("/v1/completions", json={**COMPLETION, "n": 0}),
            "not_found": c.get("/nowhere"),
            "method_not_allowed": c.get("/v1/completions"),
            "upstream_error": c.post("/v1/completions", json=COMPLETION),
        }
        for code, r in codes.items():
            assert r.json()["error"]["code"] == code, (code, r.text)
        # the client is not told which backend failed
        assert stub.url.split("//")[1] not in codes["upstream_error"].text
        gw.gateway.draining = True
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
    assert r.headers["retry-after"] == "2"


def test_unauthenticated_side_endpoints_are_not_counted_as_rejected_requests(make_stub, make_gateway):
    stub = make_stub()
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("k1"),)),)
    gw = make_gateway([stub.url], tenants=tenants, admin_api_key_sha256=(hash_api_key("adm"),))
    with gw.client() as c:
        for path in ("/metrics", "/v1/models", "/v1/requests/hw-1"):
            assert c.get(path).status_code == 401
        assert c.post("/v1/completions", json=COMPLETION).status_code == 401
        text = c.get("/metrics", headers={"Authorization": "Bearer adm"}).text
    assert 'headway_rejections_total{reason="unauthorized",tenant="",tier=""} 1.0' in text


# ------------------------------------------------------------- dead and stalled backends
def test_no_reachable_backend_gives_503_and_health_degraded(make_gateway):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    gw = make_gateway([BackendConfig(u, max_concurrency=2) for u in dead], queue_ttl_s=1.0, backend_down_s=0.2)
    with gw.client() as c:
        assert c.get("/health").json()["status"] == "ok"  # not tried yet
        r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "no_backend" and "no backend is reachable" in err["message"]
        assert r.headers["retry-after"] == "1"
        assert all(u.split("//")[1] not in r.text for u in dead)
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "degraded" and h.json()["queued"] == 0
        text = c.get("/metrics").text
    assert 'headway_rejections_total{reason="no_backend",tenant="default",tier="standard"} 1.0' in text
    # every re-dispatch after a refused connection counts as a retry
    retries = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("headway_retries_total"))
    assert retries >= 2


def test_a_502_after_refused_connections_does_not_name_the_backend(make_gateway):
    """With backend_down_s 0 (or a refusal past the queue TTL) a refused connection ends in a 502
    that quoted the connect error, the backend's address with it."""
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, max_concurrency=2)], backend_down_s=0.0)
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
    assert "cannot connect" in r.text and dead.split("//")[1] not in r.text and dead.split(":")[-1] not in r.text


def test_health_is_ok_while_a_backend_is_reachable_and_again_once_one_is_back(servers, make_stub, make_gateway):
    from headway.serve import StubConfig, create_stub_app, serve_in_thread

    port = free_port()
    dead = f"http://127.0.0.1:{port}"
    stub = make_stub()
    gw = make_gateway([BackendConfig(dead, max_concurrency=8), BackendConfig(stub.url, max_concurrency=1)])
    with gw.client() as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        assert c.get("/health").json()["status"] == "ok"  # one backend is up
    gw = make_gateway([BackendConfig(dead, max_concurrency=8)], queue_ttl_s=0.5, backend_down_s=0.1)
    with gw.client() as c:
        assert c.post("/v1/completions", json=COMPLETION).status_code == 503
        assert c.get("/health").status_code == 503
        servers.enter_context(serve_in_thread(create_stub_app(StubConfig()), port))  # the backend comes back
        assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        assert c.get("/health").json()["status"] == "ok"


def test_stalled_backend_is_skipped_for_a_stream(make_stub, make_hole, make_gateway):
    hole, stub = make_hole(), make_stub()
    gw = make_gateway(
        [BackendConfig(hole, max_concurrency=8), BackendConfig(stub.url, max_concurrency=1)], headers_timeout_s=0.3
    )
    t0 = time.monotonic()
    with gw.client() as c, c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
        assert r.status_code == 200
        assert sse_events(r)[-1] == "[DONE]"
    assert time.monotonic() - t0 < 3
    assert stub.stub.stats.completed == 1


def test_stalled_only_backend_gives_a_quick_502(make_hole, make_gateway):
    hole = make_hole()
    gw = make_gateway([hole], headers_timeout_s=0.3)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json={**COMPLETION, "stream": True}, timeout=10)
    assert time.monotonic() - t0 < 3
    assert r.status_code == 502
    assert r.json()["error"]["message"] == "no backend could serve the request (last error: no response within 0.3 s)"
    assert hole.split("//")[1] not in r.text


def test_a_body_that_never_arrives_whole_is_a_408(make_stub, make_gateway):
    """A client that stalls while sending used to hold its connection (and a drain) for good."""
    import socket

    stub = make_stub()
    gw = make_gateway([stub.url], body_timeout_s=0.3)
    host, port = gw.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        t0 = time.monotonic()
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"prompt": '
        )  # 11 of 100 bytes, then nothing
        raw = b""
        while chunk := sock.recv(65536):  # until the gateway closes the connection (Connection: close)
            raw += chunk
        answer = raw.decode()
    assert time.monotonic() - t0 < 3
    assert answer.startswith("HTTP/1.1 408") and '"code":"body_timeout"' in answer.replace(" ", "")
    assert stub.stub.stats.started == 0
    assert (
        'headway_rejections_total{reason="body_timeout",tenant="default",tier="standard"} 1.0'
        in httpx.get(gw.url + "/metrics").text
    )


def test_a_request_that_every_backend_drops_ends_after_max_attempts(make_raw_backend, make_gateway):
    """A backend that reads the request and drops the connection (crashing on it, say) used to get
    it again and again until the queue TTL: such drops count as attempts now."""
    url, seen = make_raw_backend("drop")
    gw = make_gateway([url], backend_down_s=0.05, queue_ttl_s=30)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=30)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert len(seen) == 3 and time.monotonic() - t0 < 5  # max_attempts, not until the TTL
    assert gw.gateway.backends[0].reachable  # it accepts connections: not "no backend is reachable"


@pytest.mark.parametrize("behaviour", ["close-after-headers", "hang-after-headers"])
def test_a_stream_that_fails_before_its_first_event_goes_to_another_backend(
    make_raw_backend, make_stub, make_gateway, behaviour
):
    """Nothing was streamed, so it is retried, as the spec says; a stalled stream within headers_timeout_s."""
    (bad, seen), stub = make_raw_backend(behaviour), make_stub()
    gw = make_gateway([BackendConfig(bad, max_concurrency=8), BackendConfig(stub.url, max_concurrency=1)],
                      headers_timeout_s=0.5)  # fmt: skip
    t0 = time.monotonic()
    for _ in range(2):
        with gw.client() as c, c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
            assert r.status_code == 200
            events = sse_events(r)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events)
    assert time.monotonic() - t0 < 5
    assert stub.stub.stats.completed == 2 and len(seen) >= 1


# ----------------------------------------------------------------- SSE variants
def _sse_backend(servers, sep: bytes, prefix: bytes, split: bool = False) -> str:
    """A backend streaming 3 tokens, the usage chunk and [DONE] with its own SSE framing;
    ``split``: every event in two chunks, cut inside the separator."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from headway.serve import serve_in_thread

    async def complete(request: HTTPRequest) -> Response:
        body = await request.json()
        n = body["max_tokens"]
        events = [{"id": "x", "choices": [{"index": 0, "text": " t", "finish_reason": None}]}] * n
        events.append({"id": "x", "choices": [], "usage": {"completion_tokens": n}})

        async def gen():  # type: ignore[no-untyped-def]
            for e in [*[json.dumps(e).encode() for e in events], b"[DONE]"]:
                event = prefix + e + sep
                if split:
                    cut = len(event) - len(sep) + 1
                    yield event[:cut]
                    await asyncio.sleep(0.005)
                    yield event[cut:]
                else:
                    yield event

        return StreamingResponse(gen(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])
    return servers.enter_context(serve_in_thread(app))


@pytest.mark.parametrize(
    ("sep", "prefix", "split"),
    [
        (b"\n\n", b"data:", False),
        (b"\r\n\r\n", b"data: ", False),
        (b"\r\n\r\n", b"data:", True),
        (b"\r\r", b"data:", True),
    ],
)
def test_sse_framing_variants_are_understood(servers, make_gateway, sep, prefix, split):
    pol = RecordingPolicy()
    gw = make_gateway([_sse_backend(servers, sep, prefix, split)], policy_obj=pol)
    body = {**COMPLETION, "max_tokens": 3, "stream": True}
    with gw.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        text = r.read().decode()
    events = [e for e in text.replace("\r\n", "\n").replace("\r", "\n").split("\n\n") if e]
    assert len(events) == 4 and events[-1].endswith("[DONE]")  # 3 tokens and [DONE]: no usage, no error
    assert "error" not in text and "usage" not in text
    done = gw.gateway.finished_requests[0]
    assert done.state.name == "FINISHED" and done.num_output_tokens == 3
    assert pol.progress == {pol.arrivals[0]: 3}


def test_sse_helpers():
    from headway.serve._wire import sse_data, sse_newlines

    assert sse_newlines(b"data: a\r\n\r\ndata: b\r") == (b"data: a\n\ndata: b", b"\r")
    assert sse_newlines(b"\r\n") == (b"\n", b"")
    assert sse_data(b"data:x\n\n") == b"x"
    assert sse_data(b"id: 3\nevent: m\ndata:  two spaces\n\n") == b" two spaces"
    assert sse_data(b": comment\ndata: a\ndata\ndata: b\n\n") == b"a\n\nb"
    assert sse_data(b"event: ping\n\n") == b""


# ---------------------------------------------------------------------- cancel
def test_cancelling_a_stream_ends_it_at_once_even_while_the_backend_is_silent(make_raw_backend, make_gateway):
    url, _ = make_raw_backend("hang-after-event")  # one token, then silence
    gw = make_gateway([url])
    t0 = time.monotonic()
    with gw.client() as c, c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
        rid = r.headers["x-request-id"]  # the 200 comes with the first event
        assert c.delete(f"/v1/requests/{rid}").status_code == 200
        events = sse_events(r)
    assert time.monotonic() - t0 < 3
    err = json.loads(events[-2])["error"]
    assert (err["type"], err["code"]) == ("cancelled", "cancelled") and events[-1] == "[DONE]"
    assert len(events) == 3  # the token, the error, [DONE]
    wait_until(lambda: gw.gateway.backends[0].in_flight == 0, what="the slot released")
    text = httpx.get(gw.url + "/metrics").text
    assert 'headway_rejections_total{reason="cancelled",tenant="default",tier="standard"} 1.0' in text
    assert "client_disconnected" not in text


def test_backend_silent_mid_stream_ends_it_after_the_read_timeout(make_raw_backend, make_gateway):
    url, _ = make_raw_backend("hang-after-event")  # one token, then silence
    gw = make_gateway([url], read_timeout_s=0.3)
    t0 = time.monotonic()
    with gw.client() as c, c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
        events = sse_events(r)
    assert time.monotonic() - t0 < 3
    err = json.loads(events[-2])["error"]
    assert err["message"] == "the backend failed mid-stream: no data from the backend for 0.3 s"
    assert err["code"] == "upstream_error" and events[-1] == "[DONE]"


def test_backend_silent_after_its_headers_is_a_stall_then_a_clear_502(make_stub, make_gateway):
    stub = make_stub(first_token_delay_s=5.0)  # headers at once, then silence: nothing streamed yet
    gw = make_gateway([stub.url], read_timeout_s=0.3)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json={**COMPLETION, "stream": True}, timeout=10)
    assert time.monotonic() - t0 < 3
    assert r.status_code == 502 and r.json()["error"]["message"] == (
        "no backend could serve the request (last error: the stream stalled before its first event "
        "(no data from the backend for 0.3 s))"
    )


# ------------------------------------------------------------- driftsched behind the gateway
def _fixed_backend(servers, body: dict) -> str:
    """A backend that answers every completion with ``body`` (e.g. one without ``usage``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from headway.serve import serve_in_thread

    async def complete(request: HTTPRequest) -> Response:
        return JSONResponse(body)

    return servers.enter_context(serve_in_thread(Starlette(routes=[Route("/v1/completions", complete,
                                                                           methods=["POST"])])))  # fmt: skip


@pytest.mark.parametrize("usage", [None, {}, {"completion_tokens": None}, {"completion_tokens": "many"}])
def test_answer_without_usage_is_no_observation_of_zero_tokens(servers, make_gateway, usage):
    body = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "hello " * 50}]}
    if usage is not None:
        body["usage"] = usage
    pol = make_policy("tenant-sjf")
    gw = make_gateway([_fixed_backend(servers, body)], policy_obj=pol)
    with gw.client() as c:
        for _ in range(5):
            r = c.post("/v1/completions", json={"prompt": "What is the capital of France?", "max_tokens": 200})
            assert r.status_code == 200, r.text
    assert pol.estimator.b_runtime["short_qa"] == 1.0  # it used to fall toward 0.1 (0 tokens seen)
    done = gw.gateway.finished_requests
    assert len(done) == 5 and not any(q.output_tokens_known for q in done)
    # on_finish still runs (policies clean up): a recording policy sees every finish
    rec = RecordingPolicy()
    gw2 = make_gateway([_fixed_backend(servers, body)], policy_obj=rec)
    r = httpx.post(gw2.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    assert r.status_code == 200 and list(rec.finished) == [r.headers["x-request-id"]]


def test_answer_with_usage_still_teaches_driftsched(servers, make_gateway):
    body = {"choices": [{"index": 0, "text": "x"}], "usage": {"completion_tokens": 640}}
    pol = make_policy("tenant-sjf")
    gw = make_gateway([_fixed_backend(servers, body)], policy_obj=pol)
    with gw.client() as c:
        r = c.post("/v1/completions", json={"prompt": "What is the capital of France?", "max_tokens": 700})
        assert r.status_code == 200, r.text
    assert pol.estimator.b_runtime["short_qa"] > 1.5
    assert gw.gateway.finished_requests[0].output_tokens_known


def test_tenant_weighted_list_weights_from_a_config(make_stub, make_gateway):
    from headway.serve._config_load import config_from_dict
    from headway.serve._gateway import create_app

    stub = make_stub()
    gw = make_gateway([stub.url], policy="tenant-weighted", policy_args={"weights": [5, 3, 2]})
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION).status_code == 200
    assert gw.gateway.policy.weights == {Tier.PREMIUM: 5.0, Tier.STANDARD: 3.0, Tier.BATCH: 2.0}
    data = {"backends": [{"url": "http://127.0.0.1:1"}], "policy": "tenant-weighted"}
    create_app(config_from_dict({**data, "policy_args": {"weights": [1, 1, 1]}}))
    with pytest.raises(ValueError, match=r"weights\[batch\] must be a number, got 'two'"):
        create_app(config_from_dict({**data, "policy_args": {"weights": [5, 3, "two"]}}))


def test_priority_is_bounded_and_named(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], policy_obj=make_policy("priority"))
    with gw.client() as c:
        for ok in (2**53, -(2**53), 0):
            assert c.post("/v1/completions", json={**COMPLETION, "priority": ok}).status_code == 200
        huge = (10**400, "an integer of 401 digits")
        for bad, shown in ((2**53 + 1, str(2**53 + 1)), (-(2**60), str(-(2**60))), huge):
            r = c.post("/v1/completions", json={**COMPLETION, "priority": bad})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "priority" and err["code"] == "invalid_value"
            assert err["message"] == f"'priority' must be between -{2**53} and {2**53}, got {shown}"
    assert stub.stub.stats.started == 3


def test_driftsched_learned_bias_is_on_the_admins_metrics(make_stub, make_gateway):
    """B_runtime, which every tenant-* policy learns from finished requests, was nowhere to be
    seen: /metrics has it per category (the admin's view; a tenant's key does not see it)."""
    stub = make_stub()
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("k1"),)),)
    gw = make_gateway([stub.url], policy="tenant-fifo", tenants=tenants, admin_api_key_sha256=(hash_api_key("adm"),))
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200
        admin = c.get("/metrics", headers={"Authorization": "Bearer adm"}).text
        tenant = c.get("/metrics", headers={"Authorization": "Bearer k1"}).text
    learned = gw.gateway.policy.estimator.b_runtime
    assert learned["short_qa"] < 1.0  # 5 tokens where 64 x F_input were expected
    for category, value in learned.items():
        assert f'headway_driftsched_runtime_bias{{category="{category}"}} {value!r}' in admin
    assert "headway_driftsched_runtime_bias" not in tenant
    plain = make_gateway([stub.url])  # no DriftSched policy: no such series
    with plain.client() as c:
        assert "headway_driftsched_runtime_bias" not in c.get("/metrics").text


def test_rejections_are_labelled_with_the_tenant_they_refused(make_stub, make_gateway):
    """headway_rejections_total had only a reason: an operator could not tell which tenant got the
    429s, and a tenant's key saw none of its own."""
    stub = make_stub(token_delay_s=0.01)
    tenants = (
        TenantConfig("acme", Tier.PREMIUM, (hash_api_key("k1"),)),
        TenantConfig("beta", Tier.BATCH, (hash_api_key("k2"),)),
    )
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=1)],
        tenants=tenants,
        max_queue_per_tenant=1,
        admin_api_key_sha256=(hash_api_key("adm"),),
    )
    acme = {"Authorization": "Bearer k1"}
    th = threading.Thread(target=_fire, args=(gw.url, [{**COMPLETION, "max_tokens": 150}] * 2, acme, 0.0))
    th.start()
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 1, what="one of acme's queued")
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, headers=acme).status_code == 429
    assert (
        httpx.post(gw.url + "/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer no"}).status_code
        == 401
    )
    th.join()
    admin = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer adm"}).text
    assert 'headway_rejections_total{reason="queue_full",tenant="acme",tier="premium"} 1.0' in admin
    assert 'headway_rejections_total{reason="unauthorized",tenant="",tier=""} 1.0' in admin  # no tenant known
    own = httpx.get(gw.url + "/metrics", headers=acme).text
    assert 'headway_rejections_total{reason="queue_full",tenant="acme",tier="premium"} 1.0' in own
    assert "headway_rejections_total" not in httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer k2"}).text


def test_a_password_in_a_backend_url_is_not_in_metrics_nor_the_startup_line(make_stub, make_gateway):
    """A backend URL may carry basic-auth credentials (``http://user:pw@host``: the upstream client
    sends them); its ``backend`` label in /metrics (unauthenticated with API keys off, then kept by
    Prometheus and shown by Grafana) and the effective configuration showed the password."""
    from headway.serve._config_load import describe_config

    stub = make_stub()
    host = stub.url.split("://", 1)[1]
    gw = make_gateway([BackendConfig(f"http://ops:s3cret@{host}", max_concurrency=2)])
    with gw.client() as c:
        assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    text = httpx.get(gw.url + "/metrics").text
    assert "s3cret" not in text
    assert f'headway_dispatches_total{{backend="http://ops:***@{host}"}} 1.0' in text
    assert describe_config(gw.gateway.config)["backends"][0]["url"] == f"http://ops:***@{host}"
    from headway.serve._config import redact_url

    assert redact_url("https://u:p%40ss@h:1/x") == "https://u:***@h:1/x"
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("http://h:8000") == "http://h:8000"


def test_a_password_in_a_backend_url_is_not_in_the_log(make_stub, make_gateway, caplog):
    """The log lines about a backend (a request failed on it, its /metrics unreadable) named it by its
    URL, password included, where /metrics and the startup line already hid it."""
    import logging

    caplog.set_level(logging.INFO, logger="headway")
    refusing, polled = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    host = make_stub().url.split("://", 1)[1]
    gw = make_gateway([BackendConfig(f"http://ops:s3cret@{refusing}", max_concurrency=1),
                       BackendConfig(f"http://ops:s3cret@{polled}", metrics_poll_s=0.1),
                       BackendConfig(f"http://ops:s3cret@{host}", max_concurrency=4)])  # fmt: skip
    with gw.client() as c:
        for _ in range(3):  # (one goes to the refusing backend first, and is served by another)
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        wait_until(lambda: any(polled in r.getMessage() for r in caplog.records))
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"failed on http://ops:***@{refusing}" in m for m in lines), lines
    assert any(f"http://ops:***@{polled}: unreachable" in m for m in lines), lines
    assert not [m for m in lines if "s3cret" in m]
