"""Gateway replicas (separate processes) sharing one Redis: one global order, nothing lost
or dispatched twice."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from harness.cluster import Cluster, RedisProc, wait_for

pytestmark = pytest.mark.redis


CLIENT = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=64))


@pytest.fixture(scope="module", autouse=True)
def _close_client() -> Iterator[None]:
    yield
    CLIENT.close()


def _stats(stub_url: str) -> dict:
    return CLIENT.get(stub_url + "/stub/stats").json()


def _post(url: str, body: dict) -> httpx.Response:
    return CLIENT.post(url + "/v1/completions", json=body)


def assert_clean(redis_proc: RedisProc, prefix: str = "headway:") -> None:
    """No queue entries, slots or grants left over."""
    r = redis_proc.client()
    assert r.zcard(prefix + "queue") == 0
    assert all(int(v) == 0 for v in r.hvals(prefix + "inflight"))
    for key in r.scan_iter(prefix + "held:*"):
        assert all(int(v) == 0 for v in r.hvals(key))
    for key in r.scan_iter(prefix + "grant:*"):
        assert r.llen(key) == 0


def test_three_replicas_follow_one_global_policy_order(cluster: Cluster, redis_proc: RedisProc):
    stub = cluster.stub(token_delay_s=0.02)
    gws = [
        cluster.gateway([stub.url], "--policy", "sjf-oracle", "--backend-concurrency", "1",
                        redis_url=redis_proc.redis_url)
        for _ in range(3)
    ]  # fmt: skip
    for gw in gws:  # warm up: connections, Lua scripts
        assert _post(gw.url, {"prompt": "warm", "max_tokens": 1}).status_code == 200
    r = redis_proc.client()
    # a streamed blocker holds the only backend slot (over all replicas) while the rest queue
    release_blocker = threading.Event()

    def blocker() -> None:
        body = {"prompt": "block", "max_tokens": 5000, "stream": True}
        with CLIENT.stream("POST", gws[0].url + "/v1/completions", json=body) as resp:
            for _ in resp.iter_lines():
                if release_blocker.is_set():
                    break  # disconnect: the gateway cancels it upstream and frees the slot

    b = threading.Thread(target=blocker)
    b.start()
    wait_for(lambda: _stats(stub.url)["running"] == 1, what="blocker running")
    plan = [(1, 30), (2, 20), (0, 4), (1, 12), (2, 8), (0, 25), (1, 2)]
    results: dict[int, int] = {}

    def send(i: int, gw_index: int, n: int) -> None:
        results[i] = _post(gws[gw_index].url, {"prompt": f"p{n}", "max_tokens": n}).status_code

    threads = []
    for i, (g, n) in enumerate(plan):
        t = threading.Thread(target=send, args=(i, g, n))
        t.start()
        threads.append(t)
        wait_for(lambda i=i: r.zcard("headway:queue") == i + 1, what=f"{i + 1} queued")
    release_blocker.set()
    b.join(timeout=30)
    for t in threads:
        t.join(timeout=60)
    assert list(results.values()) == [200] * len(plan)
    order = _stats(stub.url)["order"][3:]
    assert order == ["block", "p2", "p4", "p8", "p12", "p20", "p25", "p30"]  # shortest first, whoever took it
    assert_clean(redis_proc)


@pytest.mark.slow
def test_many_requests_over_three_replicas_none_lost_none_twice(cluster: Cluster, redis_proc: RedisProc):
    stub = cluster.stub(token_delay_s=0.002)
    gws = [
        cluster.gateway([stub.url], "--policy", "fcfs", "--backend-concurrency", "4", redis_url=redis_proc.redis_url)
        for _ in range(3)
    ]
    rng = random.Random(7)
    n = 300
    jobs = [(i, rng.randrange(3), rng.randint(1, 8)) for i in range(n)]

    def send(job: tuple[int, int, int]) -> tuple[int, int]:
        i, g, k = job
        return i, _post(gws[g].url, {"prompt": f"r{i}", "max_tokens": k}).status_code

    with ThreadPoolExecutor(24) as pool:
        codes = dict(pool.map(send, jobs))
    assert sorted(codes) == list(range(n)) and set(codes.values()) == {200}
    stats = _stats(stub.url)
    assert stats["started"] == stats["completed"] == n
    assert sorted(stats["order"]) == sorted(f"r{i}" for i in range(n))  # each exactly once
    assert_clean(redis_proc)
