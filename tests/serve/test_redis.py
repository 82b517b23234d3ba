"""Queue state and API keys in a real redis-server: replicas share one global order."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid

import httpx
import pytest

from headway.core import PolicyKey, Request, Tier
from headway.policies import FCFSPolicy
from headway.serve import BackendConfig, hash_api_key
from headway.serve._redis_scripts import KeyEncodingError, encode_key
from headway.serve._tenants import REDIS_APIKEYS_HASH

from .conftest import free_port, start_redis_server, wait_until

pytestmark = pytest.mark.redis


def _client(redis_url: str):  # sync client for setup/inspection
    import redis

    return redis.Redis.from_url(redis_url)


def test_key_encoding_preserves_order():
    keys = [(-5.0, 1), (-0.5, 0), (0.0, 0), (0.0, 3), (1e-9, 0), (2, -1), (2, 0), (1e12, 0)]
    enc = [encode_key(k) for k in keys]
    assert enc == sorted(enc)


def test_api_keys_from_redis(redis_url, make_stub, make_gateway):
    r = _client(redis_url)
    r.hset(REDIS_APIKEYS_HASH, hash_api_key("sk-redis"), json.dumps({"tenant": "blue", "tier": "batch"}))
    stub = make_stub()
    gw = make_gateway([stub.url], redis_url=redis_url, redis_prefix=f"t{uuid.uuid4().hex[:6]}:", api_keys="required")
    with gw.client() as c:
        assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        bad = {"Authorization": "Bearer sk-other"}
        assert c.post("/v1/completions", json={"prompt": "x"}, headers=bad).status_code == 401
        ok = {"Authorization": "Bearer sk-redis"}
        resp = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=ok)
        assert resp.status_code == 200, resp.text
    done = gw.gateway.finished_requests[-1]
    assert (done.tenant_id, done.tier) == ("blue", Tier.BATCH)


def test_a_tenant_known_from_redis_reads_an_empty_queue_as_0(redis_url, make_stub, make_gateway):
    """Its queue-length series stays once it has queued (at 0 when idle), though no scrape saw it queued."""
    r = _client(redis_url)
    r.hset(REDIS_APIKEYS_HASH, hash_api_key("sk-green"), json.dumps({"tenant": "green", "tier": "premium"}))
    gw = make_gateway([make_stub().url], redis_url=redis_url, redis_prefix=f"t{uuid.uuid4().hex[:6]}:",
                      api_keys="required")  # fmt: skip
    key = {"Authorization": "Bearer sk-green"}
    assert "headway_queue_length{" not in httpx.get(gw.url + "/metrics", headers=key).text  # not known yet
    resp = httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=key)
    assert resp.status_code == 200, resp.text
    assert 'headway_queue_length{tenant="green",tier="premium"} 0.0' in httpx.get(gw.url + "/metrics", headers=key).text


def test_two_replicas_share_one_global_order(redis_url, make_stub, make_gateway):
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub(token_delay_s=0.008)
    backends = [BackendConfig(stub.url, max_concurrency=1)]  # one slot over both replicas
    a = make_gateway(backends, policy="sjf-oracle", redis_url=redis_url, redis_prefix=prefix)
    b = make_gateway(backends, policy="sjf-oracle", redis_url=redis_url, redis_prefix=prefix)
    for gw in (a, b):  # warm up: Redis connections and Lua scripts loaded
        assert httpx.post(gw.url + "/v1/completions", json={"prompt": "w", "max_tokens": 1}).status_code == 200
    plan = [(a, 150), (b, 30), (a, 20), (b, 4), (a, 12), (b, 8)]
    r = _client(redis_url)
    results: list[int] = []
    max_running = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal max_running
        while not stop.is_set():
            max_running = max(max_running, stub.stub.stats.running)
            time.sleep(0.002)

    def send(gw, n: int) -> None:
        body = {"model": "m", "prompt": f"p{n}", "max_tokens": n}
        results.append(httpx.post(gw.url + "/v1/completions", json=body, timeout=30).status_code)

    w = threading.Thread(target=watch)
    w.start()
    threads = []
    for gw, n in plan:
        t = threading.Thread(target=send, args=(gw, n))
        t.start()
        threads.append(t)
        k = len(threads) - 1  # requests queued in Redis once this one arrived
        wait_until(lambda k=k: stub.stub.stats.running == 1 and r.zcard(prefix + "queue") == k, what="queued")
    for t in threads:
        t.join(timeout=30)
    stop.set()
    w.join()
    assert results == [200] * 6
    assert stub.stub.stats.order[2:] == ["p150", "p4", "p8", "p12", "p20", "p30"]
    assert max_running == 1  # the concurrency limit held across replicas
    assert r.zcard(prefix + "queue") == 0
    assert int(r.hget(prefix + "inflight", stub.url) or 0) == 0


def test_disconnect_while_queued_leaves_the_shared_queue(redis_url, make_stub, make_gateway):
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub(token_delay_s=0.01)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], redis_url=redis_url, redis_prefix=prefix)
    blocker = threading.Thread(
        target=httpx.post, args=(gw.url + "/v1/completions",), kwargs={"json": {"prompt": "x", "max_tokens": 150}}
    )
    blocker.start()
    wait_until(lambda: gw.gateway.backends[0].in_flight == 1, what="blocker running")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/completions", json={"prompt": "y"}, timeout=0.3)
    r = _client(redis_url)
    wait_until(lambda: r.zcard(prefix + "queue") == 0, what="shared queue emptied")
    blocker.join()
    wait_until(lambda: int(r.hget(prefix + "inflight", stub.url) or 0) == 0, what="slot released")
    assert stub.stub.stats.started == 1


def test_shared_queue_limit_gives_429(redis_url, make_stub, make_gateway):
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub(token_delay_s=0.01)
    backends = [BackendConfig(stub.url, max_concurrency=1)]
    a = make_gateway(backends, redis_url=redis_url, redis_prefix=prefix, max_queue_len=1)
    b = make_gateway(backends, redis_url=redis_url, redis_prefix=prefix, max_queue_len=1)
    threads = [
        threading.Thread(target=httpx.post, args=(a.url + "/v1/completions",),
                         kwargs={"json": {"prompt": "x", "max_tokens": 100}, "timeout": 20})
        for _ in range(2)
    ]  # fmt: skip
    for t in threads:
        t.start()
        time.sleep(0.05)
    r = _client(redis_url)
    wait_until(lambda: r.zcard(prefix + "queue") == 1, what="one queued")
    resp = httpx.post(b.url + "/v1/completions", json={"prompt": "z"}, timeout=10)
    for t in threads:
        t.join()
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1"


# ------------------------------------------------------------------ score hold over replicas
def _replicas(redis_url: str, hold: float, n: int = 2, policy: str = "pars", policy_args: dict | None = None) -> list:
    import redis.asyncio as aioredis

    from headway.core import make_policy
    from headway.serve._dispatch import Backend
    from headway.serve._redis_queue import RedisDispatcher

    prefix = f"t{uuid.uuid4().hex[:6]}:"
    return [
        RedisDispatcher(
            make_policy(policy, **(policy_args or {})),
            [Backend(BackendConfig("http://127.0.0.1:9", max_concurrency=1), 0)],  # one slot over all replicas
            aioredis.from_url(redis_url),
            max_queue_len=100,
            prefix=prefix,
            score_hold_s=hold,
        )
        for _ in range(n)
    ]


async def wait_until_queued(r, prefix: str, request_id: str, fut: asyncio.Future) -> None:
    """Until the request is in the shared queue, or was dispatched from it."""
    for _ in range(500):
        if fut.done() or any(m.decode().endswith("|" + request_id) for m in r.zrange(prefix + "queue", 0, -1)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{request_id} was never queued")


def _req(name: str, score: float, now: float):
    from headway.core import Request

    return Request(request_id=name, arrival_time=now, num_prompt_tokens=8, max_tokens=16, score=score)


def test_replicas_hold_free_slots_while_any_replica_scores_more_than_is_queued(redis_url):
    async def main() -> tuple[bool, str, bool]:
        a, b = _replicas(redis_url, hold=5.0)
        for d in (a, b):
            await d.start()
        try:
            a.scoring = 2  # replica a is scoring two requests
            await asyncio.sleep(0.05)
            long = b.submit(_req("long", 9.0, b.now()))  # 2 being scored > 1 queued, over both replicas
            await asyncio.sleep(0.2)
            held = not long.done()
            a.scoring = 1  # a's first is scored: 1 being scored, 2 queued: no more hold
            short = a.submit(_req("short", 5.0, a.now()))
            done, _ = await asyncio.wait([long, short], timeout=5, return_when=asyncio.FIRST_COMPLETED)
            first = "short" if short in done else "long"
            return held, first, long.done()
        finally:
            for d in (a, b):
                await d.stop()
                await d.redis.aclose()

    held, first, long_done = asyncio.run(main())
    assert held  # the free slot waited for the scores
    assert first == "short" and not long_done  # then went to the better of the two


def test_a_redis_hold_ends_after_score_hold_s_and_with_the_replica_that_scored(redis_url):
    import redis

    async def main(hold: float, stop_scorer: bool) -> tuple[bool, float]:
        a, b = _replicas(redis_url, hold=hold)
        for d in (a, b):
            await d.start()
        try:
            a.scoring = 5  # a scorer that never answers
            await asyncio.sleep(0.05)
            assert redis.Redis.from_url(redis_url).hget(a.prefix + "scoring", a.replica) == b"5"
            t0 = time.monotonic()
            fut = b.submit(_req("r", 1.0, b.now()))
            await asyncio.sleep(0.1)
            early = fut.done()
            if stop_scorer:
                await a.stop()  # leaves: its scoring count goes with it
                assert redis.Redis.from_url(redis_url).hget(a.prefix + "scoring", a.replica) is None
                b.dispatch()
            await asyncio.wait_for(fut, 5)
            return early, time.monotonic() - t0
        finally:
            for d in (a, b):
                await d.stop()
                await d.redis.aclose()

    early, waited = asyncio.run(main(0.4, stop_scorer=False))
    assert not early and 0.35 < waited < 2.0  # held, then dispatched when the hold ran out
    early, waited = asyncio.run(main(30.0, stop_scorer=True))
    assert not early and waited < 2.0


def test_a_scoring_gateway_on_redis_holds_and_leaves_no_count_behind(redis_url, make_stub, make_gateway):
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub()
    gw = make_gateway(
        [BackendConfig(stub.url, max_concurrency=1)],
        policy="pars",
        scorer="headway.serve._stub:prompt_length_scores",
        redis_url=redis_url,
        redis_prefix=prefix,
        scorer_hold_s=1.0,  # off by default
    )
    d = gw.gateway.dispatcher
    assert d.score_hold_s == 1.0

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            bodies = [{"model": "m", "prompt": "x" * (8 - i), "max_tokens": 2} for i in range(8)]
            rs = await asyncio.gather(*[c.post("/v1/completions", json=body) for body in bodies])
        return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 8
    r = _client(redis_url)
    wait_until(lambda: r.hget(prefix + "scoring", d.replica) is None, what="the scoring count back to 0")
    assert d.scoring == 0 and r.hget(prefix + "scoring_seq", d.replica) is not None  # counts were sent


@pytest.mark.parametrize(
    "record",
    [
        json.dumps({"tenant": "n", "tier": None}),
        json.dumps({"tenant": "n", "tier": True}),
        json.dumps({"tenant": "n", "tier": "gold"}),
        json.dumps({"tenant": "n", "tier": ["batch"]}),
        json.dumps({"tenant": None, "tier": "batch"}),
        json.dumps(["n", "batch"]),
        "{not json",
    ],
)
def test_malformed_api_key_record_is_a_401_and_a_warning(redis_url, make_stub, make_gateway, caplog, record):
    key = f"sk-bad-{uuid.uuid4().hex}"
    digest = hash_api_key(key)
    _client(redis_url).hset(REDIS_APIKEYS_HASH, digest, record)
    stub = make_stub()
    gw = make_gateway([stub.url], redis_url=redis_url, redis_prefix=f"t{uuid.uuid4().hex[:6]}:", api_keys="required")
    with caplog.at_level(logging.WARNING, logger="headway.serve"), gw.client() as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401, r.text  # it used to reset the connection (an AttributeError)
    assert r.json()["error"]["code"] == "invalid_api_key"
    warnings = [m.getMessage() for m in caplog.records if "malformed API-key record" in m.getMessage()]
    assert len(warnings) == 1 and digest[:12] in warnings[0]
    assert key not in caplog.text and digest not in caplog.text
    assert stub.stub.stats.started == 0


def test_tenant_weighted_replicas_share_one_virtual_time(redis_url):
    """Start tags are drawn from the shared state, so a new replica's requests do not sort ahead of an
    older one's; the virtual time advances to each dispatched request's start tag."""
    r = _client(redis_url)

    async def main() -> tuple[list[float], list[str], float]:
        a, b = _replicas(redis_url, hold=0.0, policy="tenant-weighted", policy_args={"weights": [4, 2, 1]})
        for d in (a, b):
            await d.start()
        try:
            futs, reqs = [], []
            for d, name, tier in [(a, "a-batch-0", Tier.BATCH), (a, "a-batch-1", Tier.BATCH),
                                  (b, "b-batch-2", Tier.BATCH), (b, "b-premium", Tier.PREMIUM)]:  # fmt: skip
                req = Request(name, d.now(), 8, 16, tier=tier)
                reqs.append(req)
                futs.append(d.submit(req))
                await wait_until_queued(r, d.prefix, name, futs[-1])
            tags = [float(req.extra["driftsched.start_tag"]) for req in reqs]
            order: list[str] = []
            while len(order) < len(reqs):  # the one slot: dispatch, then release, one at a time
                fut = next((f for f, q in zip(futs, reqs, strict=True) if f.done() and q.request_id not in order), None)
                if fut is None:
                    await asyncio.wait([f for f in futs if not f.done()], return_when=asyncio.FIRST_COMPLETED)
                    continue
                req = reqs[futs.index(fut)]
                order.append(req.request_id)
                owner = a if req.request_id.startswith("a-") else b
                await asyncio.sleep(0.05)  # the advance of the virtual time lands
                owner.release(fut.result())
            for _ in range(200):  # the last advance is a task of its own: let it land
                if float(r.get(a.prefix + "sfq:v") or 0) == 2.0:
                    break
                await asyncio.sleep(0.01)
            return tags, order, float(r.get(a.prefix + "sfq:v") or 0)
        finally:
            for d in (a, b):
                await d.stop()
                await d.redis.aclose()

    tags, order, v = asyncio.run(main())
    # batch (weight 1) tags continue across the replicas: 0, 1, 2; b's premium starts at the virtual time
    assert tags[:3] == [0.0, 1.0, 2.0]
    assert order[0] == "a-batch-0" and set(order) == {"a-batch-0", "a-batch-1", "b-batch-2", "b-premium"}
    assert order.index("b-premium") < order.index("b-batch-2")  # its tag (<= 1) is below b's batch tag 2
    assert v == 2.0  # the last dispatched start tag


def test_out_of_range_priority_on_redis_is_a_400(redis_url, make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([stub.url], policy="priority", redis_url=redis_url, redis_prefix=f"t{uuid.uuid4().hex[:6]}:")
    raw = b'{"prompt": "x", "max_tokens": 2, "priority": ' + b"9" * 400 + b"}"
    with gw.client(timeout=5.0) as c:
        r = c.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "priority": -5}).status_code == 200


class _HugeKeyPolicy(FCFSPolicy):
    """Keys no double holds: the Redis queue cannot encode them."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (10**400,)


