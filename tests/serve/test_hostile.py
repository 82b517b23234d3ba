"""The gateway against a hostile client (loopback only, each case bounded in time).

Each case asserts the answer the hostile client gets, that other clients are still served
(their latency bound is stated where the case measures one), that nothing is lost or
answered twice, and, for the large-input cases, that the gateway's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
import types
from collections.abc import Callable

import httpx
import pytest

from headway.serve import BackendConfig

COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 3}


def _rss_mb() -> float:
    """Resident memory of this process (the gateways under test run in its threads)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _scorer_module(monkeypatch: pytest.MonkeyPatch, fn: Callable[[list[str]], list[float]]) -> str:
    """``fn`` as a scorer spec the gateway can load (``module:attr``)."""
    mod = types.ModuleType("hw_hostile_scorer")
    mod.score = fn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hw_hostile_scorer", mod)
    return "hw_hostile_scorer:score"


def _strict(seen: list[str]) -> Callable[[list[str]], list[float]]:
    """A scorer that refuses what the real tokenizer refuses (a lone surrogate: ``TypeError``)
    and a marked prompt (``POISON``), and records what it was given."""

    def score(prompts: list[str]) -> list[float]:
        for p in prompts:
            p.encode("utf-8")  # UnicodeEncodeError on a lone surrogate, as predict.score's hash did
            if "POISON" in p:
                raise RuntimeError("scorer cannot handle this prompt")
        seen.extend(prompts)
        return [float(len(p)) for p in prompts]

    return score


async def _post_all(url: str, bodies: list[tuple[dict | bytes, dict[str, str]]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:

        async def one(body: dict | bytes, headers: dict[str, str]) -> httpx.Response:
            if isinstance(body, bytes):
                return await c.post("/v1/completions", content=body, headers=headers)
            return await c.post("/v1/completions", json=body, headers=headers)

        return list(await asyncio.gather(*[one(b, h) for b, h in bodies]))


# ------------------------------------------------------------------------------- scoring
def test_a_prompt_the_scorer_fails_on_fails_nobody_else_and_gets_the_fallback_score(
    make_stub, make_gateway, monkeypatch
):
    """One poison prompt in a batch with 20 other requests: the batch is scored again prompt
    by prompt; every request is answered 200 once, the poison one with the fallback score."""
    seen: list[str] = []
    stub = make_stub()
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=4)],
        policy="pars",
        scorer=_scorer_module(monkeypatch, _strict(seen)),
        scorer_max_wait_s=0.05,
    )
    bodies: list[tuple[dict | bytes, dict[str, str]]] = [
        ({**COMPLETION, "prompt": "x" * (i + 1)}, {}) for i in range(20)
    ]
    bodies.insert(7, ({**COMPLETION, "prompt": "POISON"}, {}))
    rs = asyncio.run(_post_all(gw.url, bodies))
    assert [r.status_code for r in rs] == [200] * 21, [r.text for r in rs if r.status_code != 200]
    g = gw.gateway
    # requests dispatched before their score (the scorer's fast path) are scored in the background
    _wait_for(lambda: len(seen) == 20 and g.num_score_fallbacks == 1, "every request scored")
    assert g.num_score_fallbacks == 1
    # and /metrics says so (the warning is rate-limited, and score_wait times only scored prompts)
    assert 'headway_score_fallbacks_total{reason="scorer_error"} 1.0' in httpx.get(gw.url + "/metrics").text
    assert g.scorer is not None and g.scorer.num_batch_failures >= 1
    assert sorted(seen) == sorted("x" * (i + 1) for i in range(20))
    assert len(g.finished_requests) == 21 and stub.stub.stats.started == 21
    assert g.dispatcher.scoring == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "max_tokens": 2, "prompt": "ab\\ud800cd"}',
        b'{"model": "m", "max_tokens": 2, "prompt": "ab\xed\xa0\x80cd"}',
    ],
    ids=["json-escape", "raw-bytes"],
)
def test_a_lone_surrogate_is_scored_as_the_replacement_character(make_stub, make_gateway, monkeypatch, raw):
    seen: list[str] = []
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars", scorer=_scorer_module(monkeypatch, _strict(seen)))
    rs = asyncio.run(_post_all(gw.url, [(raw, {"content-type": "application/json"})]))
    assert rs[0].status_code == 200, rs[0].text
    _wait_for(lambda: bool(seen), "the prompt scored")  # a lone request may be scored after its answer
    assert seen == ["ab\ufffdcd"] and gw.gateway.num_score_fallbacks == 0


