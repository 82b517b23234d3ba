"""``headway bench serve --save-result``: the result JSON of ``vllm bench serve``, same keys.

The keys, their units (milliseconds for latency statistics, seconds for the per-request lists)
and the file name (``{label}-{request_rate}qps[-concurrency{N}]-{model}-{YYYYmmdd-HHMMSS}.json``,
or ``--result-filename`` in ``--result-dir``) follow vLLM's ``vllm/benchmarks/serve.py``, so that
tools reading vLLM's results read these too. Statistics are over completed requests:

- ``ttfts``/``latencies``: first / last content chunk, from the request's send time;
- TPOT of a request: ``(latency - ttft) / (output_len - 1)`` for two or more output tokens;
- ITL: every gap between consecutive content chunks of a streamed request, pooled over the
  completed requests (none without streaming, then the ITL statistics are 0, as vLLM reports for
  an empty list; TTFT then equals E2EL, so TPOT is 0 too);
- percentiles: numpy's linear interpolation, as vLLM's; ``std``: the population's (``np.std``);
- ``input_lens``/``total_input_tokens``: the server's count (``usage.prompt_tokens``) where an
  answer gave it, as vLLM's client takes it, else the length sent (the workload's units);
- ``request_rate``: the rate the arrivals were sent at (``--request-rate`` over ``--time-scale``,
  else the workload's own arrivals' mean rate), ``"inf"`` when they all came at once;
- ``request_goodput``: requests meeting every ``--goodput`` target per second (None without);
- ``max_output_tokens_per_s``/``max_concurrent_requests``: the busiest one-second bucket of output
  tokens and of requests in flight, counted as vLLM counts them.

Where headway's file differs from vLLM's on purpose:

- ``duration`` is headway's makespan, from the first request sent to the last one's last token (or
  failure). vLLM's clock starts before its first inter-arrival wait (its first request goes one gap
  after the start) and stops when every request has returned (a stream after its ``[DONE]``); so at
  a finite rate its duration is longer by about one gap, and its throughputs lower by as much;
- ``start_times`` are seconds from the first send; vLLM's are ``time.perf_counter()`` readings
  (differences between them agree);
- the per-request lists are written always (vLLM's with ``--save-detailed`` only), and the E2E and
  client-queue statistics too (vLLM's when ``--percentile-metrics`` names them); ``errors`` holds each
  failed request's abort reason, not vLLM's exception text.

``burstiness`` is the Gamma shape of the arrivals' gaps, as vLLM's (the caller's: the workload's own,
``null`` for a trace's times). A failed request has, as in vLLM's file, output length and latency 0,
and the TTFT and gaps it had before it failed (0 and none before its first token). ``queue_times``:
from each request's arrival to its send (its wait for a ``--max-concurrency`` slot), vLLM's
``client_queue_time``; ``rtfx`` is 0.0, vLLM's for text requests.

What vLLM records and headway's client does not (``generated_texts``, a tokenizer id, spec-decode and
ramp-up statistics) is left out, or ``None``, rather than filled with made-up values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from headway._files import write_atomic
from headway.core import Request, RequestState
from headway.serve._bench import SCHEDULED_KEY, USAGE_PROMPT_TOKENS_KEY

__all__ = ["result_filename", "vllm_bench_result", "write_result"]

_ITL_KEY = "itl"


def _stats(result: dict[str, Any], name: str, values: Sequence[float], percentiles: Sequence[float]) -> None:
    arr = np.asarray(values, dtype=np.float64) if len(values) else np.zeros(1)
    result[f"mean_{name}_ms"] = float(np.mean(arr)) * 1000
    result[f"median_{name}_ms"] = float(np.median(arr)) * 1000
    result[f"std_{name}_ms"] = float(np.std(arr)) * 1000
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        result[f"p{word}_{name}_ms"] = float(np.percentile(arr, p)) * 1000


def _peaks(done: Sequence[Request]) -> tuple[float, int]:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` as ``vllm bench serve`` computes
    them: tokens (the first at the TTFT, one more after each ITL gap) and requests in flight counted
    in one-second buckets from the first completed request's start; the largest bucket of each."""
    if not done:
        return 0.0, 0
    starts = [r.arrival_time for r in done]
    ends = [r.finish_time if r.finish_time is not None else r.arrival_time for r in done]
    t0 = min(starts)
    n = int(np.ceil(max(ends) - t0)) + 1
    tokens = np.zeros(n)
    active = np.zeros(n)
    for r, start, end in zip(done, starts, ends, strict=True):
        first = r.first_token_time if r.first_token_time is not None else end
        times = np.cumsum([first, *(float(g) for g in r.extra.get(_ITL_KEY) or ())])  # type: ignore[attr-defined]
        for t in times:
            bucket = int(t - t0)
            if 0 <= bucket < n:
                tokens[bucket] += 1
        for second in range(int(start - t0), int(end - t0) + 1):
            active[second] += 1
    return float(np.max(tokens)), int(np.max(active))


