"""Soak: good and hostile traffic, with faults, through two gateway replicas on one Redis.

Starts on 127.0.0.1, as subprocesses: a stub backend, a redis-server without persistence and
two gateway replicas sharing it (``pars`` with a cheap prompt-length scorer, two tenants
from the config). Then, for ``--duration-s``:

- good traffic, open loop at ``--rate`` requests/s over both replicas
  (``tests/harness/loadtest.py``: 2% invalid JSON, 1% wrong key, 1% oversized, 20% streamed);
- hostile traffic, one case every ``--hostile-every-s`` in turn: a slowloris connection (a
  header byte a second), a bare connection, a malformed request head, a lone-surrogate
  prompt, a token-id prompt, a ~500 KB prompt, ``n = 1000``, ``GET /health/`` with a foreign
  Host header;
- faults, every ``--fault-every-s`` in turn: Redis killed and restarted without its data
  (down 1 s), the stub backend killed and restarted (down 1 s).

Every ``--sample-s`` it records each replica's RSS and open file descriptors, the backend
slots held in Redis (``headway:inflight``, and per replica ``headway:held:*``) beside the
requests the stub is running, and the good traffic's running tally (sent, answered, lost).
At the end, once the traffic has stopped: no request lost, every hostile case answered as
expected, and no slot held. Writes ``benchmarks/results/soak.json`` (one file, overwritten).

Usage: python benchmarks/bench_soak.py [--duration-s 1800] [--rate 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from headway._files import write_atomic
from headway.serve import hash_api_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test harnesses live with the tests
from harness.cluster import Cluster, Proc, RedisProc
from harness.loadtest import LoadConfig, LoadResult, run_load

KEYS = ("sk-soak-a", "sk-soak-b")
RESULTS = Path(__file__).resolve().parent / "results"


def gateway_config(stub_url: str) -> dict[str, Any]:
    return {
        "policy": "pars",
        "scorer": "headway.serve._stub:prompt_length_scores",
        "max_queue_len": 200,
        "queue_ttl_s": 30.0,
        "max_body_bytes": 1 << 20,
        "client_header_timeout_s": 5.0,
        "keep_alive_timeout_s": 5.0,
        "redis_lease_s": 2.0,
        "redis_retry_s": 2.0,
        "backends": [{"url": stub_url, "max_concurrency": 8}],
        "tenants": [
            {"name": "a", "tier": "premium", "api_key_sha256": [hash_api_key(KEYS[0])]},
            {"name": "b", "tier": "batch", "api_key_sha256": [hash_api_key(KEYS[1])]},
        ],
    }


# ----------------------------------------------------------------------------- process probes
def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _slots(redis: RedisProc) -> tuple[int | None, int | None]:
    """Backend slots held in Redis: ``inflight`` summed, and every replica's ``held`` summed."""
    try:
        r = redis.client()
        inflight = sum(int(v) for v in r.hvals("headway:inflight"))
        held = sum(int(v) for k in r.keys("headway:held:*") for v in r.hvals(k))
        return inflight, held
    except Exception:
        return None, None