def test_token_id_prompts_get_the_fallback_score_not_a_500(make_stub, make_gateway, monkeypatch):
    seen: list[str] = []
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars", scorer=_scorer_module(monkeypatch, _strict(seen)))
    with gw.client() as c:
        assert c.post("/v1/completions", json={**COMPLETION, "prompt": "four"}).status_code == 200
        # a lone request may be answered before its score lands (the scorer's fast path)
        fin = gw.gateway.finished_requests
        _wait_for(lambda: bool(fin) and fin[0].score is not None, "the first prompt scored")
        r = c.post("/v1/completions", json={**COMPLETION, "prompt": [1, 2, 3]})
    assert r.status_code == 200, r.text
    assert gw.gateway.num_score_fallbacks == 1
    text = httpx.get(gw.url + "/metrics").text
    assert 'headway_score_fallbacks_total{reason="no_text"} 1.0' in text and '{reason="scorer_error"}' not in text
    # the fallback is the mean of the scores given so far: the one text prompt's
    assert [q.score for q in gw.gateway.finished_requests] == [4.0, 4.0]


def test_a_huge_prompt_is_scored_on_a_bounded_prefix_and_memory_stays_bounded(make_stub, make_gateway, monkeypatch):
    """Ten ~990 KB prompts: the scorer reads at most 512 tokens' worth (16,384 characters) of
    each; a short request sent meanwhile is answered within 2 s; RSS grows by under 150 MB."""
    seen: list[str] = []
    stub = make_stub()
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=8)],
        policy="pars",
        scorer=_scorer_module(monkeypatch, _strict(seen)),
        max_body_bytes=1 << 20,
    )
    big = "word " * 198_000
    before = _rss_mb()

    async def main() -> tuple[list[httpx.Response], float]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            bigs = [
                asyncio.ensure_future(c.post("/v1/completions", json={**COMPLETION, "prompt": big})) for _ in range(10)
            ]
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            small = await c.post("/v1/completions", json=COMPLETION)
            took = time.perf_counter() - t0
            return [small, *await asyncio.gather(*bigs)], took

    rs, took = asyncio.run(main())
    assert [r.status_code for r in rs] == [200] * 11
    assert took < 2.0
    assert max(len(p) for p in seen) <= 512 * 32
    assert _rss_mb() - before < 150


def test_a_full_queue_answers_429_before_scoring(make_stub, make_gateway, monkeypatch):
    """With a slow scorer (0.3 s a batch) and room for 2 requests, the third of a burst gets its
    429 at once (under 0.25 s), not after being scored; the first two are served."""
    scored: list[str] = []

    def slow(prompts: list[str]) -> list[float]:
        time.sleep(0.3)
        scored.extend(prompts)
        return [1.0] * len(prompts)

    stub = make_stub()
    # without the fast path, which would dispatch all three at once (the backend has room for 4)
    gw = make_gateway(
        [stub.url], policy="pars", scorer=_scorer_module(monkeypatch, slow), max_queue_len=2, scorer_fast_path=False
    )

    async def main() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one(i: int) -> tuple[int, float]:
                await asyncio.sleep(0.02 * i)  # in order
                t0 = time.perf_counter()
                r = await c.post("/v1/completions", json={**COMPLETION, "prompt": f"p{i}"})
                return r.status_code, time.perf_counter() - t0

            return list(await asyncio.gather(*[one(i) for i in range(3)]))

    (s0, _), (s1, _), (s2, t2) = asyncio.run(main())
    assert (s0, s1, s2) == (200, 200, 429)
    assert t2 < 0.25
    assert sorted(scored) == ["p0", "p1"]


