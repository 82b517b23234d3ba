"""Fixtures for multi-process tests: a Cluster of real processes under a tmp dir."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import httpx
import pytest

from harness.cluster import Cluster, RedisProc

LOG_TAIL_LINES = 40


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """A failed test's report carries the last lines of each of its cluster's process logs (the
    gateway's warnings say which request failed on which backend, and why): the logs live in the
    test's tmp dir, which a CI run does not keep."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if not report.failed or not isinstance(cluster, Cluster):
        return
    for proc in cluster.procs:
        lines = proc.log_text().splitlines()
        if lines:
            tail = "\n".join(lines[-LOG_TAIL_LINES:])
            report.sections.append((f"{proc.name} log (last {LOG_TAIL_LINES} lines)", tail))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def redis_proc(cluster: Cluster) -> Iterator[RedisProc]:
    """A fresh redis-server for this test (AOF on, fsync always); skips without one, or fails
    with HEADWAY_REQUIRE_REDIS=1 (as CI sets), like the gateway tests' ``redis_url``.

    After the test, while its processes still run: the backend slots counted in Redis
    (``headway:inflight``) must come to equal the requests each stub backend is running."""
    if shutil.which("redis-server") is None:
        msg = "redis-server not found (apt-get install -y redis-server)"
        if os.environ.get("HEADWAY_REQUIRE_REDIS") == "1":
            pytest.fail(msg + " and HEADWAY_REQUIRE_REDIS=1")
        pytest.skip(msg)
    proc = cluster.redis()
    yield proc
    if proc.alive():
        check_slots_match_running(cluster, proc)


def check_slots_match_running(cluster: Cluster, redis: RedisProc, timeout: float = 10.0) -> None:
    """Wait until ``headway:inflight`` equals, per backend, what its stub is running."""
    stubs = {p.url: p for p in cluster.procs if p.name.startswith("stub-") and p.alive()}

    def pair() -> tuple[dict[str, int], dict[str, int]]:
        held = {k.decode(): int(v) for k, v in redis.client().hgetall("headway:inflight").items()}
        running = {url: int(httpx.get(url + "/stub/stats", timeout=5).json()["running"]) for url in stubs}
        return {u: n for u, n in held.items() if n or u in stubs}, running

    deadline = time.monotonic() + timeout
    while True:
        held, running = pair()
        if all(held.get(u, 0) == running.get(u, 0) for u in set(held) | set(running)):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"backend slots held in Redis {held} != requests the stubs run {running}")
        time.sleep(0.1)
