"""What an operator sees while a backend is down, and the limits and metrics around it: the
``/metrics`` poller's failures count for ``/health`` and ``no_backend``, ``max_tokens_limit``
caps a request that gives no ``max_tokens``, and the queue-wait, dispatch and latency metrics
tell what happened (real uvicorn servers on free ports)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from headway.serve import BackendConfig, StubConfig, create_stub_app, free_port, serve_in_thread

from .conftest import wait_until

COMPLETION = {"model": "m", "prompt": "hello there", "max_tokens": 5}


def _sample(gw, name: str, **labels: str) -> float:
    """A sample of the gateway's metrics (0 when the series does not exist)."""
    return gw.gateway.metrics.registry.get_sample_value(name, labels) or 0.0


def _total(gw, name: str) -> float:
    """The sum of ``name`` over all its label values."""
    return sum(s.value for family in gw.gateway.metrics.registry.collect() for s in family.samples if s.name == name)


def _post_in_thread(url: str, body: dict, out: list[httpx.Response]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(httpx.post(url + "/v1/completions", json=body, timeout=30)))
    t.start()
    return t


# ----------------------------------------------------------- reachability from the /metrics poller
def test_health_is_degraded_while_the_polled_backend_cannot_be_reached_with_no_request_sent(
    servers, make_gateway, caplog
):
    caplog.set_level("INFO", logger="headway.serve")
    port = free_port()
    gw = make_gateway([BackendConfig(f"http://127.0.0.1:{port}", metrics_poll_s=0.05)])
    with gw.client() as c:
        wait_until(lambda: c.get("/health").status_code == 503, what="/health to say degraded")
        h = c.get("/health").json()
        assert h["status"] == "degraded" and h["reason"] == "no backend reachable"
        up = f'headway_backend_up{{backend="http://127.0.0.1:{port}"}}'
        assert f"{up} 0.0" in c.get("/metrics").text
        servers.enter_context(serve_in_thread(create_stub_app(StubConfig()), port))  # it comes up
        wait_until(lambda: c.get("/health").status_code == 200, what="/health to be ok again")
        assert c.get("/health").json()["status"] == "ok"
        assert f"{up} 1.0" in c.get("/metrics").text
        # a gateway started before its backend: the first answer is not "again"
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backend http")]
        assert f"backend http://127.0.0.1:{port}: reachable" in said
        assert not [m for m in said if "reachable again" in m]


def test_a_backend_without_polling_counts_as_reachable_until_a_request_fails_there(make_gateway):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, max_concurrency=2)])
    time.sleep(0.3)
    assert httpx.get(gw.url + "/health").json()["status"] == "ok"  # not tried yet: as before
    assert gw.gateway.backends[0].config.metrics_poll_s == 0


def test_requests_queued_while_the_polled_backend_is_down_wait_for_it_and_are_served(servers, make_gateway):
    port = free_port()
    gw = make_gateway(
        [BackendConfig(f"http://127.0.0.1:{port}", metrics_poll_s=0.05)], queue_ttl_s=20.0, backend_down_s=0.2
    )
    wait_until(lambda: not gw.gateway.backends[0].reachable, what="the poller to find the backend down")
    out: list[httpx.Response] = []
    threads = [_post_in_thread(gw.url, {**COMPLETION, "prompt": f"p{i}"}, out) for i in range(3)]
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 3, what="three queued")
    time.sleep(0.5)
    # they wait in the queue: nothing is sent to the closed port meanwhile
    assert len(gw.gateway.dispatcher.queue) == 3
    assert _total(gw, "headway_retries_total") == 0
    servers.enter_context(serve_in_thread(create_stub_app(StubConfig()), port))  # the backend comes back
    for t in threads:
        t.join(30)
    assert [r.status_code for r in out] == [200, 200, 200]
    assert gw.gateway.backends[0].reachable
    # each recorded its real wait (over half a second), once
    assert _sample(gw, "headway_queue_wait_seconds_count", tenant="default", tier="standard") == 3
    assert _sample(gw, "headway_queue_wait_seconds_sum", tenant="default", tier="standard") > 3 * 0.5


def test_a_request_queued_while_the_polled_backend_never_comes_back_is_a_503_no_backend(make_gateway):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, metrics_poll_s=0.05)], queue_ttl_s=1.0, backend_down_s=0.2)
    wait_until(lambda: not gw.gateway.backends[0].reachable, what="the poller to find the backend down")
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "no_backend"
    assert time.monotonic() - t0 >= 0.9
    assert _sample(gw, "headway_rejections_total", reason="no_backend", tenant="default", tier="standard") == 1
    # it left the queue without a dispatch: its wait is the time it spent there, not ~0
    assert _sample(gw, "headway_queue_wait_seconds_count", tenant="default", tier="standard") == 1
    assert _sample(gw, "headway_queue_wait_seconds_sum", tenant="default", tier="standard") >= 0.9
    assert _total(gw, "headway_dispatches_total") == 0