# ------------------------------------------------------------------------------- auth
def test_a_request_without_a_key_is_refused_before_its_body_arrives(make_stub, make_gateway):
    """Headers announcing a 100 KB body that never comes: 401 within 1 s (not 408 after the
    body timeout); the key's holder is served meanwhile."""
    from headway.serve import TenantConfig, hash_api_key

    stub = make_stub()
    gw = make_gateway([stub.url], tenants=(TenantConfig("acme", api_key_sha256=(hash_api_key("sk-a"),)),))
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.perf_counter()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{")  # fmt: skip
        head = _read_head(s)
        took = time.perf_counter() - t0
    assert head.startswith(b"HTTP/1.1 401") and took < 1.0
    with gw.client(headers={"Authorization": "Bearer sk-a"}) as c:
        assert c.post("/v1/completions", json=COMPLETION).status_code == 200


def _read_head(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.redis
def test_keys_kept_in_redis_while_redis_is_down_get_json_503_with_retry_after(tmp_path, make_stub, make_gateway):
    """A key not in the config is looked up in Redis. Redis killed: a key never seen gets 503
    ``auth_unavailable`` with Retry-After on every keyed path (JSON, no traceback); a key
    looked up before still resolves; Redis back: the wrong key is a 401 again."""
    import redis

    from headway.serve import free_port
    from headway.serve._tenants import REDIS_APIKEYS_HASH

    from .conftest import start_redis_server

    port = free_port()
    proc = start_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    redis.Redis.from_url(url).hset(REDIS_APIKEYS_HASH, _hash("sk-red"), json.dumps({"tenant": "red"}))
    stub = make_stub()
    gw = make_gateway([stub.url], redis_url=url, api_keys="required", redis_retry_s=0.5)
    red = {"Authorization": "Bearer sk-red"}
    wrong = {"Authorization": "Bearer sk-wrong"}
    try:
        with gw.client() as c:
            assert c.post("/v1/completions", json=COMPLETION, headers=red).status_code == 200
            proc.kill()
            proc.wait(5)
            for method, path in [("POST", "/v1/completions"), ("GET", "/metrics"), ("GET", "/v1/requests/hw-x"),
                                 ("DELETE", "/v1/requests/hw-x"), ("GET", "/v1/models")]:  # fmt: skip
                r = c.request(method, path, json=COMPLETION if method == "POST" else None, headers=wrong)
                assert r.status_code == 503, (path, r.text)
                assert r.json()["error"]["code"] == "auth_unavailable" and r.headers["retry-after"] == "1"
            r = c.get("/v1/requests/hw-x", headers=red)  # the cached key still resolves
            assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
            proc = start_redis_server(port, tmp_path)
            assert c.post("/v1/completions", json=COMPLETION, headers=wrong).status_code == 401
    finally:
        proc.kill()
        proc.wait(5)


def _hash(key: str) -> str:
    from headway.serve import hash_api_key

    return hash_api_key(key)


# ------------------------------------------------------------------------- connections
def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _closed_within(s: socket.socket, timeout: float) -> tuple[bool, bytes]:
    """Whether the server closed ``s`` within ``timeout``, and what it sent before."""
    s.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return True, data
            data += chunk
    except TimeoutError:
        return False, data
    except ConnectionResetError:
        return True, data
    return False, data


def test_slowloris_and_bare_connections_are_closed_at_the_head_deadline(make_stub, make_gateway):
    """30 connections that send nothing and 30 that send a header byte every 0.2 s: all closed
    within 1.5 s of a 1 s head deadline (the slow ones after a 408 in JSON); a normal client
    is answered within 1 s meanwhile, and the connections are gone from the server."""
    stub = make_stub()
    gw = make_gateway([stub.url], client_header_timeout_s=1.0)
    port = _port(gw.url)
    bare = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
    for s in slow:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 200 and time.monotonic() - t0 < 1.0
    for _ in range(3):
        for s in slow:
            with contextlib.suppress(OSError):
                s.send(b"X")
        time.sleep(0.2)
    results = [_closed_within(s, 1.5 - (time.monotonic() - t0) + 0.5) for s in [*bare, *slow]]
    assert all(closed for closed, _ in results)
    assert all(data == b"" for _, data in results[:30])
    for _, data in results[30:]:
        assert data.startswith(b"HTTP/1.1 408") and b'"code": "header_timeout"' in data
    for s in [*bare, *slow]:
        s.close()


def test_an_idle_kept_alive_connection_is_closed(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], keep_alive_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", _port(gw.url))) as s:
        body = json.dumps(COMPLETION).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        closed, data = _closed_within(s, 2.0)
    assert closed and data.startswith(b"HTTP/1.1 200")


def test_connections_over_the_cap_get_a_fast_json_503_and_those_within_are_served(make_stub, make_gateway):
    """``max_connections = 10``: with 10 idle connections open, an 11th request gets 503
    ``too_many_connections`` with Retry-After within 0.5 s; once they close, requests are
    served again."""
    stub = make_stub()
    gw = make_gateway([stub.url], max_connections=10, client_header_timeout_s=5.0)
    port = _port(gw.url)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
    time.sleep(0.1)
    t0 = time.monotonic()
    with gw.client() as c:
        r = c.post("/v1/completions", json=COMPLETION)
    assert r.status_code == 503 and time.monotonic() - t0 < 0.5
    assert r.json()["error"]["code"] == "too_many_connections" and r.headers["retry-after"] == "1"
    for s in idle:
        s.close()
    time.sleep(0.1)
    with gw.client() as c:
        assert c.post("/v1/completions", json=COMPLETION).status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n",
    ],
    ids=["request-line", "head-over-16k", "header-line"],
)
def test_parser_errors_answer_openai_json(make_stub, make_gateway, raw):
    stub = make_stub()
    gw = make_gateway([stub.url])
    with socket.create_connection(("127.0.0.1", _port(gw.url))) as s:
        s.sendall(raw)
        closed, data = _closed_within(s, 2.0)
    head, _, body = data.partition(b"\r\n\r\n")
    assert closed and head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "invalid_request"


