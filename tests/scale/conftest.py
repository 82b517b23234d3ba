"""Fixtures for multi-process tests: a Cluster of real processes under a tmp dir."""

from __future__ import annotations

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
    """A fresh redis-server for this test (AOF on, fsync always)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found")
    return cluster.redis()
