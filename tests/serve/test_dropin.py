"""Drop-in gateway: requests go upstream as sent, per-backend keys, https, other /v1 endpoints
passed through, admission from the backends' own /metrics (vLLM and SGLang names)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway.serve import BackendConfig, TenantConfig, hash_api_key, serve_in_thread
from headway.serve._backend_load import BackendLoad, MetricsFormatError, parse_backend_load
from headway.serve._upstream import UpstreamPool

from .conftest import wait_until


class _Recorder:
    """A backend that records each request (method, path, query, headers, raw body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, dict[str, str], bytes]] = []
        self.metrics = 'vllm:num_requests_waiting{model_name="m"} 0.0\nvllm:kv_cache_usage_perc{model_name="m"} 0.1\n'

    async def generate(self, request: HTTPRequest) -> Response:
        body = await request.body()
        self.seen.append((request.method, request.url.path, request.url.query, dict(request.headers), body))
        if (b'"stream": true' in body or b'"stream":true' in body) and "chat" in request.url.path:
            events = (  # as vLLM: a role chunk first, then one chunk per token
                b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
                b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"length"}]}\n\n'
                b"data: [DONE]\n\n"
            )
            return Response(events, media_type="text/event-stream")
        if b'"stream": true' in body or b'"stream":true' in body:
            events = (
                b'data: {"id":"c","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
                b'data: {"id":"c","choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
            )
            return Response(events, media_type="text/event-stream")
        return JSONResponse({"id": "c", "choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}})

    async def other(self, request: HTTPRequest) -> Response:
        body = await request.body()
        self.seen.append((request.method, request.url.path, request.url.query, dict(request.headers), body))
        return Response(b'{"echo":' + (body or b"null") + b"}", status_code=201, media_type="application/json",
                        headers={"X-Backend": "yes"})  # fmt: skip

    async def prom(self, request: HTTPRequest) -> Response:
        self.seen.append((request.method, request.url.path, "", dict(request.headers), b""))
        return Response(self.metrics.encode(), media_type="text/plain")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
                Route("/metrics", self.prom, methods=["GET"]),
                Route("/v1/{rest:path}", self.other, methods=["GET", "POST", "DELETE"]),
                Route("/{rest:path}", self.other, methods=["GET", "POST"]),  # vLLM's /sleep, /reset_prefix_cache...
            ]
        )

    def generations(self) -> list[bytes]:
        return [body for _, path, _, _, body in self.seen if path.endswith("completions")]


@pytest.fixture
def recorder(servers) -> tuple[_Recorder, str]:
    rec = _Recorder()
    return rec, servers.enter_context(serve_in_thread(rec.app()))


def test_requests_reach_the_backend_byte_for_byte(recorder, make_gateway):
    rec, url = recorder
    gw = make_gateway([url])
    bodies = [
        b'{"model": "m", "prompt": "hi", "temperature": 0.7}',  # no max_tokens: none added
        b'{"model":"m","prompt":"hi","stream":true}',  # no stream_options: none added
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "seed": 1}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true}',
    ]
    answers = []
    with gw.client() as c:
        paths = ["/v1/completions", "/v1/completions", "/v1/chat/completions", "/v1/chat/completions"]
        for body, path in zip(bodies, paths, strict=True):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            answers.append(r.text)
    assert rec.generations() == bodies
    # the streams came back as the backend sent them; the policy counted their token events (not
    # chat's role chunk)
    assert answers[1].count("data: ") == 3 and answers[1].endswith("data: [DONE]\n\n")
    assert answers[3].count("data: ") == 4
    assert [q.num_output_tokens for q in gw.gateway.finished_requests] == [2, 2, 2, 2]


def test_documented_options_add_fields(recorder, make_gateway):
    rec, url = recorder
    gw = make_gateway([url], default_max_tokens=7, add_stream_usage=True)
    with gw.client() as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "stream": True}).status_code == 200
    (sent,) = rec.generations()
    assert b'"max_tokens": 7' in sent and b'"include_usage": true' in sent