def test_a_flood_of_bad_requests_logs_a_few_lines(make_stub, make_gateway):
    """200 malformed requests: uvicorn's warning is let through 5 times (then rate-limited)."""
    import logging

    from headway.serve._conn import RateLimitedLog

    stub = make_stub()
    gw = make_gateway([stub.url])
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    limit = RateLimitedLog(burst=5, period_s=60)
    logger = logging.getLogger("uvicorn.error")
    logger.addFilter(limit)
    logger.addHandler(handler)
    try:
        for _ in range(200):
            with socket.create_connection(("127.0.0.1", _port(gw.url))) as s:
                s.sendall(b"GARBAGE\r\n\r\n")
                assert _closed_within(s, 2.0)[0]
    finally:
        logger.removeFilter(limit)
        logger.removeHandler(handler)
    assert len([r for r in records if "Invalid HTTP request" in r.getMessage()]) == 5


# ------------------------------------------------------------------------- odd requests
def test_no_redirect_is_built_from_the_host_header(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url])
    with gw.client() as c:
        r = c.get("/health/", headers={"Host": "evil.example"})
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["error"]["code"] == "not_found"


def test_n_beyond_the_limit_is_refused_naming_the_field(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url])
    with gw.client() as c:
        r = c.post("/v1/completions", json={**COMPLETION, "n": 1000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        assert r.json()["error"]["message"] == "'n' must be at most 128, got 1000"
        assert c.post("/v1/completions", json={**COMPLETION, "n": 2}).status_code == 200
    assert stub.stub.stats.started == 1


# ------------------------------------------------------------------------- redis outages
def _inflight(url: str, prefix: str) -> dict[str, int]:
    import redis

    r = redis.Redis.from_url(url)
    return {k.decode(): int(v) for k, v in r.hgetall(prefix + "inflight").items()}


@pytest.mark.redis
def test_a_request_waits_for_redis_to_come_back_within_the_queue_ttl(tmp_path, make_stub, make_gateway):
    """Redis down for 2 s (its retry window 0.5 s), back without its data: a request sent
    meanwhile is served (it waited, as the queue TTL allows), once; no slot stays held."""
    from headway.serve import free_port

    from .conftest import start_redis_server

    port = free_port()
    proc = start_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    stub = make_stub()
    gw = make_gateway([stub.url], redis_url=url, redis_prefix="w:", redis_retry_s=0.5, redis_lease_s=0.6,
                      queue_ttl_s=15.0)  # fmt: skip
    try:
        with gw.client(timeout=20) as c:
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
            proc.kill()
            proc.wait(5)

            async def during() -> httpx.Response:
                async with httpx.AsyncClient(base_url=gw.url, timeout=20) as ac:
                    return await ac.post("/v1/completions", json={**COMPLETION, "prompt": "during"})

            def restart() -> None:
                time.sleep(2.0)
                nonlocal proc
                proc = start_redis_server(port, tmp_path)

            t = threading.Thread(target=restart)
            t.start()
            r = asyncio.run(during())
            t.join()
            assert r.status_code == 200, r.text
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        assert stub.stub.stats.order.count("during") == 1
        _wait_for(lambda: all(v == 0 for v in _inflight(url, "w:").values()), "slots released")
    finally:
        proc.kill()
        proc.wait(5)


def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.redis
def test_a_release_during_a_rejoin_is_not_lost(redis_url):
    """Redis loses its data while a replica holds a slot; the replica rejoins (declaring the
    slot) and the request finishes while the join is under way, its release reaching Redis
    first. The slot used to stay held for good; now ``inflight`` is 0 once it is done."""
    import redis.asyncio as aioredis

    from headway.core import Request, make_policy
    from headway.serve._dispatch import Backend
    from headway.serve._redis_queue import RedisDispatcher

    prefix = f"j{time.monotonic_ns() % 10**8}:"

    async def main() -> dict[str, int]:
        client = aioredis.from_url(redis_url)
        d = RedisDispatcher(make_policy("fcfs"), [Backend(BackendConfig("http://127.0.0.1:9", max_concurrency=2), 0)],
                            client, max_queue_len=10, prefix=prefix, lease_s=30)  # fmt: skip
        await d.start()
        try:
            req = Request(request_id="r1", arrival_time=d.now(), num_prompt_tokens=4, max_tokens=4)
            backend = await asyncio.wait_for(d.submit(req), 5)
            assert _inflight(redis_url, prefix) == {"http://127.0.0.1:9": 1}
            for key in await client.keys(prefix + "*"):  # Redis lost its data
                await client.delete(key)
            join = d._scripts.scripts["join"]

            async def slow_join(*args: object, **kw: object) -> object:
                await asyncio.sleep(0.3)  # the release below reaches Redis first
                return await join(*args, **kw)

            d._scripts.scripts["join"] = slow_join  # type: ignore[assignment]
            rejoin = asyncio.ensure_future(d._rejoin())
            await asyncio.sleep(0.05)
            d.release(backend, req)  # the request ends while the join is under way
            await rejoin
            await asyncio.sleep(0.3)
            return _inflight(redis_url, prefix)
        finally:
            await d.stop()
            await client.aclose()

    assert asyncio.run(main()) == {"http://127.0.0.1:9": 0}


@pytest.mark.redis
def test_status_and_cancel_work_from_any_replica_and_only_for_the_owner_tenant(redis_url, make_stub, make_gateway):
    from headway.serve import TenantConfig

    stub = make_stub(token_delay_s=0.05)
    tenants = (
        TenantConfig("acme", api_key_sha256=(_hash("sk-a"),)),
        TenantConfig("bulk", api_key_sha256=(_hash("sk-b"),)),
    )
    prefix = f"p{time.monotonic_ns() % 10**8}:"
    kw = {"redis_url": redis_url, "redis_prefix": prefix, "tenants": tenants}
    a = make_gateway([BackendConfig(stub.url, max_concurrency=1)], **kw)
    b = make_gateway([BackendConfig(stub.url, max_concurrency=1)], **kw)
    acme, bulk = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}

    async def main() -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=30) as c:
            call = asyncio.ensure_future(
                c.post(a.url + "/v1/completions", json={**COMPLETION, "max_tokens": 200}, headers=acme)
            )
            for _ in range(200):
                if a.gateway.active:
                    break
                await asyncio.sleep(0.01)
            (rid,) = a.gateway.active
            seen = [
                await c.get(f"{b.url}/v1/requests/{rid}", headers=acme),
                await c.get(f"{b.url}/v1/requests/{rid}", headers=bulk),
                await c.delete(f"{b.url}/v1/requests/{rid}", headers=bulk),
                await c.delete(f"{b.url}/v1/requests/{rid}", headers=acme),
            ]
            done = await call
            seen.append(await c.get(f"{b.url}/v1/requests/{rid}", headers=acme))
            seen.append(await c.delete(f"{b.url}/v1/requests/{rid}", headers=acme))
            return done, seen

    done, seen = asyncio.run(main())
    assert seen[0].status_code == 200 and seen[0].json()["status"] in ("queued", "running")
    assert [r.status_code for r in seen[1:3]] == [404, 404]  # another tenant: as if missing
    assert seen[3].status_code == 200 and seen[3].json()["cancelled"] is True
    assert done.status_code == 499 or done.json()["error"]["code"] == "cancelled"
    assert seen[4].json()["status"] == "cancelled"
    assert seen[5].status_code == 409 and seen[5].json()["error"]["code"] == "request_ended"