def _stub_running(stub: Proc) -> int | None:
    try:
        return int(httpx.get(stub.url + "/stub/stats", timeout=2).json()["running"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


# ----------------------------------------------------------------------------- hostile cases
async def _raw(port: int, send: bytes, *, drip: bytes = b"", wait_s: float = 15.0) -> tuple[str, float]:
    """Open a connection, send ``send``, then ``drip`` a byte a second; what the server did:
    its status line (``"HTTP/1.1 408 ..."``), ``"closed"`` (closed without answering) or
    ``"open"`` (still open after ``wait_s``), and when."""
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect_error:{type(exc).__name__}", 0.0
    try:
        if send:
            writer.write(send)
        data = b""
        for i in range(int(wait_s)):
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 1.0)
            except TimeoutError:
                if drip:
                    writer.write(drip[i % len(drip) : i % len(drip) + 1])
                continue
            if not chunk:
                break
            data += chunk
        else:
            return "open", time.monotonic() - t0
        line = data.split(b"\r\n", 1)[0].decode(errors="replace")
        return (line[:12] if line else "closed"), time.monotonic() - t0
    except (ConnectionError, OSError):
        return "reset", time.monotonic() - t0
    finally:
        writer.close()


HOSTILE = ("slowloris", "bare", "malformed", "surrogate", "token_ids", "big_prompt", "n_1000", "host_redirect")
EXPECTED: dict[str, set[str]] = {
    "slowloris": {"HTTP/1.1 408"},
    "bare": {"closed"},
    "malformed": {"HTTP/1.1 400"},
    "surrogate": {"200"},
    "token_ids": {"200"},
    "big_prompt": {"200"},
    "n_1000": {"400"},
    "host_redirect": {"404"},
}
"""What each hostile case must get when no fault is under way (during one, a 503 or 408 with
JSON is also right: those are counted apart, as ``during_fault``)."""


async def _hostile(kind: str, url: str, client: httpx.AsyncClient) -> tuple[str, float]:
    port = int(url.rsplit(":", 1)[1])
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    t0 = time.monotonic()
    if kind == "slowloris":
        return await _raw(port, b"POST /v1/completions HTTP/1.1\r\n", drip=b"Host: x\r\n")
    if kind == "bare":
        return await _raw(port, b"")
    if kind == "malformed":
        return await _raw(port, b"GARBAGE \x00\x01\r\n\r\n", wait_s=5)
    if kind == "host_redirect":
        r = await client.get(url + "/health/", headers={"Host": "evil.example"})
    elif kind == "n_1000":
        r = await client.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 1000}, headers=auth)
    else:
        prompt: Any = {"surrogate": "ab\ud800cd", "token_ids": [1, 2, 3], "big_prompt": "word " * 100_000}[kind]
        raw = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2}).encode()
        r = await client.post(url + "/v1/completions", content=raw,
                              headers={**auth, "Content-Type": "application/json"})  # fmt: skip
    return str(r.status_code), time.monotonic() - t0


