"""Calibration probes against a live vLLM (used by ``headway calibrate`` and
``benchmarks/bench_fidelity.py``), and the replay helpers that the fidelity replays
(:mod:`headway.integrations._fidelity`) share.

**Probe.** Phases run one after another (each waits for the previous to finish): single
requests with prompt lengths from 16 to ``max_model_len / 2`` tokens (prefill cost),
simultaneous groups of 1, 2, 4, ... ``max_num_seqs`` requests at short and long contexts
(per-sequence and per-KV-token decode cost), and a Poisson phase with mixed lengths
(chunked prefill mixed with decodes). Outputs use ``ignore_eos``, so every length is known.
Prompts are random token ids, drawn afresh for every warm-up run and replay (:func:`salted`), so
that an engine with prefix caching on (vLLM's default) finds none of them cached.

**Fit.** With the server's ``step_log`` (the headway scheduler), the cost model is fitted to
measured steps (:mod:`headway.sim._calibrate`). Without it (any vLLM), it is fitted to
client-side timings: in a group of ``c`` simultaneous requests of prompt ``P`` the ``i``-th
inter-token interval is one decode step of ``c`` tokens over ``c (P + i)`` cached tokens,
and a lone request's time to first token minus the frontend delay (estimated from the
shortest prompt, :func:`fit_from_client`) is one prefill step of ``P`` tokens. Client timings
cannot tell the frontend delay from the fixed extra of a step with a prefill chunk (every time
to first token holds one of each): that extra is folded into the frontend estimate, and the
client fit's ``per_prefill_step`` comes out near 0.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from headway.integrations._client import ReplayResult, ReplaySpec, prompt_ids, replay_sync
from headway.sim._calibrate import (
    CalibrationFit,
    capacity_cost_model,
    fit_step_samples,
)
from headway.sim._cost import StepSample

__all__ = [
    "PROBE_MIN_MODEL_LEN",
    "Geometry",
    "Log",
    "check_replay",
    "count_lines",
    "fetch_text",
    "fit_from_client",
    "geometry_from_metrics",
    "prefix_cache_counters",
    "probe_phases",
    "run_probe",
    "salted",
]

Log = Callable[[str], None]
"""Where progress lines go (``print``, a logger's method)."""


@dataclass(frozen=True)
class Geometry:
    """What the probe needs to know about the engine."""

    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "num_gpu_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine geometry: {name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> Geometry:
        """From a step-log header; ValueError naming a missing or bad setting."""
        try:
            return cls(
                int(h["max_num_seqs"]), int(h["max_model_len"]), int(h["max_num_batched_tokens"]),
                int(h["num_gpu_blocks"]), int(h["block_size"]), bool(h.get("enable_chunked_prefill", True)),
            )  # fmt: skip
        except KeyError as exc:
            raise ValueError(f"the step log's header has no {exc.args[0]!r}; is it a headway step log?") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the step log's header has a bad engine setting ({exc})") from None

    def as_meta(self) -> dict[str, Any]:
        return {
            "max_num_seqs": self.max_num_seqs, "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens, "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size, "enable_chunked_prefill": self.enable_chunked_prefill,
        }  # fmt: skip


def fetch_text(server: str, path: str, *, timeout: float = 10.0) -> str:
    """The body of a GET of ``server + path``; ValueError saying that the server cannot be reached,
    or what it answered instead (an HTTP error status, a body that is not UTF-8 text)."""
    import http.client
    import urllib.error
    import urllib.request

    url = server.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: bytes = resp.read()
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{url} answered HTTP {exc.code} {exc.reason}; is {server} a vLLM server?") from None
    except urllib.error.URLError as exc:
        raise ValueError(f"cannot reach {server}: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, a server that does not speak HTTP
        raise ValueError(f"cannot reach {server}: {exc or type(exc).__name__}") from None
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{url} answered with something other than text; is {server} a vLLM server?") from None


def geometry_from_metrics(url: str, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int) -> Geometry:
    """Block count and size from vLLM's ``/metrics`` (``vllm:cache_config_info``); the rest as given."""
    import re

    url = url.rstrip("/")
    text = fetch_text(url, "/metrics")
    line = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")), None)
    if line is None:
        raise ValueError(f"{url}/metrics has no vllm:cache_config_info; is it a vLLM server?")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    try:
        blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        raise ValueError(
            f"{url}/metrics: vllm:cache_config_info lacks a numeric num_gpu_blocks or block_size ({line.strip()})"
        ) from None
    return Geometry(max_num_seqs, max_model_len, max_num_batched_tokens, blocks, block_size)


def prefix_cache_counters(url: str) -> tuple[float, float] | None:
    """(queries, hits) in tokens so far from vLLM's ``/metrics`` (``vllm:prefix_cache_queries`` and
    ``vllm:prefix_cache_hits``, summed over engines), or None where the server exports neither
    or has no ``/metrics`` to read (the counts are reported, not needed)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0}
    found = False
    try:
        for fam in text_string_to_metric_families(fetch_text(url, "/metrics")):
            for sample in fam.samples:  # by sample name: how the family is named depends on its TYPE line
                name = sample.name.removesuffix("_total")
                if name in totals:
                    totals[name] += sample.value
                    found = True
    except ValueError:  # unreachable, or not Prometheus text
        return None
    return (totals["vllm:prefix_cache_queries"], totals["vllm:prefix_cache_hits"]) if found else None


def salted(specs: Sequence[ReplaySpec], salt: str) -> list[ReplaySpec]:
    """``specs`` with explicit random prompts seeded by request id and ``salt`` (:func:`prompt_ids`):
    the same ids and lengths, other tokens. Replays of one workload under different salts share no
    prefix, so an engine with prefix caching on (vLLM's default) computes every prompt token of the
    first replay's in each, as the fit and the simulated replay assume; within one replay, specs with
    the same ``shared_prefix`` key share its tokens. Specs with an explicit prompt keep it, and a
    chat's next turns (``ReplaySpec.after``) their history: it starts with the salted first turn."""
    return [
        s if s.prompt_token_ids is not None or s.after is not None else replace(s, prompt_token_ids=prompt_ids(s, salt))
        for s in specs
    ]


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


# -------------------------------------------------------------------- probe
PROBE_MIN_MODEL_LEN = 128
"""The shortest context the probe fits in (its decode phases run 64-token prompts with 48 outputs)."""


def probe_phases(geo: Geometry, *, quick: bool = False, seed: int = 0) -> list[tuple[str, list[ReplaySpec]]]:
    """The calibration probe: named phases of requests (see the module doc)."""
    if geo.max_model_len < PROBE_MIN_MODEL_LEN:
        raise ValueError(f"the calibration probe needs max_model_len >= {PROBE_MIN_MODEL_LEN}, got {geo.max_model_len}")
    rng = random.Random(seed)
    out_len = 24 if quick else 48
    half = max(16, geo.max_model_len // 2)
    prompts = [p for p in (16, 64, 256, 512, 1024, 2048) if p <= half]
    phases: list[tuple[str, list[ReplaySpec]]] = []
    k = 0

    def spec(arrival: float, p: int, o: int) -> ReplaySpec:
        nonlocal k
        k += 1
        return ReplaySpec(f"probe-{seed}-{k}", arrival, p, o)

    reps = 1 if quick else 2
    for _ in range(reps):
        for p in prompts:
            phases.append((f"prefill P={p}", [spec(0.0, p, 8)]))
    conc = sorted({c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= geo.max_num_seqs} | {geo.max_num_seqs})
    ctx = [64, min(512, half)] if quick else [64, min(256, half), min(1024, half)]
    for p in ctx:
        for c in conc:
            phases.append((f"decode c={c} P={p}", [spec(0.0, p, out_len) for _ in range(c)]))
    n_mixed = 30 if quick else 80
    mixed = []
    t = 0.0
    rate = max(2.0, geo.max_num_seqs * 1.5)
    for _ in range(n_mixed):
        t += rng.expovariate(rate)
        p = int(min(half, max(8, rng.lognormvariate(math.log(128), 0.9))))
        o = int(min(256, geo.max_model_len - p, max(4, rng.lognormvariate(math.log(32), 0.8))))
        mixed.append(spec(t, p, o))
    phases.append(("mixed", mixed))
    return phases


def run_probe(
    url: str,
    phases: Sequence[tuple[str, Sequence[ReplaySpec]]],
    *,
    model: str = "tiny-llama",
    log: Log | None = None,
    stream: bool = True,
) -> list[tuple[str, Sequence[ReplaySpec], list[ReplayResult]]]:
    """Replay each phase after the previous one finished; raises if a request failed.

    ``stream`` records every token's arrival (needed by :func:`fit_from_client`; a fit from
    the step log does without, and the lighter client takes less CPU from the engine)."""
    done = []
    for name, specs in phases:
        res = replay_sync(url, specs, model=model, record_token_times=stream, stream=stream, abort_on_error=True)
        check_replay(res, f"probe phase {name!r}")
        short = [r for r, s in zip(res, specs, strict=True) if r.num_output_tokens != s.max_tokens]
        if short:
            raise RuntimeError(
                f"probe phase {name!r}: {len(short)} requests stopped early; does the server honour ignore_eos?"
            )
        if log:
            log(f"  {name}: {len(specs)} requests, mean e2e {statistics.fmean(r.e2e or 0 for r in res):.3f} s")
        done.append((name, specs, res))
    return done


def fit_from_client(
    runs: Sequence[tuple[str, Sequence[ReplaySpec], Sequence[ReplayResult]]], geo: Geometry, name: str,
    *, kv_bytes_per_token: float = 1.0,
) -> tuple[CalibrationFit, dict[str, Any]]:  # fmt: skip
    """Fit from client-side timings only (any vLLM, no step log; see the module doc).

    The decode intervals are fitted first. Their steps run one token per sequence, so that fit
    cannot split a sequence's cost between ``per_token`` and ``per_seq`` (it puts it all on
    ``per_token``), and only its one-token step is trusted: the frontend delay (``frontend_s``
    in the metadata) is the median, over the lone requests of the shortest prompt ``P``, of
    their time to first token less that step at ``P`` cached tokens and less ``P - 1`` prompt
    tokens at the cost per prompt token (from the slope of the lone requests' times to first
    token over their prompt lengths, less the per-KV-token cost; 0 with one prompt length). The
    fixed extra of a step with a prefill chunk (``per_prefill_step``) is folded into that
    estimate: client timings cannot tell the two apart. The lone requests' prefill steps (time
    to first token less the frontend delay) then join the decode intervals in the final fit."""
    samples: list[StepSample] = []
    lone: list[tuple[int, float]] = []
    for _, specs, res in runs:
        if len(specs) == 1:
            r = res[0]
            if r.ttft is not None:
                lone.append((specs[0].num_prompt_tokens, r.ttft))
        if len({s.arrival_time for s in specs}) != 1 or len(specs) > geo.max_num_seqs:
            continue
        c = len(specs)
        p = specs[0].num_prompt_tokens
        n = min(len(r.token_times) for r in res)
        for i in range(1, n):
            gaps = [r.token_times[i] - r.token_times[i - 1] for r in res]
            d = statistics.median(gaps)
            if d > 0:
                samples.append(StepSample(c, c, c * (p + i), d))  # vLLM's count after output i: p + i
    if len(samples) < 4:
        raise ValueError("the probe produced too few decode intervals to fit (is streaming working?)")
    capacity = geo.num_gpu_blocks * geo.block_size
    base = capacity_cost_model(
        name, step_overhead=1e-3, per_token=0.0, per_seq=0.0, per_kv_token=0.0,
        capacity_tokens=capacity, kv_bytes_per_token=kv_bytes_per_token,
    )  # fmt: skip
    decode_fit = fit_step_samples(samples, base, name)
    frontend = 0.0
    if lone:
        shortest = min(p for p, _ in lone)
        dm = decode_fit.model
        one = dm.step_time(1, 1, 0)  # a one-token step without KV: a + per_token + per_seq
        per_prompt_token = 0.0
        if len({p for p, _ in lone}) > 1:  # TTFT = frontend + one + (P - 1) t + c P: its slope is t + c
            slope = statistics.linear_regression([float(p) for p, _ in lone], [t for _, t in lone]).slope
            per_prompt_token = min(max(slope - dm.per_kv_token, 0.0), dm.per_token + dm.per_seq)
        frontend = statistics.median(
            t - one - dm.per_kv_token * p - per_prompt_token * (p - 1) for p, t in lone if p == shortest
        )
        for p, t in lone:
            d = t - max(frontend, 0.0)
            if d > 0:
                samples.append(StepSample(p, 1, p, d))
    fit = fit_step_samples(samples, base, name)
    meta = {
        "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": "client",
        "engine": geo.as_meta(), "capacity_tokens": capacity, "frontend_s": frontend, "fit": fit.summary(),
    }  # fmt: skip
    return fit, meta


def check_replay(res: Sequence[ReplayResult], what: str) -> None:
    """RuntimeError naming ``what``, how many requests failed and the first failure, if any did."""
    bad = [r for r in res if not r.ok]
    if not bad:
        return
    failed = [r for r in bad if not r.aborted]
    first = (failed or bad)[0]
    more = f"; {len(bad) - len(failed)} more not sent or cancelled" if len(failed) < len(bad) else ""
    raise RuntimeError(f"{what}: {len(failed)} requests failed (first: {first.error}){more}")