@pytest.mark.redis
def test_status_lookups_of_made_up_replicas_do_not_stall_other_tenants(redis_url, make_stub, make_gateway):
    """A request id names its replica, and a lookup of another replica's request waited up to 2 s on a
    connection of the gateway's Redis pool: one tenant's burst of ids naming made-up replicas took the
    pool, and another tenant's completion waited seconds for Redis (and each made a Redis key)."""
    import redis as redis_sync

    from headway.serve import TenantConfig

    tenants = (
        TenantConfig("acme", api_key_sha256=(_hash("sk-a"),)),
        TenantConfig("bulk", api_key_sha256=(_hash("sk-b"),)),
    )
    prefix = f"p{time.monotonic_ns() % 10**8}:"
    gw = make_gateway([make_stub().url], redis_url=redis_url, redis_prefix=prefix, tenants=tenants)
    acme, bulk = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}

    async def main() -> tuple[float, list[int]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, limits=httpx.Limits(max_connections=400)) as c:
            assert (await c.post("/v1/completions", json=COMPLETION, headers=bulk)).status_code == 200
            burst = [asyncio.ensure_future(c.get(f"/v1/requests/hw-x{i}-00", headers=acme)) for i in range(300)]
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            r = await c.post("/v1/completions", json=COMPLETION, headers=bulk)
            took = time.monotonic() - t0
            assert r.status_code == 200, r.text
            return took, [x.status_code for x in await asyncio.gather(*burst)]

    took, codes = asyncio.run(main())
    assert took < 1.5, took
    assert set(codes) == {404}
    assert not redis_sync.Redis.from_url(redis_url).keys(f"{prefix}peer:x*")


