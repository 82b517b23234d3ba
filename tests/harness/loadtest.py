"""Open-loop load at a fixed rate against a gateway, counting every request's terminal answer.

Each request ends in exactly one *outcome*: ``completed`` (200 and, when streamed, the
``[DONE]`` event with no error event), ``stream_error`` (200 whose stream ended with an
error event), ``http_<status>`` (any other status; the gateway's OpenAI-style
``error.code`` is recorded per status as the *reason*) or ``lost`` (no answer: transport
error or client timeout). A mix of bad requests (invalid JSON, wrong API key, oversized
body) exercises the rejection paths. Used by ``tests/scale/test_load.py``,
``benchmarks/bench_load.py`` and ``benchmarks/bench_soak.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from headway.serve._upstream import UpstreamError, UpstreamPool

__all__ = ["LoadConfig", "LoadResult", "gateway_counters", "run_load", "run_load_sync"]


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    num_requests: int = 2000
    rate: float = 100.0
    """Arrivals per second (fixed spacing: an open loop, not closed by responses)."""
    api_keys: tuple[str, ...] = ()
    """Valid keys, used round-robin (empty: no Authorization header)."""
    max_tokens: tuple[int, int] = (1, 8)
    stream_fraction: float = 0.2
    invalid_fraction: float = 0.02
    """Bodies that are not JSON (400)."""
    bad_key_fraction: float = 0.01
    """Requests with a wrong API key (401; only when ``api_keys`` is set)."""
    oversize_fraction: float = 0.01
    """Bodies over ``oversize_bytes`` (413)."""
    oversize_bytes: int = 1 << 20
    timeout_s: float = 60.0
    seed: int = 0


@dataclass(slots=True)
class LoadResult:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    """``<status>:<error.code>`` of every non-200 answer."""
    kinds: Counter[str] = field(default_factory=Counter)
    """What was sent: valid, invalid, bad_key, oversize."""
    duration_s: float = 0.0
    achieved_rate: float = 0.0
    max_lag_s: float = 0.0
    """Worst delay of a send behind its scheduled time (the generator falling behind)."""
    latencies: list[float] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.outcomes["lost"]

    @property
    def accepted(self) -> int:
        """Requests that entered the queue (not refused at the door: 400, 401, 413, 429)."""
        refused = sum(self.outcomes[f"http_{c}"] for c in (400, 401, 413, 429))
        return self.answered - refused

    @property
    def answered(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k != "lost")

    def to_dict(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        return {
            "sent": self.sent,
            "answered": self.answered,
            "accepted": self.accepted,
            "lost": self.lost,
            "outcomes": dict(sorted(self.outcomes.items())),
            "reasons": dict(sorted(self.reasons.items())),
            "kinds": dict(sorted(self.kinds.items())),
            "duration_s": round(self.duration_s, 2),
            "achieved_rate": round(self.achieved_rate, 1),
            "max_lag_s": round(self.max_lag_s, 3),
            "completed_latency_p50_s": round(pct(0.5), 4),
            "completed_latency_p99_s": round(pct(0.99), 4),
        }


def _plan(cfg: LoadConfig) -> list[tuple[str, bytes, dict[str, str], bool]]:
    rng = random.Random(cfg.seed)
    out = []
    for i in range(cfg.num_requests):
        headers = {"Content-Type": "application/json"}
        if cfg.api_keys:
            headers["Authorization"] = f"Bearer {cfg.api_keys[i % len(cfg.api_keys)]}"
        stream = rng.random() < cfg.stream_fraction
        body: dict[str, Any] = {
            "model": "m",
            "prompt": f"req-{i}",
            "max_tokens": rng.randint(*cfg.max_tokens),
            "stream": stream,
        }
        u = rng.random()
        kind = "valid"
        if u < cfg.invalid_fraction:
            kind, raw = "invalid", b'{"prompt": "x", '
        elif u < cfg.invalid_fraction + cfg.oversize_fraction:
            kind = "oversize"
            raw = json.dumps({**body, "prompt": "x" * (cfg.oversize_bytes + 1)}).encode()
        else:
            if cfg.api_keys and u < cfg.invalid_fraction + cfg.oversize_fraction + cfg.bad_key_fraction:
                kind = "bad_key"
                headers["Authorization"] = "Bearer sk-not-a-key"
            raw = json.dumps(body).encode()
        out.append((kind, raw, headers, stream and kind == "valid"))
    return out


async def _one(
    pool: UpstreamPool, cfg: LoadConfig, raw: bytes, headers: dict[str, str], stream: bool, res: LoadResult
) -> None:
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(cfg.timeout_s):
            resp = await pool.post("/v1/completions", raw, headers)
            try:
                if resp.status_code != 200:
                    body = await resp.read()
                    code = ""
                    try:
                        err = json.loads(body)["error"]
                        code = str(err.get("code") or err.get("type") or "")
                    except (ValueError, KeyError, TypeError):
                        pass
                    res.outcomes[f"http_{resp.status_code}"] += 1
                    res.reasons[f"{resp.status_code}:{code}"] += 1
                    return
                body = await resp.read()
            finally:
                resp.close()
        if not stream:
            res.outcomes["completed"] += 1
            res.latencies.append(time.perf_counter() - t0)
            return
        if b"data: [DONE]" in body and b'data: {"error"' not in body:
            res.outcomes["completed"] += 1
            res.latencies.append(time.perf_counter() - t0)
        else:
            res.outcomes["stream_error"] += 1
    except (UpstreamError, OSError, TimeoutError):
        res.outcomes["lost"] += 1


async def run_load(cfg: LoadConfig) -> LoadResult:
    """Send ``cfg.num_requests`` at ``cfg.rate`` per second; wait for every answer.

    The client is the gateway's own keep-alive pool on aiohttp (httpx spends
    milliseconds of CPU per request with hundreds of open connections)."""
    plan = _plan(cfg)
    res = LoadResult()
    pool = UpstreamPool(cfg.url, connect_timeout=10.0, read_timeout=cfg.timeout_s)
    tasks: list[asyncio.Task[None]] = []
    try:
        start = time.perf_counter()
        for i, (kind, raw, headers, stream) in enumerate(plan):
            due = start + i / cfg.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                res.max_lag_s = max(res.max_lag_s, -delay)
            res.kinds[kind] += 1
            res.sent += 1
            extra = {k: v for k, v in headers.items() if k != "Content-Type"}
            tasks.append(asyncio.create_task(_one(pool, cfg, raw, extra, stream, res)))
        sent_s = time.perf_counter() - start
        await asyncio.gather(*tasks)
        res.duration_s = time.perf_counter() - start
        res.achieved_rate = res.sent / sent_s if sent_s > 0 else 0.0
    finally:
        # cut short (Ctrl-C cancels this task): the requests still out are cancelled and awaited before
        # their pool closes, not left to fail on a closed session and log "Task exception was never
        # retrieved" once each
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.aclose()
    return res


def run_load_sync(cfg: LoadConfig) -> LoadResult:
    return asyncio.run(run_load(cfg))


def gateway_counters(metrics_text: str) -> dict[str, dict[str, float]]:
    """``headway_requests_finished_total`` by tier and ``headway_rejections_total`` by reason
    (summed over the other labels, such as the tenant), from /metrics."""
    out: dict[str, dict[str, float]] = {"finished": {}, "rejections": {}}
    for line in metrics_text.splitlines():
        for name, key, label in (
            ("headway_requests_finished_total{", "finished", "tier"),
            ("headway_rejections_total{", "rejections", "reason"),
        ):
            if line.startswith(name):
                lab = line[line.index(label + '="') + len(label) + 2 :]
                value = lab[: lab.index('"')]
                out[key][value] = out[key].get(value, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