def test_a_key_redis_cannot_encode_fails_the_request_at_once(redis_url, make_stub, make_gateway):
    stub = make_stub()
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    gw = make_gateway([stub.url], policy_obj=_HugeKeyPolicy(), redis_url=redis_url, redis_prefix=prefix,
                      queue_ttl_s=20)  # fmt: skip
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert time.monotonic() - t0 < 5  # it used to wait out the queue TTL
    assert r.status_code == 500 and r.json()["error"]["code"] == "policy_error"
    assert "cannot be queued in Redis" in r.json()["error"]["message"]
    assert stub.stub.stats.started == 0 and not gw.gateway.active
    assert _client(redis_url).zcard(prefix + "queue") == 0


def test_encode_key_rejects_what_a_double_cannot_order():
    with pytest.raises(KeyEncodingError, match=r"cannot be queued in Redis"):
        encode_key((10**400,))
    with pytest.raises(KeyEncodingError, match="NaN"):
        encode_key((1.0, float("nan")))
    assert encode_key((float("-inf"),)) < encode_key((-(2**53),)) < encode_key((2**53,)) < encode_key((float("inf"),))


class _FlipOnFinishPolicy(FCFSPolicy):
    """FCFS until the first request finishes; then last-come-first-served, with ``key_epoch``
    bumped (as gamma-Ada does when gamma changes): every key it gave before is stale."""

    def __init__(self) -> None:
        self.lifo = False

    def key(self, request: Request, now: float) -> PolicyKey:
        return (-request.arrival_time if self.lifo else request.arrival_time,)

    def on_finish(self, request: Request, now: float) -> None:
        if not self.lifo:
            self.lifo = True
            self.key_epoch += 1


