"""Gateway overhead against the stub backend: sustained requests/s and added latency.

Starts the stub backend and the gateway (policy fcfs unless --policy) as subprocesses on
127.0.0.1 and drives them with a minimal keep-alive HTTP/1.1 client (so the client costs
little CPU). Requests are non-streaming completions with ``max_tokens=1`` and a stub
that answers at once, so what is measured is the gateway's own cost.

1. Throughput: ``--connections`` closed-loop connections for ``--seconds``, hitting the
   gateway, then the stub directly.
2. Latency at a fixed offered load (``--rate`` req/s, paced over 8 connections) and
   sequentially (one connection): p50/p99 through the gateway minus direct.

Usage: python benchmarks/bench_gateway_overhead.py [--seconds 5] [--connections 32] [--rate 200]
Everything is bounded by --seconds per phase; the processes are killed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test harnesses live with the tests
from harness.cluster import Cluster

BODY = json.dumps({"model": "stub-model", "prompt": "hello world", "max_tokens": 1}).encode()


def _request_bytes(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> bool:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return head.startswith(b"HTTP/1.1 200")


async def closed_loop(port: int, connections: int, seconds: float) -> tuple[float, int]:
    req = _request_bytes("/v1/completions", BODY)
    done = errors = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                if await _roundtrip(reader, writer, req):
                    done += 1
                else:
                    errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*[worker() for _ in range(connections)]), seconds + 30)
    return done / (time.perf_counter() - t0), errors


async def paced(port: int, rate: float, seconds: float, connections: int = 8) -> list[float]:
    """Latencies at ``rate`` req/s offered over ``connections`` (each paced at rate/connections)."""
    req = _request_bytes("/v1/completions", BODY)
    lat: list[float] = []
    period = connections / rate

    async def worker(offset: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            t_next = time.perf_counter() + offset
            stop = time.perf_counter() + seconds
            while t_next < stop and time.perf_counter() < stop:
                delay = t_next - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t = time.perf_counter()
                await _roundtrip(reader, writer, req)
                lat.append(time.perf_counter() - t)
                t_next += period
        finally:
            writer.close()

    await asyncio.wait_for(
        asyncio.gather(*[worker(i * period / connections) for i in range(connections)]), seconds + 30
    )
    return lat


async def sequential(port: int, seconds: float) -> list[float]:
    return await paced(port, rate=1e9, seconds=seconds, connections=1)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--rate", type=float, default=200.0, help="offered load for the latency phase")
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--scorer", default=None, help="gateway --scorer (e.g. 'default' for the trained predictor)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="headway-gw-overhead-")
    procs = Cluster(Path(tmp.name))
    stub = procs.stub()
    gw_args = ["--policy", args.policy, "--backend-concurrency", "256"]
    if args.scorer:
        gw_args += ["--scorer", args.scorer]
    gw = procs.gateway([stub.url], *gw_args, start=False).start(timeout=30)  # a scorer may load a model
    stub_port, gw_port = stub.port, gw.port
    try:
        res: dict[str, object] = {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
            "policy": args.policy,
            "scorer": args.scorer,
            "seconds": args.seconds,
        }
        for name, port in (("gateway", gw_port), ("direct", stub_port)):
            asyncio.run(closed_loop(port, 4, 0.5))  # warm up
            rps, errors = asyncio.run(closed_loop(port, args.connections, args.seconds))
            lat = asyncio.run(paced(port, args.rate, args.seconds))
            seq = asyncio.run(sequential(port, min(args.seconds, 3.0)))
            res[name] = {
                "throughput_rps": round(rps, 1),
                "errors": errors,
                f"p50_ms_at_{args.rate:g}rps": round(_pct(lat, 50), 3),
                f"p99_ms_at_{args.rate:g}rps": round(_pct(lat, 99), 3),
                "p50_ms_sequential": round(_pct(seq, 50), 3),
                "p99_ms_sequential": round(_pct(seq, 99), 3),
            }
        g, d = res["gateway"], res["direct"]
        assert isinstance(g, dict) and isinstance(d, dict)
        res["added_ms"] = {k: round(g[k] - d[k], 3) for k in g if k.startswith("p")}
        print(json.dumps(res, indent=2))
        if g["errors"]:
            print(f"error: {g['errors']} requests through the gateway failed; nothing written", file=sys.stderr)
            return 1
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(res, fh, indent=2)
    finally:
        procs.close()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_gateway_overhead"))