def _prompt_len(r: Request) -> int:
    """A request's prompt length as ``vllm bench serve`` reports it: the server's count
    (``usage.prompt_tokens``) where an answer gave it, else the length it was sent as."""
    n = r.extra.get(USAGE_PROMPT_TOKENS_KEY)
    return n if isinstance(n, int) else r.num_prompt_tokens


def _queue_time(r: Request) -> float:
    """How long a request waited for a ``max_concurrency`` slot: from when it was due (its arrival) to
    when it was sent (``vllm bench serve``'s ``client_queue_time``); 0 for one never due."""
    due = r.extra.get(SCHEDULED_KEY)
    return max(0.0, r.arrival_time - due) if isinstance(due, float) else 0.0


def _ttft(r: Request) -> float:
    """A request's TTFT as ``vllm bench serve`` keeps it: also of a request that failed after its first
    token (0 for one that failed before it, as vLLM's ``RequestFuncOutput`` default)."""
    if r.first_token_time is None or r.state not in (RequestState.FINISHED, RequestState.ABORTED):
        return 0.0
    return r.first_token_time - r.arrival_time


def vllm_bench_result(
    requests: Sequence[Request],
    *,
    label: str,
    model_id: str,
    request_rate: float,
    burstiness: float | None,
    max_concurrency: int | None,
    goodput: float | None,
    duration: float,
    percentiles: Sequence[float] = (99.0,),
    date: datetime | None = None,
) -> dict[str, Any]:
    """The result dict of one run, with ``vllm bench serve``'s keys."""
    done = [r for r in requests if r.state is RequestState.FINISHED]
    ttfts: list[float] = []
    latencies: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    for r in done:
        assert r.finish_time is not None
        latency = r.finish_time - r.arrival_time
        ttft = (r.first_token_time if r.first_token_time is not None else r.finish_time) - r.arrival_time
        ttfts.append(ttft)
        latencies.append(latency)
        if r.num_output_tokens > 1:
            tpots.append((latency - ttft) / (r.num_output_tokens - 1))
        gaps = r.extra.get(_ITL_KEY)
        if gaps is not None:
            itls.extend(float(g) for g in gaps)  # type: ignore[attr-defined]
    total_in = sum(_prompt_len(r) for r in done)
    total_out = sum(r.num_output_tokens for r in done)
    per = duration if duration > 0 else math.nan
    result: dict[str, Any] = {
        "date": (date or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai",
        "backend": "openai",
        "label": label,
        "model_id": model_id,
        "tokenizer_id": None,
        "num_prompts": len(requests),
        "request_rate": request_rate if math.isfinite(request_rate) else "inf",
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / per,
        "request_goodput": goodput,
        "output_throughput": total_out / per,
        "total_token_throughput": (total_in + total_out) / per,
        "input_lens": [_prompt_len(r) for r in requests],
        "output_lens": [r.num_output_tokens if r.state is RequestState.FINISHED else 0 for r in requests],
        "ttfts": [_ttft(r) for r in requests],
        "itls": [[float(g) for g in r.extra.get(_ITL_KEY) or ()] for r in requests],  # type: ignore[attr-defined]
        "latencies": [
            r.finish_time - r.arrival_time if r.state is RequestState.FINISHED and r.finish_time is not None else 0.0
            for r in requests
        ],
        "start_times": [r.arrival_time for r in requests],
        "queue_times": [_queue_time(r) for r in requests],
        "errors": [
            "" if r.state is RequestState.FINISHED else str(r.extra.get("abort_reason", r.state.value))
            for r in requests
        ],
    }
    result["max_output_tokens_per_s"], result["max_concurrent_requests"] = _peaks(done)
    result["rtfx"] = 0.0  # (audio seconds in per second: none in text requests, as vLLM writes for them)
    _stats(result, "ttft", ttfts, percentiles)
    _stats(result, "tpot", tpots, percentiles)
    _stats(result, "itl", itls, percentiles)
    _stats(result, "e2el", latencies, percentiles)
    if max_concurrency is not None:  # vLLM's client-queue statistics, of the completed requests
        queued = [_queue_time(r) for r in done]
        _stats(result, "client_queue_time", queued, percentiles)
        if math.isfinite(request_rate):
            _stats(result, "e2el_including_client_queue", [e + q for e, q in zip(latencies, queued, strict=True)],
                   percentiles)  # fmt: skip
    return result


def result_filename(
    result: dict[str, Any], *, result_dir: str | None = None, result_filename: str | None = None
) -> Path:
    """vLLM's file name for ``result`` (or ``result_filename``), in ``result_dir`` (made if missing)."""
    if result_filename:
        name = result_filename
    else:
        conc = f"-concurrency{result['max_concurrency']}" if result["max_concurrency"] is not None else ""
        model = str(result["model_id"]).split("/")[-1]
        name = f"{result['label']}-{result['request_rate']}qps{conc}-{model}-{result['date']}.json"
    path = Path(result_dir) / name if result_dir else Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` as JSON (undefined numbers, NaN, as null)."""

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    write_atomic(path, json.dumps({k: clean(v) for k, v in result.items()}, indent=2) + "\n")