def test_backend_api_key_goes_upstream_and_client_keys_do_not(recorder, make_gateway):
    rec, url = recorder
    tenants = (TenantConfig("acme", api_key_sha256=(hash_api_key("client-key"),)),)
    gw = make_gateway([BackendConfig(url, api_key="backend-key")], tenants=tenants)
    auth = {"Authorization": "Bearer client-key"}
    with gw.client(headers=auth) as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        r = c.post("/v1/embeddings?x=1", json={"input": "hi"})
        assert c.get("/v1/models").status_code in (200, 502)
    assert r.status_code == 201 and r.json() == {"echo": {"input": "hi"}} and r.headers["x-backend"] == "yes"
    sent = [(m, p, q, h.get("authorization")) for m, p, q, h, _ in rec.seen if p != "/metrics"]
    assert ("POST", "/v1/completions", "", "Bearer backend-key") in sent
    assert ("POST", "/v1/embeddings", "x=1", "Bearer backend-key") in sent
    assert all(a == "Bearer backend-key" for *_, a in sent)
    # other endpoints need a gateway key like the rest
    assert httpx.post(gw.url + "/v1/embeddings", json={"input": "hi"}).status_code == 401


def test_other_v1_endpoints_pass_through_unscheduled(recorder, make_gateway):
    rec, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)])
    with gw.client() as c:
        for method, path in [("POST", "/v1/tokenize"), ("POST", "/v1/responses"), ("GET", "/v1/files/f1"),
                             ("DELETE", "/v1/responses/r1")]:  # fmt: skip
            r = c.request(method, path, content=b'{"a": 1}' if method == "POST" else None)
            assert r.status_code == 201, (path, r.text)
        # the gateway's own endpoints with another method are its own 405, not passed through
        assert c.get("/v1/completions").json()["error"]["code"] == "method_not_allowed"
    assert [(m, p) for m, p, *_ in rec.seen if (m, p) != ("GET", "/v1/models")] == [  # (the gateway's read)
        ("POST", "/v1/tokenize"), ("POST", "/v1/responses"), ("GET", "/v1/files/f1"), ("DELETE", "/v1/responses/r1")
    ]  # fmt: skip
    assert not gw.gateway.finished_requests  # never queued as a generation request


def test_pass_through_skips_a_dead_backend(recorder, make_gateway):
    from headway.serve import free_port

    _, url = recorder
    dead = f"http://127.0.0.1:{free_port()}"
    gw = make_gateway([BackendConfig(dead, max_concurrency=1), BackendConfig(url, max_concurrency=1)])
    with gw.client() as c:
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 201
    assert not gw.gateway.backends[0].reachable


def _raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 5.0) -> bytes:
    """``head`` (request line and headers, without the blank line) and ``body`` as sent, on a socket
    of its own (an HTTP client would resolve the path's dot segments itself); the answer's bytes."""
    import socket

    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head + b"\r\nHost: gw\r\nConnection: close\r\n\r\n" + body)
        out = b""
        with contextlib.suppress(TimeoutError):
            while chunk := s.recv(65536):
                out += chunk
    return out


def test_a_path_that_leaves_v1_or_reaches_generation_is_never_passed_through(recorder, make_gateway):
    """``/v1/../sleep`` resolved by the gateway's HTTP client reached the engine's /sleep (and
    ``/v1/../v1/completions`` its generation, unscheduled): every such path is a 404, never sent."""
    rec, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)])
    targets = [
        b"/v1/../reset_prefix_cache", b"/v1/%2e%2e/sleep?level=1", b"/v1/%2E%2E/collective_rpc",
        b"/v1/..%2fstart_profile", b"/v1/embeddings/../../metrics", b"/v1/./../load", b"/v1/..",
        b"/v1/../v1/completions", b"/v1//completions", b"/v1/./chat/completions", b"/v1/completions/",
    ]  # fmt: skip
    for target in targets:
        out = _raw_request(gw.url, b"POST " + target + b" HTTP/1.1\r\nContent-Length: 2", b"{}")
        assert out.startswith(b"HTTP/1.1 404"), (target, out)
        assert b'"code":"not_found"' in out, (target, out)
    assert not [p for _, p, *_ in rec.seen if p not in ("/metrics", "/v1/models")]
    # a path as the client spelled it, percent-encoding included, still goes
    out = _raw_request(gw.url, b"POST /v1/files/a%2Fb.txt?x=1 HTTP/1.1\r\nContent-Length: 2", b"{}")
    assert out.startswith(b"HTTP/1.1 201"), out
    assert [(p, q) for _, p, q, *_ in rec.seen if p.startswith("/v1/files")] == [("/v1/files/a/b.txt", "x=1")]