@pytest.mark.redis
def test_status_of_another_replicas_request_while_redis_is_down_is_a_json_503(tmp_path, make_stub, make_gateway):
    from headway.serve import free_port

    from .conftest import start_redis_server

    port = free_port()
    proc = start_redis_server(port, tmp_path)
    gw = make_gateway([make_stub().url], redis_url=f"redis://127.0.0.1:{port}/0", redis_retry_s=0.5)
    try:
        proc.kill()
        proc.wait(5)
        with gw.client() as c:
            r = c.get("/v1/requests/hw-0123456789ab-0000000000000000")
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_error"
        assert r.headers["retry-after"] == "1"
    finally:
        proc.kill()
        proc.wait(5)


@pytest.mark.redis
def test_with_redis_a_full_shared_queue_answers_429_before_scoring_once_seen_full(
    redis_url, make_stub, make_gateway, monkeypatch
):
    """Backend busy, shared queue (1) full: the first request past it is scored and refused by
    Redis; from then on, until a slot frees, requests get their 429 before scoring."""
    scored: list[str] = []

    def score(prompts: list[str]) -> list[float]:
        scored.extend(prompts)
        return [1.0] * len(prompts)

    stub = make_stub(token_delay_s=0.05)
    prefix = f"f{time.monotonic_ns() % 10**8}:"
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy="pars", max_queue_len=1,
                      scorer=_scorer_module(monkeypatch, score), redis_url=redis_url, redis_prefix=prefix)  # fmt: skip

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            running = asyncio.ensure_future(
                c.post("/v1/completions", json={**COMPLETION, "prompt": "run", "max_tokens": 60})
            )
            await asyncio.sleep(0.5)
            queued = asyncio.ensure_future(c.post("/v1/completions", json={**COMPLETION, "prompt": "queued"}))
            await asyncio.sleep(0.3)
            third = await c.post("/v1/completions", json={**COMPLETION, "prompt": "third"})
            fourth = await c.post("/v1/completions", json={**COMPLETION, "prompt": "fourth"})
            return [(await running).status_code, (await queued).status_code, third.status_code, fourth.status_code]

    assert asyncio.run(main()) == [200, 200, 429, 429]
    assert scored == ["run", "queued", "third"]


