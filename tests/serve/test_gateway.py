"""Gateway behaviour against the stub backend (real uvicorn servers on free ports)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from headway.core import Request, Tier, available_policies, make_policy
from headway.policies import FCFSPolicy
from headway.serve import BackendConfig, TenantConfig, free_port, hash_api_key

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
    assert pol.arrivals == ["hw-1", "hw-2"]
    assert pol.finished == {"hw-1": 5, "hw-2": 4}
    assert pol.progress == {"hw-1": 5, "hw-2": 4}
    done = gw.gateway.finished_requests
    assert [r.state.name for r in done] == ["FINISHED", "FINISHED"]
    assert all(r.first_token_time is not None and r.finish_time is not None for r in done)


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
    assert pol.progress == {"hw-1": 6, "hw-2": 5}
    assert pol.finished == {"hw-1": 6, "hw-2": 5}
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
    assert 'headway_rejections_total{reason="invalid"} 1.0' in text
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
    assert 'headway_rejections_total{reason="client_disconnected"} 1.0' in httpx.get(gw.url + "/metrics").text


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
            ("/v1/completions", {**COMPLETION, "max_tokens": "5"}, "max_tokens"),
            ("/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),
            ("/v1/completions", {**COMPLETION, "model": 3}, "model"),
            ("/v1/chat/completions", {"model": "m", "messages": []}, "messages"),
            ("/v1/chat/completions", {"model": "m", "messages": [{"content": "x"}]}, "messages[0]"),
        ]
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
    assert sorted(q.score for q in gw.gateway.finished_requests) == [float(i) for i in range(1, 9)]
    assert gw.gateway.dispatcher.scoring == 0  # every scored request was counted out
    assert "headway_score_wait_seconds_count 8.0" in httpx.get(gw.url + "/metrics").text


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
        assert sorted(q.score for q in gateway.finished_requests) == [math.log1p(i + 1) for i in range(4)]
    assert gateway.scorer._fn.pid is None  # shut down with the gateway
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_policy_error_is_a_clear_500(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars")  # no scorer configured: pars cannot rank
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION)
    assert r.status_code == 500
    assert "has no score" in r.json()["error"]["message"]
    assert stub.stub.stats.started == 0


def test_policy_sees_requests_through_make_policy(make_stub, make_gateway):
    # any policy instance works; keys are read through the interface only
    stub = make_stub()
    gw = make_gateway([stub.url], policy_obj=make_policy("priority"))
    r = httpx.post(gw.url + "/v1/completions", json={**COMPLETION, "priority": 3})
    assert r.status_code == 200
    assert gw.gateway.finished_requests[0].priority == 3