def test_a_pass_through_body_is_bounded_in_size_and_time(recorder, make_gateway):
    """The passed-through body was read whole before its size was checked, with no deadline: one
    client could hold the gateway's memory, or a connection for good."""
    rec, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)], max_body_bytes=1024, body_timeout_s=0.3)
    t0 = time.monotonic()
    out = _raw_request(gw.url, b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 1000000000", b"{")
    assert out.startswith(b"HTTP/1.1 413") and b'"code":"request_too_large"' in out, out
    chunked = b"POST /v1/embeddings HTTP/1.1\r\nTransfer-Encoding: chunked"
    out = _raw_request(gw.url, chunked, b"800\r\n" + b"x" * 0x800 + b"\r\n")  # over the limit, never ended
    assert out.startswith(b"HTTP/1.1 413"), out
    out = _raw_request(gw.url, b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 100", b'{"input"')
    assert out.startswith(b"HTTP/1.1 408") and b'"code":"body_timeout"' in out, out
    assert time.monotonic() - t0 < 4
    assert not [p for _, p, *_ in rec.seen if p == "/v1/embeddings"]


def test_a_redirect_from_a_backend_does_not_name_it(servers, make_gateway):
    async def redirect(request: HTTPRequest) -> Response:  # as FastAPI answers /v1/embeddings/
        location = str(request.url.replace(path=request.url.path.rstrip("/")))
        return Response(status_code=307, headers={"Location": location})

    url = servers.enter_context(serve_in_thread(Starlette(routes=[Route("/v1/{p:path}", redirect)])))
    gw = make_gateway([BackendConfig(url, max_concurrency=1)])
    with gw.client() as c:
        r = c.get("/v1/embeddings/?x=1")
    assert r.status_code == 307 and r.headers["location"] == "/v1/embeddings?x=1"


@pytest.mark.parametrize("shared", [False, pytest.param(True, marks=pytest.mark.redis)])
def test_admission_follows_the_backends_own_metrics(recorder, make_gateway, request, shared):
    """Default backend settings: no fixed cap; a backend whose own queue is not empty gets nothing
    (in memory, and with the queue in Redis)."""
    rec, url = recorder
    rec.metrics = "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{tp_rank=\"0\"} 3.0\n"
    redis = {}
    if shared:
        import uuid

        redis = {"redis_url": request.getfixturevalue("redis_url"), "redis_prefix": f"t{uuid.uuid4().hex[:6]}:"}
    gw = make_gateway([BackendConfig(url, metrics_poll_s=0.05)], **redis)
    assert gw.gateway.backends[0].config.max_concurrency == 0
    result: list[int] = []

    def send() -> None:
        result.append(httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code)

    import threading

    t = threading.Thread(target=send)
    wait_until(lambda: gw.gateway.backends[0].polled_waiting == 3.0, what="first poll")
    t.start()
    wait_until(lambda: gw.gateway.dispatcher.scoring == 0 and len(rec.seen) > 2, what="a few polls")
    time.sleep(0.2)
    time.sleep(0.3)
    assert not rec.generations()  # SGLang says 3 are waiting: held in the gateway
    rec.metrics = 'sglang:num_queue_reqs{tp_rank="0"} 0.0\nsglang:token_usage{tp_rank="0"} 0.5\n'
    t.join(timeout=10)
    assert result == [200] and len(rec.generations()) == 1


def test_parse_backend_load():
    vllm = (
        "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{model_name="m",reason="capacity"} 9.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'
    )
    assert parse_backend_load(vllm) == BackendLoad(waiting=5.0, kv_usage=0.7)
    sglang = 'sglang:num_queue_reqs{model_name="m"} 4\nsglang:token_usage{model_name="m"} 0.25\n'
    assert parse_backend_load(sglang) == BackendLoad(waiting=4.0, kv_usage=0.25)
    assert parse_backend_load("vllm:gpu_cache_usage_perc 0.9\n") == BackendLoad(0.0, 0.9)
    with pytest.raises(MetricsFormatError, match="no load gauge"):
        parse_backend_load("process_cpu_seconds_total 3\n")
    with pytest.raises(MetricsFormatError, match="not Prometheus text"):
        parse_backend_load("vllm:num_requests_waiting {{{\n")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_backend_with_api_key(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    heads: list[bytes] = []

    async def main() -> tuple[int, bytes]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool(f"https://localhost:{port}", api_key="sk-up", ssl_context=client_ctx)
        resp = await pool.post("/v1/completions", b"{}")
        body = await resp.read()
        await pool.aclose()
        server.close()
        return resp.status_code, body

    assert asyncio.run(main()) == (200, b"ok")
    assert b"\r\nAuthorization: Bearer sk-up\r\n" in heads[0]


def test_priority_bands_through_the_gateway(make_stub, make_gateway):
    """bands around sjf-oracle: strict priority bands, tenants alternating in a band (b, which has had
    no turn yet, first), the inner order (shortest first) inside each tenant's flow."""
    import threading

    stub = make_stub(token_delay_s=0.02)
    tenants = tuple(TenantConfig(t, api_key_sha256=(hash_api_key(f"k{t}"),)) for t in "ab")
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy="bands",
                      policy_args={"inner": "sjf-oracle"}, tenants=tenants)  # fmt: skip
    sends = [("a", 0, 100, "block"), ("a", 1, 5, "a5"), ("a", 0, 30, "a30"), ("a", 0, 20, "a20"),
             ("a", 0, 10, "a10"), ("b", 0, 40, "b40"), ("b", 1, 2, "b2")]  # fmt: skip
    d = gw.gateway.dispatcher
    codes: list[int] = []
    threads = []
    for i, (tenant, priority, n, label) in enumerate(sends):
        body = {"model": "m", "prompt": label, "max_tokens": n, "priority": priority}

        def go(body: dict = body, tenant: str = tenant) -> None:
            r = httpx.post(gw.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer k{tenant}"},
                           timeout=30)  # fmt: skip
            codes.append(r.status_code)

        threads.append(threading.Thread(target=go))
        threads[-1].start()
        wait_until(lambda i=i: d.backends[0].in_flight == 1 and len(d.queue) == i, what=f"request {i} queued")
    for t in threads:
        t.join(timeout=60)
    assert codes == [200] * len(sends)
    assert stub.stub.stats.order == ["block", "b40", "a10", "a20", "a30", "b2", "a5"]


def test_a_started_request_stops_counting_as_waiting_in_the_backend():
    """With admission from /metrics (max_waiting 0), a dispatched request counts as possibly waiting
    in the backend until its first token, not until the next poll: a burst fills the engine as
    fast as it starts requests, not one request per poll."""
    from headway.core import Request
    from headway.serve._dispatch import Backend

    b = Backend(BackendConfig("http://127.0.0.1:9"), 0)
    assert b.config.metrics_poll_s > 0 and b.has_room(0.0)
    reqs = [Request(request_id=f"r{i}", arrival_time=0.0, num_prompt_tokens=4, max_tokens=8) for i in range(2)]
    b.dispatched_since_poll += 1  # as the dispatcher does
    assert not b.has_room(0.0)  # it may be waiting in the engine's own queue
    b.note_started(reqs[0])
    b.note_started(reqs[0])  # counted once
    assert b.has_room(0.0) and b.finished_since_poll == 1
    b.note_released(reqs[0])  # not counted again at its end
    b.note_released(reqs[1])  # one that never started counts at its end
    assert b.finished_since_poll == 2
