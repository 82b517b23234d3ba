"""Backends serving different models (``headway.serve._models``): each request goes to a backend
that lists its model, a model none lists goes to any backend, ``/v1/models`` lists them all, and the
fleet's models are logged when they differ."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from headway.serve import BackendConfig, StubConfig, create_stub_app, serve_in_thread

from .conftest import wait_until


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "different models" in r.getMessage()]


def _fleet(make_stub, make_gateway, **kw):
    """A gateway over a llama backend (slow tokens, one request at a time) and a qwen one, both
    polled, once both their model lists are read."""
    llama, qwen = make_stub(model="llama", token_delay_s=0.02), make_stub(model="qwen")
    gw = make_gateway([BackendConfig(llama.url, max_concurrency=1, metrics_poll_s=0.05),
                       BackendConfig(qwen.url, max_concurrency=4, metrics_poll_s=0.05)], **kw)  # fmt: skip
    wait_until(lambda: all(b.models is not None for b in gw.gateway.backends), what="both model lists")
    return gw


def test_backends_serving_different_models_are_named_in_one_line(make_stub, make_gateway, caplog):
    a, b = make_stub(model="llama"), make_stub(model="qwen")
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(a.url, metrics_poll_s=0.05), BackendConfig(b.url, metrics_poll_s=0.05)])
    wait_until(lambda: _lines(caplog), what="the line")
    time.sleep(0.3)  # later polls say it no more
    (line,) = _lines(caplog)
    assert f"{a.url}: llama" in line and f"{b.url}: qwen" in line
    assert "each request goes to one that lists its model" in line
    assert [bk.models for bk in gw.gateway.backends] == [("llama",), ("qwen",)]


def test_backends_serving_the_same_model_get_no_line(make_stub, make_gateway, caplog):
    a, b = make_stub(model="llama"), make_stub(model="llama")
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(a.url, metrics_poll_s=0.05), BackendConfig(b.url, metrics_poll_s=0.05)])
    wait_until(lambda: all(bk.models == ("llama",) for bk in gw.gateway.backends), what="both read")
    time.sleep(0.2)
    assert _lines(caplog) == []


@pytest.mark.parametrize("stream", [False, True])
def test_each_request_goes_to_a_backend_that_lists_its_model(make_stub, make_gateway, stream):
    gw = _fleet(make_stub, make_gateway)
    with gw.client() as c:
        for model in ["llama", "qwen"] * 3:
            body = {"model": model, "prompt": "x", "max_tokens": 2, "stream": stream}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200
            # the stub names its own model in its answer: the one that served it
            assert f'"model":"{model}"' in r.text.replace(" ", ""), r.text
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})  # no model: any backend
        assert r.status_code == 200
        listed = [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert listed == ["llama", "qwen"]


def test_the_fast_path_skips_a_model_only_some_backends_serve(make_stub, make_gateway):
    """Free slots counted over the whole fleet may not be a model's: such a request is scored and
    queued; one without a model still takes the fast path."""
    gw = _fleet(make_stub, make_gateway, policy="pars", scorer="headway.serve._stub:prompt_length_scores")
    fast = "headway_unscored_dispatches_total"
    with gw.client() as c:
        for model in ("qwen", "llama"):
            r = c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == model
        assert gw.gateway.metrics.registry.get_sample_value(fast) == 0.0
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    assert gw.gateway.metrics.registry.get_sample_value(fast) == 1.0


def test_a_model_no_backend_lists_goes_to_any_backend_which_answers_it(make_stub, make_gateway):
    """As with one model: a server that takes any name answers it (the stub does), vLLM its 404."""
    gw = _fleet(make_stub, make_gateway)
    with gw.client() as c:
        body = {"model": "mistral", "prompt": "x", "max_tokens": 2}
        answers = [c.post("/v1/completions", json=body) for _ in range(4)]
    assert [r.status_code for r in answers] == [200] * 4
    assert {r.json()["model"] for r in answers} <= {"llama", "qwen"}


def test_a_busy_model_does_not_hold_up_another_model_s_requests(make_stub, make_gateway):
    """The llama backend takes one request at a time: llama requests queue, and a qwen request that
    arrives behind them goes to the idle qwen backend at once (not after them, head of the line)."""
    gw = _fleet(make_stub, make_gateway, policy="fcfs")
    done: dict[str, float] = {}

    def send(name: str, model: str, max_tokens: int) -> None:
        body = {"model": model, "prompt": "x", "max_tokens": max_tokens}
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=30).status_code == 200
        done[name] = time.monotonic()

    threads = [threading.Thread(target=send, args=(f"llama{i}", "llama", 25)) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: len(gw.gateway.dispatcher.queue) == 2, what="two llama requests queued")
    qwen = threading.Thread(target=send, args=("qwen", "qwen", 2))
    qwen.start()
    for t in [*threads, qwen]:
        t.join(30)
    assert done["qwen"] < sorted(done[f"llama{i}"] for i in range(3))[1]  # before the second llama


def test_the_shared_queue_routes_by_model_too(redis_url, make_stub, make_gateway):
    gw = _fleet(make_stub, make_gateway, redis_url=redis_url, redis_prefix=f"m{uuid.uuid4().hex[:6]}:")
    with gw.client() as c:
        for model in ["qwen", "llama"] * 2:
            r = c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == model


def test_health_names_a_model_no_reachable_backend_serves(make_stub, make_gateway):
    """A multi-model fleet with one model's backend gone stays ok for the other model; /health
    names the model that cannot be served (for an operator; not a reason to pull the gateway)."""
    llama = make_stub(model="llama")
    with serve_in_thread(create_stub_app(StubConfig(model="qwen"))) as qwen_url:
        gw = make_gateway([BackendConfig(llama.url, metrics_poll_s=0.05), BackendConfig(qwen_url, metrics_poll_s=0.05)],
                          backend_down_s=0.2)  # fmt: skip
        wait_until(lambda: all(b.models is not None for b in gw.gateway.backends), what="both model lists")
        assert httpx.get(gw.url + "/health").json() == {"status": "ok", "queued": 0}
    wait_until(lambda: not gw.gateway.backends[1].reachable, what="the qwen backend to be found gone")
    health = httpx.get(gw.url + "/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "queued": 0, "models_unavailable": ["qwen"]}


def test_backends_not_polled_have_their_models_read_too(make_stub, make_gateway):
    """``--backend-concurrency`` alone (no ``/metrics`` polling): requests still go where their
    model is served, none to a backend that would answer it a 404."""
    llama, qwen = make_stub(model="llama"), make_stub(model="qwen")
    gw = make_gateway([BackendConfig(llama.url, max_concurrency=2), BackendConfig(qwen.url, max_concurrency=2)])
    assert all(b.config.metrics_poll_s == 0 for b in gw.gateway.backends)
    wait_until(lambda: [b.models for b in gw.gateway.backends] == [("llama",), ("qwen",)], what="both model lists")
    with gw.client() as c:
        for model in ["llama", "qwen"] * 3:
            r = c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == model


def test_a_model_whose_backends_are_all_down_is_a_503_no_backend_at_the_queue_ttl(make_stub, make_gateway):
    """Another model's backend is up (``/health`` ok), but none that serves this one is: the
    queued request ends as when no backend is reachable, a 503 with Retry-After, not a 408."""
    qwen = make_stub(model="qwen")
    with serve_in_thread(create_stub_app(StubConfig(model="llama"))) as llama:
        gw = make_gateway(
            [BackendConfig(llama, metrics_poll_s=0.05), BackendConfig(qwen.url, metrics_poll_s=0.05)],
            queue_ttl_s=1.0,
            backend_down_s=0.2,
        )
        wait_until(lambda: all(b.models is not None for b in gw.gateway.backends), what="both model lists")
    wait_until(lambda: not gw.gateway.backends[0].reachable, what="the llama backend down")
    with gw.client() as c:
        r = c.post("/v1/completions", json={"model": "llama", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend", r.text
        assert "Retry-After" in r.headers
        assert c.post("/v1/completions", json={"model": "qwen", "prompt": "x", "max_tokens": 2}).status_code == 200
        assert c.get("/health").json()["status"] == "ok"


def test_a_failed_first_read_of_a_polled_backend_s_models_is_tried_again(make_stub, make_gateway, monkeypatch):
    """Its /v1/models failing once (a restart, a slow worker) left its models unknown for good, so any
    model's requests could go there; the next poll reads them."""
    import headway.serve._models as models

    real, calls = models.read_models, []

    async def flaky(client, backend):  # type: ignore[no-untyped-def]
        calls.append(backend.url)
        return None if len(calls) == 1 else await real(client, backend)

    monkeypatch.setattr(models, "read_models", flaky)
    llama = make_stub(model="llama")
    gw = make_gateway([BackendConfig(llama.url, metrics_poll_s=0.05)])
    wait_until(lambda: gw.gateway.backends[0].models == ("llama",), what="the models read on a later poll")
    assert len(calls) >= 2


def test_a_backend_not_polled_is_reachable_again_once_it_lists_its_models(make_stub, make_gateway):
    """A request's failed connection marks it unreachable; its models read again mean it answers:
    /health no longer names its model as unavailable."""
    llama, qwen = make_stub(model="llama"), make_stub(model="qwen")
    gw = make_gateway([BackendConfig(llama.url, max_concurrency=2), BackendConfig(qwen.url, max_concurrency=2)])
    wait_until(lambda: [b.models for b in gw.gateway.backends] == [("llama",), ("qwen",)], what="both model lists")
    gw.gateway.backends[1].reachable = False  # (as a request that could not connect leaves it)
    assert httpx.get(gw.url + "/health").json().get("models_unavailable") == ["qwen"]
    wait_until(lambda: gw.gateway.backends[1].reachable, what="the qwen backend read again", timeout=5)
    assert "models_unavailable" not in httpx.get(gw.url + "/health").json()