def test_a_key_epoch_bump_reorders_the_members_already_in_redis(redis_url, make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.01)
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=1)], policy_obj=_FlipOnFinishPolicy(),
                      redis_url=redis_url, redis_prefix=prefix)  # fmt: skip
    r = _client(redis_url)
    threads = []
    # the first runs (2 s: long enough for the others to queue behind it on a loaded machine, where 0.3 s
    # was not); the others queue in Redis, FCFS keys
    for i, n in enumerate((200, 20, 20, 20)):
        body = {"model": "m", "prompt": f"p{i}", "max_tokens": n}
        t = threading.Thread(target=httpx.post, args=(gw.url + "/v1/completions",),
                             kwargs={"json": body, "timeout": 30})  # fmt: skip
        t.start()
        threads.append(t)
        wait_until(lambda i=i: stub.stub.stats.running == 1 and r.zcard(prefix + "queue") == i, what="queued")
    for t in threads:
        t.join(timeout=30)
    # p0's finish flipped the order; p1 was granted as p0's slot came free, before the policy learned
    # anything; p2 and p3 were re-keyed in Redis, so the newest goes first (before: p1 p2 p3)
    assert stub.stub.stats.order == ["p0", "p1", "p3", "p2"]
    assert r.zcard(prefix + "queue") == 0