def test_a_flood_of_unknown_keys_does_not_evict_a_known_keys_last_answer():
    """While Redis is down a key kept there is served on its last answer; random keys (anyone may
    send them) filled the answer cache and cleared it, so Redis-kept tenants got 503s once Redis
    went down."""
    from headway.core import Tier
    from headway.serve import GatewayConfig
    from headway.serve._tenants import DirectoryUnavailable, Identity, TenantDirectory

    class _Redis:
        down = False

        async def hget(self, name: str, key: str) -> bytes | None:
            if self.down:
                raise ConnectionError("Redis is down")
            return b'{"tenant": "acme", "tier": "premium"}' if key == _hash("sk-acme") else None

    redis = _Redis()
    config = GatewayConfig(backends=(BackendConfig("http://127.0.0.1:9"),), api_keys="required", redis_url="redis://x")
    tenants = TenantDirectory(config, redis)

    async def main() -> Identity | None:
        assert await tenants.resolve("Bearer sk-acme") == Identity("acme", Tier.PREMIUM)
        for i in range(10_050):
            assert await tenants.resolve(f"Bearer nope-{i}") is None
        redis.down = True
        with pytest.raises(DirectoryUnavailable):
            await tenants.resolve("Bearer never-seen")
        return await tenants.resolve("Bearer sk-acme")

    assert asyncio.run(main()) == Identity("acme", Tier.PREMIUM)


