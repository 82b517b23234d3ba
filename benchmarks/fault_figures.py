"""Fault timelines: steady load through the gateway while a fault is injected.

Each scenario starts real processes on 127.0.0.1 (stub backend, gateway replicas,
redis-server with AOF), sends a request every ``1/rate`` seconds (round-robin over the
replicas that take traffic), injects a fault and plots requests completed and failed
(cumulative, by end time) and requests queued (sampled) over time, the fault marked:

- ``backend_kill``: the only backend is SIGKILLed mid-stream and restarted 2 s later.
- ``redis_restart``: Redis (appendonly, fsync always) SIGKILLed and restarted 1.5 s later.
- ``replica_kill``: one of two replicas SIGKILLed while holding backend slots; the other
  reclaims them when the dead replica's lease (2 s) expires.
- ``sigterm_drain``: SIGTERM to a replica (drain timeout 3 s) behind a load balancer that
  stops sending to it: its in-flight and queued requests finish.

Writes ``benchmarks/results/faults_<name>.png`` and ``faults_summary.json``.
Usage: python benchmarks/fault_figures.py [--only NAME] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from headway._files import save_figure, write_atomic
from headway.serve._upstream import UpstreamError, UpstreamPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test harnesses live with the tests
from harness.cluster import Cluster, Proc

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    done: list[tuple[float, str]] = field(default_factory=list)
    """(end time, outcome) per request: completed or failed."""
    queued: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0


async def _request(pool: UpstreamPool, body: bytes, tl: Timeline) -> None:
    outcome = "failed"
    try:
        async with asyncio.timeout(60):
            resp = await pool.post("/v1/completions", body)
            try:
                data = await resp.read()
            finally:
                resp.close()
        if resp.status_code == 200 and b'data: {"error"' not in data:
            outcome = "completed"
    except (UpstreamError, OSError, TimeoutError):
        pass
    tl.done.append((tl.now(), outcome))


async def _run(
    targets: Callable[[float], list[str]],
    queued: Callable[[], int],
    actions: list[tuple[float, str, Callable[[], None]]],
    seconds: float,
    rate: float,
    body: dict,
) -> Timeline:
    tl = Timeline()
    pools: dict[str, UpstreamPool] = {}
    raw = json.dumps(body).encode()
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()

    async def sample() -> None:
        while True:
            try:
                n = await loop.run_in_executor(None, queued)
            except Exception:
                n = -1
            if n >= 0:
                tl.queued.append((tl.now(), n))
            await asyncio.sleep(0.1)

    async def act() -> None:
        for at, label, fn in actions:
            await asyncio.sleep(max(0.0, at - tl.now()))
            tl.events.append((tl.now(), label))
            await loop.run_in_executor(None, fn)

    sampler = asyncio.create_task(sample())
    actor = asyncio.create_task(act())
    i = 0
    while tl.now() < seconds:
        urls = targets(tl.now())
        url = urls[i % len(urls)]
        pool = pools.setdefault(url, UpstreamPool(url, read_timeout=60))
        tasks.append(asyncio.create_task(_request(pool, raw, tl)))
        i += 1
        await asyncio.sleep(max(0.0, i / rate - tl.now()))
    await actor
    await asyncio.gather(*tasks)
    sampler.cancel()
    for p in pools.values():
        await p.aclose()
    return tl


def _health_queued(gws: list[Proc]) -> Callable[[], int]:
    def q() -> int:
        total = 0
        for g in gws:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                total += int(httpx.get(g.url + "/health", timeout=0.5).json().get("queued", 0))
        return total

    return q


def scenario_backend_kill(c: Cluster, seconds: float) -> Timeline:
    stub = c.stub(token_delay_s=0.01)
    gw = c.gateway([stub.url], "--backend-concurrency", "4", "--queue-ttl", "30")
    actions = [(3.0, "backend killed", stub.kill), (5.0, "backend restarted", lambda: stub.start())]
    body = {"prompt": "x", "max_tokens": 20, "stream": True}
    return asyncio.run(_run(lambda t: [gw.url], _health_queued([gw]), actions, seconds, 10, body))


def scenario_redis_restart(c: Cluster, seconds: float) -> Timeline:
    redis = c.redis()
    stub = c.stub(token_delay_s=0.01)
    args = ("--backend-concurrency", "2", "--redis-lease", "2", "--queue-ttl", "30")
    gws = [c.gateway([stub.url], *args, redis_url=redis.redis_url) for _ in range(2)]
    r = redis.client()

    def queued() -> int:
        try:
            return int(r.zcard("headway:queue"))
        except Exception:
            return -1

    actions = [(3.0, "redis killed", redis.kill), (4.5, "redis restarted", lambda: redis.restart())]
    body = {"prompt": "x", "max_tokens": 10}
    return asyncio.run(_run(lambda t: [g.url for g in gws], queued, actions, seconds, 20, body))


def scenario_replica_kill(c: Cluster, seconds: float) -> Timeline:
    redis = c.redis()
    stub = c.stub(token_delay_s=0.01)
    args = ("--backend-concurrency", "2", "--redis-lease", "2", "--queue-ttl", "30")
    a, b = (c.gateway([stub.url], *args, redis_url=redis.redis_url) for _ in range(2))
    r = redis.client()
    kill_at = 3.0
    actions = [(kill_at, "replica A killed", a.kill), (kill_at + 2.0, "A's lease expires", lambda: None)]
    body = {"prompt": "x", "max_tokens": 10}
    # a load balancer that notices the dead replica after 0.5 s
    return asyncio.run(
        _run(
            lambda t: [a.url, b.url] if t < kill_at + 0.5 else [b.url],
            lambda: int(r.zcard("headway:queue")),
            actions,
            seconds,
            20,
            body,
        )
    )


def scenario_sigterm_drain(c: Cluster, seconds: float) -> Timeline:
    redis = c.redis()
    stub = c.stub(token_delay_s=0.01)
    args = ("--backend-concurrency", "2", "--redis-lease", "2", "--drain-timeout", "3", "--queue-ttl", "30")
    a, b = (c.gateway([stub.url], *args, redis_url=redis.redis_url) for _ in range(2))
    r = redis.client()
    term_at = 3.0
    actions = [(term_at, "SIGTERM to replica A", lambda: a.signal(signal.SIGTERM))]
    body = {"prompt": "x", "max_tokens": 10}
    return asyncio.run(
        _run(
            lambda t: [a.url, b.url] if t < term_at else [b.url],
            lambda: int(r.zcard("headway:queue")),
            actions,
            seconds,
            20,
            body,
        )
    )


SCENARIOS = {
    "backend_kill": scenario_backend_kill,
    "redis_restart": scenario_redis_restart,
    "replica_kill": scenario_replica_kill,
    "sigterm_drain": scenario_sigterm_drain,
}


def plot(name: str, tl: Timeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 4.2), sharex=True, height_ratios=[2, 1])
    end = max([t for t, _ in tl.done] + [t for t, _ in tl.queued] + [1.0])
    for outcome, color in (("completed", "tab:green"), ("failed", "tab:red")):
        ts = sorted(t for t, o in tl.done if o == outcome)
        ys = list(range(len(ts) + 1))
        ax1.step([0, *ts, end], [*ys, ys[-1]], where="post", color=color, label=f"{outcome} ({len(ts)})")
    ax1.set_ylabel("requests (cumulative)")
    ax1.legend(loc="center left", fontsize=8)
    if tl.queued:
        ax2.plot([t for t, _ in tl.queued], [n for _, n in tl.queued], color="tab:blue")
    ax2.set_ylabel("queued")
    ax2.set_xlabel("time (s)")
    for ax in (ax1, ax2):
        for t, _ in tl.events:
            ax.axvline(t, color="black", linestyle="--", linewidth=0.8)
    top = ax1.get_ylim()[1]
    for k, (t, label) in enumerate(tl.events):
        ax1.annotate(label, (t, top), xytext=(3, -12 - 11 * k), textcoords="offset points", fontsize=7)
    fig.suptitle(f"fault: {name}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=80)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(SCENARIOS), default=None)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    summary_path = RESULTS / "faults_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for name, fn in SCENARIOS.items():
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            c = Cluster(Path(tmp))
            try:
                tl = fn(c, args.seconds)
            finally:
                c.close()
        plot(name, tl, RESULTS / f"faults_{name}.png")
        counts = {o: sum(1 for _, x in tl.done if x == o) for o in ("completed", "failed")}
        summary[name] = {**counts, "sent": len(tl.done), "events": [[round(t, 2), lab] for t, lab in tl.events]}
        print(name, summary[name], flush=True)
    write_atomic(summary_path, json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "fault_figures"))