# ----------------------------------------------------------------------------- the run
async def soak(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    stub = cluster.stub(token_delay_s=0.01)
    redis = cluster.redis(appendonly=False)
    conf = gateway_config(stub.url)
    gws = [cluster.gateway([], redis_url=redis.redis_url, config=conf) for _ in range(2)]
    t_start = time.monotonic()
    end = t_start + args.duration_s
    good = LoadResult()
    hostile: dict[str, Counter[str]] = {k: Counter() for k in HOSTILE}
    unexpected: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    fault_until = 0.0

    def now() -> float:
        return round(time.monotonic() - t_start, 1)

    async def good_traffic(i: int, gw: Proc) -> None:
        chunk_s = 30.0
        seed = i * 1_000_000
        while time.monotonic() + 1 < end:
            n = max(1, int(args.rate / len(gws) * min(chunk_s, end - time.monotonic())))
            cfg = LoadConfig(gw.url, num_requests=n, rate=args.rate / len(gws), api_keys=KEYS,
                             oversize_bytes=(1 << 20) + 1, seed=seed, timeout_s=120.0)  # fmt: skip
            seed += 1
            part = await run_load(cfg)
            good.sent += part.sent
            good.outcomes.update(part.outcomes)
            good.reasons.update(part.reasons)
            good.kinds.update(part.kinds)
            good.latencies += part.latencies

    async def hostile_traffic() -> None:
        pending: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=60) as client:
            k = 0
            while time.monotonic() < end:
                kind, gw = HOSTILE[k % len(HOSTILE)], gws[k % len(gws)]
                k += 1

                async def one(kind: str = kind, url: str = gw.url) -> None:
                    in_fault = time.monotonic() < fault_until
                    try:
                        got, took = await _hostile(kind, url, client)
                    except httpx.HTTPError as exc:
                        got, took = f"error:{type(exc).__name__}", 0.0
                    in_fault = in_fault or time.monotonic() < fault_until
                    hostile[kind][got] += 1
                    if got not in EXPECTED[kind] and not (in_fault and got in {"503", "408", "502"}):
                        unexpected.append({"t_s": now(), "kind": kind, "got": got, "took_s": round(took, 2)})

                task = asyncio.ensure_future(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(args.hostile_every_s)
            if pending:
                await asyncio.gather(*pending)

    async def fault_loop() -> None:
        nonlocal fault_until
        k = 0
        while True:
            await asyncio.sleep(args.fault_every_s)
            if time.monotonic() + 60 > end:  # leave the last minute quiet
                return
            what = "redis_restart_empty" if k % 2 == 0 else "stub_kill_restart"
            k += 1
            t = now()
            fault_until = time.monotonic() + 15.0
            proc: Proc = redis if what == "redis_restart_empty" else stub
            await asyncio.to_thread(proc.kill)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(proc.start)
            faults.append({"t_s": t, "fault": what})

    async def sampler() -> None:
        while True:
            inflight, held = await asyncio.to_thread(_slots, redis)
            running = await asyncio.to_thread(_stub_running, stub)
            samples.append(
                {
                    "t_s": now(),
                    "rss_mb": [_rss_mb(g.proc.pid) if g.proc else None for g in gws],
                    "fds": [_fds(g.proc.pid) if g.proc else None for g in gws],
                    "slots_inflight": inflight,
                    "slots_held": held,
                    "stub_running": running,
                    "sent": good.sent,
                    "answered": good.answered,
                    "lost": good.lost,
                }
            )
            await asyncio.sleep(args.sample_s)

    side = [asyncio.ensure_future(sampler()), asyncio.ensure_future(fault_loop())]
    await asyncio.gather(*(good_traffic(i, g) for i, g in enumerate(gws)), hostile_traffic())
    side[1].cancel()
    await asyncio.sleep(5.0)  # quiet: every request has ended
    side[0].cancel()
    inflight, held = _slots(redis)
    running = _stub_running(stub)
    samples.append({"t_s": now(), "rss_mb": [_rss_mb(g.proc.pid) if g.proc else None for g in gws],
                    "fds": [_fds(g.proc.pid) if g.proc else None for g in gws], "slots_inflight": inflight,
                    "slots_held": held, "stub_running": running, "sent": good.sent, "answered": good.answered,
                    "lost": good.lost, "final": True})  # fmt: skip
    rss = [s["rss_mb"] for s in samples if all(x is not None for x in s["rss_mb"])]
    fds = [s["fds"] for s in samples if all(x is not None for x in s["fds"])]
    checks = {
        "no good request lost": good.lost == 0,
        "every good request answered once": good.answered == good.sent,
        "every hostile case answered as expected": not unexpected,
        "no slot held once quiet": inflight == 0 and held == 0,
        "stub runs nothing once quiet": running == 0,
    }
    return {
        "good": good.to_dict(),
        "hostile": {k: dict(v) for k, v in hostile.items()},
        "hostile_unexpected": unexpected[:200],
        "faults": faults,
        "samples": samples,
        "rss_mb_first_last_max": [rss[0], rss[-1], [max(x[i] for x in rss) for i in range(len(gws))]] if rss else None,
        "fds_first_last_max": [fds[0], fds[-1], [max(x[i] for x in fds) for i in range(len(gws))]] if fds else None,
        "checks": checks,
    }


def _shown_path(path: str) -> str:
    """``path`` relative to the checkout if it lies inside it, else as given."""
    p = Path(path).resolve()
    root = RESULTS.resolve().parents[1]
    return str(p.relative_to(root)) if p.is_relative_to(root) else path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=1800.0)
    ap.add_argument("--rate", type=float, default=6.0, help="good requests per second, over both replicas")
    ap.add_argument("--hostile-every-s", type=float, default=2.0)
    ap.add_argument("--fault-every-s", type=float, default=300.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--out", default=str(RESULTS / "soak.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_soak_")
    cluster = Cluster(Path(tmp))
    t0 = time.time()
    try:
        result = asyncio.run(soak(args, cluster))
    finally:
        cluster.close()
    result = {
        "command": "python benchmarks/bench_soak.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        # the output path as given, relative to the checkout when inside it (no machine-specific path in the file)
        "config": {**vars(args), "out": _shown_path(args.out)},
        "wall_s": round(time.time() - t0, 1),
        **result,
    }
    ok = all(result["checks"].values())
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        result["logs_kept_in"] = tmp
    write_atomic(Path(args.out), json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("command", "wall_s", "checks", "hostile", "faults")}, indent=1))
    print("good:", json.dumps(result["good"]))
    print("rss first/last/max:", result["rss_mb_first_last_max"], "fds:", result["fds_first_last_max"])
    return 0 if ok else 1


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_soak"))