def test_a_backend_whose_metrics_tell_no_load_takes_no_requests(make_stub, make_gateway, caplog):
    """A wrong URL (here a path under a live server: its /metrics a 404) is not taken to be an idle
    backend: requests go to the backend whose load is known, none is answered a 404."""
    good, other = make_stub(), make_stub()
    wrong = other.url + "/wrong"
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway(
        [BackendConfig(wrong, metrics_poll_s=0.05), BackendConfig(good.url, metrics_poll_s=0.05)],
        router="round-robin",
    )
    wait_until(lambda: f"backend {wrong}" in caplog.text, what="the poller to read no load there")
    with gw.client() as c:
        codes = [c.post("/v1/completions", json={**COMPLETION, "prompt": f"p{i}"}).status_code for i in range(4)]
        assert c.get("/health").json()["status"] == "ok"
    assert codes == [200] * 4
    assert _sample(gw, "headway_dispatches_total", backend=wrong) == 0
    assert _sample(gw, "headway_dispatches_total", backend=good.url) == 4
    assert _sample(gw, "headway_backend_up", backend=good.url) == 1
    assert _sample(gw, "headway_backend_up", backend=wrong) == 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"backend {wrong}: takes no requests" in errors[0] and "HTTP 404" in errors[0]


def test_a_gateway_whose_only_backend_tells_no_load_is_degraded_and_answers_no_backend(make_stub, make_gateway, caplog):
    wrong = make_stub().url + "/wrong"
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(wrong, metrics_poll_s=0.05)], queue_ttl_s=0.5)
    wait_until(lambda: f"backend {wrong}" in caplog.text, what="the poller to read no load there")
    with gw.client() as c:
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend", r.text
    assert _total(gw, "headway_dispatches_total") == 0


def test_an_openai_server_without_load_metrics_is_still_sent_requests(make_gateway, servers, caplog):
    """A server that lists its models but has no vLLM or SGLang gauges on /metrics (SGLang without
    --enable-metrics) is a backend, not a wrong URL: it is sent requests, as its max_concurrency
    allows, with one warning that nothing tells how busy it is."""
    app = create_stub_app(StubConfig())
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", "") != "/metrics"]
    url = servers.enter_context(serve_in_thread(app))
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(url, metrics_poll_s=0.05, max_concurrency=2)])
    wait_until(lambda: "cannot read its load" in caplog.text, what="the poller to find no load there")
    with gw.client() as c:
        assert [c.post("/v1/completions", json=COMPLETION).status_code for _ in range(3)] == [200] * 3
        assert c.get("/health").json()["status"] == "ok"
    assert _sample(gw, "headway_backend_up", backend=url) == 1
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    warned = [r.getMessage() for r in caplog.records if "cannot read its load" in r.getMessage()]
    assert len(warned) == 1 and "up to its max_concurrency 2" in warned[0] and "HTTP 404" in warned[0]


# ------------------------------------------------------------------------------- metrics
def test_a_refused_connection_is_no_dispatch(make_stub, make_gateway):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, max_concurrency=2)], queue_ttl_s=1.0, backend_down_s=0.2)
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"
    assert _total(gw, "headway_retries_total") >= 2  # tried several times ...
    assert _sample(gw, "headway_dispatches_total", backend=dead) == 0  # ... but nothing was sent
    # next to a live backend: each request is one dispatch, where it went
    stub = make_stub()
    gw = make_gateway([BackendConfig(dead, max_concurrency=8), BackendConfig(stub.url, max_concurrency=1)])
    with gw.client() as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    assert _sample(gw, "headway_dispatches_total", backend=dead) == 0
    assert _sample(gw, "headway_dispatches_total", backend=stub.url) == 3


def test_a_client_that_leaves_the_queue_records_its_wait(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.02)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], queue_ttl_s=0.4)
    out: list[httpx.Response] = []
    first = _post_in_thread(gw.url, {**COMPLETION, "max_tokens": 60}, out)
    wait_until(lambda: gw.gateway.backends[0].in_flight == 1, what="one running")
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
    first.join(30)
    assert r.status_code == 408
    labels = {"tenant": "default", "tier": "standard"}
    assert _sample(gw, "headway_queue_wait_seconds_count", **labels) == 2
    assert _sample(gw, "headway_queue_wait_seconds_sum", **labels) >= 0.35


