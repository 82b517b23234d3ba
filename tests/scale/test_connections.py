"""Connection floods against a gateway process with few file descriptors (``ulimit -n 1024``)."""

from __future__ import annotations

import shutil
import socket
import sys
import time

import httpx
import pytest

from harness.cluster import Cluster, Proc
from headway.serve import free_port


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_connection_flood_leaves_other_clients_served_and_the_log_short(cluster: Cluster):
    """Issue 27 item 5: with ``ulimit -n 1024`` (cap: 256 connections), 1,100 idle connections.
    Those over the cap get a 503 ``too_many_connections`` at once (far over it, a reset); a
    client arriving meanwhile is answered (or reset) within 5 s (about 2 s on a busy 2-core
    machine), one arriving once the idle ones are gone is served; the gateway never runs out
    of file descriptors, and its log stays under 20 KB."""
    stub = cluster.stub()
    port = free_port()
    argv = ["prlimit", "--nofile=1024:1024", sys.executable, "-m", "headway.serve", "serve", "--port", str(port),
            "--log-level", "warning", "--backend", stub.url]  # fmt: skip
    gw = Proc(f"gateway-{port}", argv, port, cluster.dir / f"gateway-{port}.log", health="/health")
    cluster.procs.append(gw)
    gw.start()
    socks: list[socket.socket] = []
    statuses: list[bytes] = []
    try:
        for _ in range(1100):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        t0 = time.monotonic()
        try:
            r = httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
            got = str(r.status_code)
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "too_many_connections"
        except httpx.TransportError as exc:  # far over the cap: closed at once
            got = type(exc).__name__
        took = time.monotonic() - t0
        print(f"answered {got} in {took:.2f} s")
        assert got in ("200", "503", "ReadError", "RemoteProtocolError") and took < 5.0, gw.log_text()[-2000:]
        for s in socks[-100:]:  # over the cap: answered at once
            s.settimeout(2)
            try:
                statuses.append(s.recv(64).split(b"\r\n")[0])
            except OSError:
                statuses.append(b"")
    finally:
        for s in socks:
            s.close()
    # over the cap: a 503, or closed (far over it); never a wait
    assert statuses.count(b"HTTP/1.1 503 Service Unavailable") + statuses.count(b"") == 100
    deadline = time.monotonic() + 5.0  # the idle ones closed: served again
    while (code := httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code) != 200:
        assert code == 503 and time.monotonic() < deadline
        time.sleep(0.2)
    log = gw.log_text()
    assert "Too many open files" not in log and len(log) < 20_000, log[-2000:]
