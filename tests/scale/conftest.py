"""Fixtures for multi-process tests: a Cluster of real processes under a tmp dir."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from headway.serve._cluster import Cluster, RedisProc


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def redis_proc(cluster: Cluster) -> RedisProc:
    """A fresh redis-server for this test (AOF on, fsync always); skips without one, or fails
    with HEADWAY_REQUIRE_REDIS=1 (as CI sets), like the gateway tests' ``redis_url``."""
    if shutil.which("redis-server") is None:
        msg = "redis-server not found (apt-get install -y redis-server)"
        if os.environ.get("HEADWAY_REQUIRE_REDIS") == "1":
            pytest.fail(msg + " and HEADWAY_REQUIRE_REDIS=1")
        pytest.skip(msg)
    return cluster.redis()