def test_health_is_degraded_while_redis_is_unreachable(redis_url, make_stub, make_gateway, tmp_path):
    """A load balancer should route elsewhere while this replica's queue store is gone."""
    port = free_port()
    proc = start_redis_server(port, tmp_path)
    try:
        gw = make_gateway([make_stub().url], redis_url=f"redis://127.0.0.1:{port}/0", redis_lease_s=0.6)
        assert httpx.get(gw.url + "/health").json()["status"] == "ok"
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: httpx.get(gw.url + "/health").status_code == 503, timeout=10, what="degraded")
        assert httpx.get(gw.url + "/health").json() == {
            "status": "degraded", "reason": "queue store unreachable", "queued": 0
        }
        proc = start_redis_server(port, tmp_path)  # back (empty: the replica rejoins)
        wait_until(lambda: httpx.get(gw.url + "/health").status_code == 200, timeout=10, what="ok again")
        assert httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_two_replicas_wait_out_a_full_backend_s_503s(redis_url, make_stub, make_gateway):
    """vLLM's --max-num-queued-reqs behind two replicas sharing one queue: each replica, allowed 4
    there, meets 503s (2 unfinished at most); it sends the request back to the shared queue, and
    every request of a burst spread over both is served."""
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub(max_num_seqs=1, token_delay_s=0.005, max_num_queued_reqs=2)
    backends = [BackendConfig(stub.url, max_concurrency=4)]
    a = make_gateway(backends, redis_url=redis_url, redis_prefix=prefix)
    b = make_gateway(backends, redis_url=redis_url, redis_prefix=prefix)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as c:
            rs = await asyncio.gather(
                *[c.post(gw.url + "/v1/completions", json={"prompt": f"p{i}", "max_tokens": 8})
                  for i, gw in enumerate([a, b] * 4)]
            )  # fmt: skip
        return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 8
    assert stub.stub.stats.rejected > 0 and stub.stub.stats.most_unfinished == 2
    r = _client(redis_url)
    wait_until(lambda: int(r.hget(prefix + "inflight", stub.url) or 0) == 0, what="the slots released")
    assert r.zcard(prefix + "queue") == 0