@pytest.mark.parametrize("stream", [False, True])
def test_latency_of_a_request_without_model_is_labelled_with_the_model_that_answered(make_stub, make_gateway, stream):
    stub = make_stub(model="served-default")
    gw = make_gateway([stub.url])
    with gw.client() as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": stream})
        assert r.status_code == 200
        r = c.post("/v1/completions", json={"model": "asked", "prompt": "x", "max_tokens": 3, "stream": stream})
        assert r.status_code == 200
    anyone = {"priority": "0", "tenant": "default", "tier": "standard"}
    assert _sample(gw, "headway_e2e_request_latency_seconds_count", model="served-default", **anyone) == 1
    assert _sample(gw, "headway_e2e_request_latency_seconds_count", model="asked", **anyone) == 1
    assert _sample(gw, "headway_e2e_request_latency_seconds_count", model="", **anyone) == 0
    if stream:
        assert _sample(gw, "headway_time_to_first_token_seconds_count", model="served-default", **anyone) == 1
    # the request's own (absent) model still keys online learning, as it keyed its scoring
    assert all(q.extra["model"] in ("", "asked") for q in gw.gateway.finished_requests)


# ------------------------------------------------------------------------- max_tokens_limit
def test_max_tokens_limit_caps_a_request_that_gives_no_max_tokens(make_stub, make_gateway):
    # the backend's own default is far larger than the limit (vLLM: the rest of the context)
    stub = make_stub(default_max_tokens=2000)
    gw = make_gateway([stub.url], max_tokens_limit=512)
    msgs = [{"role": "user", "content": "hi"}]
    with gw.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": msgs, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 512
        r = c.post("/v1/completions", json={"prompt": "x", "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 512
        with c.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: {")]
        assert len(events) == 512
        # what the client asks for, within the limit, goes as it came
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_completion_tokens": 7})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 9})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 600})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    # the limit is a cap, not a length estimate: the queue still assumes assumed_output_tokens
    assert [q.max_tokens for q in gw.gateway.finished_requests[:3]] == [256, 256, 256]


def test_the_body_sent_gets_the_limit_only_when_it_names_no_length(servers, make_gateway):
    from .test_gateway import _echo_backend

    received: list[dict] = []
    gw = make_gateway([_echo_backend(servers, received)], max_tokens_limit=100)
    msgs = [{"role": "user", "content": "hi"}]
    with gw.client() as c:
        for path, body in [
            ("/v1/chat/completions", {"messages": msgs, "max_tokens": None}),
            ("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 5}),
            ("/v1/completions", {"prompt": "x", "max_tokens": 6}),
        ]:
            assert c.post(path, json=body).status_code == 200
    assert received[0]["max_tokens"] == 100
    assert received[1] == {"messages": msgs, "max_completion_tokens": 5}  # as sent: no max_tokens added
    assert received[2] == {"prompt": "x", "max_tokens": 6}
    # no limit, no default: sent as it came
    received.clear()
    gw = make_gateway([_echo_backend(servers, received)])
    assert httpx.post(gw.url + "/v1/completions", json={"prompt": "x"}).status_code == 200
    assert received == [{"prompt": "x"}]


def test_a_poll_that_gets_no_answer_neither_blocks_nor_unblocks_a_backend(caplog):
    """Only an answer says what is at a URL: a poll that timed out left a blocked wrong URL usable
    again ("its /v1/models answer now"), and told a backend whose load had been read, and stands,
    that it was sent requests "as if idle"."""
    from headway.serve._dispatch import Backend
    from headway.serve._gateway import Gateway

    caplog.set_level("INFO", logger="headway.serve")
    timeout = httpx.ReadTimeout("timed out")
    wrong = Backend(BackendConfig("http://127.0.0.1:1/wrong", metrics_poll_s=1.0), 0, load_unreadable=True)
    Gateway._poll_failed(wrong, timeout, answered=False)
    assert wrong.load_unreadable and not wrong.usable
    read = Backend(BackendConfig("http://127.0.0.1:1", metrics_poll_s=1.0), 1, load_read=True, models=("m",))
    Gateway._poll_failed(read, httpx.ReadTimeout("timed out"), answered=True)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [  # the plain line for each: nothing answered, nothing learned
        "backend http://127.0.0.1:1/wrong: cannot read its /metrics (timed out)",
        "backend http://127.0.0.1:1: cannot read its /metrics (timed out)",
    ]