# ------------------------------------------------------------------------ slow readers
def _open_stream(port: int, max_tokens: int) -> socket.socket:
    """A raw connection with a small receive buffer that has sent a streamed completion request."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = json.dumps({**COMPLETION, "max_tokens": max_tokens, "stream": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    s.sendall(head.encode() + b"\r\n\r\n" + body)
    return s


def test_a_client_that_never_reads_its_stream_is_cut_off_and_frees_its_backend_slot(make_stub, make_gateway):
    """A 200,000-token stream (about 26 MB) to a client that never reads, on a backend with one slot:
    at the send deadline (1 s without taking a byte) its connection is closed, the stream counted as
    ``client_send_timeout``, and the slot goes to another client's request, answered 200 (without
    the deadline the send waited for good and the other request got its 408 at the queue TTL)."""
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], client_send_timeout_s=1.0, queue_ttl_s=15)
    g = gw.gateway
    s = _open_stream(_port(gw.url), 200_000)
    try:
        _wait_for(lambda: g.dispatcher.backends[0].in_flight == 1, "the stream started")
        with gw.client(timeout=30) as c:
            r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 200, r.text
        _wait_for(lambda: not g.ledger.active and g.dispatcher.backends[0].in_flight == 0, "everything ended")
        closed, _ = _closed_within(s, 10)  # the cut-off connection is closed (reading it now gives its end)
        assert closed
    finally:
        s.close()
    text = httpx.get(gw.url + "/metrics").text
    assert 'headway_rejections_total{reason="client_send_timeout",tenant="default",tier="standard"} 1.0' in text
    assert 'reason="client_disconnected"' not in text
    assert stub.stub.stats.running == 0


class _Transport:
    """What the send deadline reads of a connection's transport: its write buffer's size."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.size

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_the_send_deadline_is_on_taking_nothing_not_on_a_slow_pace():
    """A client that takes some of its buffered answer within each deadline (a slow link, a big
    answer read slowly) is not cut off; one that takes nothing within a whole deadline is, and its
    request is marked; the deadline is off once the buffer is back under its low-water mark."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.server import ServerState

    from headway.serve._conn import SEND_TIMED_OUT, guarded_protocol

    async def app(scope: object, receive: object, send: object) -> None:
        pass

    async def main() -> None:
        cls = guarded_protocol(10.0, 100, 1, send_timeout_s=60.0)  # (its timer never fires here: called by hand)
        p = cls(Config(app), ServerState(), {})
        t = _Transport(200_000)
        p.transport, p.flow = t, FlowControl(t)  # type: ignore[assignment]
        p.cycle = types.SimpleNamespace(response_complete=False, scope={})  # type: ignore[assignment]
        p.pause_writing()  # the write buffer went over its high-water mark: the deadline is armed
        assert p._send_timer is not None
        for _ in range(5):  # a slow reader: some bytes taken within each deadline
            t.size -= 1000
            p._send_timer.cancel()
            p._send_timed_out()
            assert not t.aborted and p._send_timer is not None
        p.resume_writing()  # under the low-water mark: no deadline while the buffer is not full
        assert p._send_timer is None and not t.aborted
        p.pause_writing()
        p._send_timer.cancel()
        p._send_timed_out()  # nothing taken within a whole deadline: cut off
        assert t.aborted and p.cycle.scope == {SEND_TIMED_OUT: True} and cls.num_send_timeouts == 1

    asyncio.run(main())


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
def test_a_client_gone_before_its_body_is_in_is_counted_not_a_traceback(make_stub, make_gateway, path):
    """20 clients each send a request head and half its body, then close: no ``Exception in ASGI
    application`` (uvicorn's ERROR with a traceback, which any client could have written at will);
    a scheduled request is counted as ``client_disconnected``, and the gateway still serves."""
    import logging

    stub = make_stub()
    gw = make_gateway([stub.url])
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    body = json.dumps(COMPLETION).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    try:
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", _port(gw.url))) as s:
                s.sendall(head.encode() + body[: len(body) // 2])
                time.sleep(0.01)  # the head is read and the handler waits for the rest
        with gw.client() as c:
            assert c.post("/v1/completions", json=COMPLETION).status_code == 200
        if path == "/v1/completions":
            want = 'headway_rejections_total{reason="client_disconnected",tenant="default",tier="standard"} 20.0'
            _wait_for(lambda: want in httpx.get(gw.url + "/metrics").text, "the 20 counted")
        else:
            time.sleep(0.5)  # (nothing to wait for: the handlers end as the connections close)
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []
    assert stub.stub.stats.started == 1


# ------------------------------------------------------------------------------ the log
def test_a_clients_text_quoted_in_a_log_message_cannot_forge_a_log_line(make_stub, make_gateway, monkeypatch):
    """A scorer whose error quotes the prompt (as a tokenizer's may): a prompt carrying a newline, a
    made-up log line and a terminal escape is logged, in the default text format, on one line, with
    the newline and the escape written as ``\\n`` and ``\\x1b``."""
    import logging

    from headway.serve._logging import setup_logging

    def quoting(prompts: list[str]) -> list[float]:
        raise RuntimeError(f"cannot score {prompts[0]}")

    forged = "hi\n2026-01-01 00:00:00,000 INFO headway.serve: forged\x1b[2J"
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars", scorer=_scorer_module(monkeypatch, quoting))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("headway")
    logger.addHandler(handler)
    try:
        with gw.client() as c:
            assert c.post("/v1/completions", json={**COMPLETION, "prompt": forged}).status_code == 200
        _wait_for(lambda: any("forged" in r.getMessage() for r in records), "the scorer's error logged")
    finally:
        logger.removeHandler(handler)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info")  # the default: text
        formatter = root.handlers[0].formatter
        assert formatter is not None
        lines = [formatter.format(r) for r in records if "forged" in r.getMessage()]
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert lines
    for line in lines:
        assert "\n" not in line and "\x1b" not in line, line
        assert "hi\\n2026-01-01 00:00:00,000 INFO headway.serve: forged\\x1b[2J" in line


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_in_the_model_name_does_not_break_metrics(make_stub, make_gateway, stream):
    """A request naming the model ``"m\\ud800"`` (JSON's escape of a lone surrogate, which no UTF-8 text
    holds) is served, labelled ``m\\ufffd`` in the latency metrics, and /metrics still answers 200 (it
    was a 500 at every scrape after it, for the admin and for each tenant)."""
    stub = make_stub()
    gw = make_gateway([stub.url])
    raw = b'{"model": "m\\ud800", "prompt": "x", "max_tokens": 2, "stream": %s}' % (b"true" if stream else b"false")
    with gw.client() as c:
        r = c.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        m = c.get("/metrics")
    assert m.status_code == 200
    assert 'headway_e2e_request_latency_seconds_count{model="m\ufffd",priority="0"' in m.text


def test_a_tenant_name_that_is_not_text_is_refused_where_it_is_configured():
    """A lone surrogate in a tenant's name (JSON's ``"\\ud800"``, in a Redis record or in
    ``HEADWAY_TENANTS``) was accepted, and as the ``tenant`` label of the requests it served it
    made every later /metrics a 500 (the text cannot be written as UTF-8)."""
    from headway.serve import ConfigError, GatewayConfig, TenantConfig
    from headway.serve._tenants import TenantDirectory

    class _Redis:
        async def hget(self, name: str, key: str) -> bytes | None:
            return b'{"tenant": "acme\\ud800", "tier": "premium"}'

    config = GatewayConfig(backends=(BackendConfig("http://127.0.0.1:9"),), api_keys="required", redis_url="redis://x")
    assert asyncio.run(TenantDirectory(config, _Redis()).resolve("Bearer sk-x")) is None  # a 401
    with pytest.raises(ConfigError, match="UTF-8 text"):
        TenantConfig("acme\ud800")
