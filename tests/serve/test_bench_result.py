"""``headway bench serve --save-result`` against ``vllm bench serve``'s own numbers: the same per-request
outcomes through vLLM's ``calculate_metrics`` (in the vLLM venv) and through headway's result file and
summary; the prompt lengths and the request rate the file carries."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headway.core import Request, RequestState
from headway.integrations._server import default_vllm_paths
from headway.metrics import summarize
from headway.serve._bench_result import vllm_bench_result
from headway.serve._cli import main

# Runs in the vLLM venv: the outcomes on stdin become vLLM's RequestFuncOutput, its calculate_metrics
# prints BenchmarkMetrics as JSON on the last line.
_VLLM_METRICS = """
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics
spec = json.load(sys.stdin)
outputs = [RequestFuncOutput(**o) for o in spec["outputs"]]
metrics, _ = calculate_metrics([], outputs, spec["duration"], None, spec["percentiles"], spec["goodput"])
print(json.dumps(dataclasses.asdict(metrics), default=float))
"""


def _outcomes(seed: int) -> list[dict[str, Any]]:
    """Fabricated outcomes as vLLM's client records them (seconds from the send): failed ones, one-token
    answers, and answers whose chunks held several tokens (fewer ITL gaps than tokens - 1)."""
    rng = random.Random(seed)
    out, start = [], 0.0
    for _ in range(60):
        start += rng.random() * 0.5
        n = rng.choice([1, 1, 2, 7, 30])
        chunks = n if rng.random() < 0.7 else max(1, n // 3)
        ttft = rng.random() * 2.0
        itl = [rng.random() * 0.08 for _ in range(chunks - 1)]
        ok = rng.random() > 0.15
        out.append({"success": ok, "start_time": start, "prompt_len": rng.randint(1, 500),
                    "ttft": ttft if ok else 0.0, "itl": itl if ok else [], "output_tokens": n if ok else 0,
                    "latency": ttft + sum(itl) if ok else 0.0})  # fmt: skip
    return out


def _requests(outcomes: list[dict[str, Any]]) -> list[Request]:
    """The same outcomes as ``run_bench`` records them (times from the run's start)."""
    reqs = []
    for i, o in enumerate(outcomes):
        r = Request(f"r{i}", o["start_time"], o["prompt_len"], 64)
        if o["success"]:
            r.state = RequestState.FINISHED
            r.first_token_time = o["start_time"] + o["ttft"]
            r.last_token_time = r.finish_time = o["start_time"] + o["latency"]
            r.extra["itl"] = o["itl"]
            r.num_output_tokens = o["output_tokens"]
        else:
            r.state, r.finish_time = RequestState.ABORTED, o["start_time"] + 0.25
        reqs.append(r)
    return reqs


@pytest.mark.vllm
@pytest.mark.slow
def test_the_result_file_has_vllms_numbers_for_the_same_outcomes() -> None:
    python, _ = default_vllm_paths()
    if not python.exists():
        why = f"no vLLM python at {python}; run bash scripts/setup_vllm_env.sh"
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"{why} (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(why)
    outcomes = _outcomes(seed=3)
    reqs = _requests(outcomes)
    summary = summarize(reqs, slo="ttft:1200 tpot:30 e2el:2500")
    percentiles = [50.0, 90.0, 99.0, 99.9]
    ours = vllm_bench_result(reqs, label="x", model_id="m", request_rate=math.inf, burstiness=1.0,
                             max_concurrency=None, goodput=summary.goodput, duration=summary.makespan,
                             percentiles=percentiles)  # fmt: skip
    spec = {"outputs": outcomes, "duration": summary.makespan, "percentiles": percentiles,
            "goodput": {"ttft": 1200.0, "tpot": 30.0, "e2el": 2500.0}}  # fmt: skip
    done = subprocess.run([str(python), "-c", _VLLM_METRICS], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    same = {"completed": "completed", "failed": "failed", "total_input": "total_input_tokens",
            "total_output": "total_output_tokens", "request_throughput": "request_throughput",
            "request_goodput": "request_goodput", "output_throughput": "output_throughput",
            "total_token_throughput": "total_token_throughput", "max_output_tokens_per_s": "max_output_tokens_per_s",
            "max_concurrent_requests": "max_concurrent_requests"}  # fmt: skip
    for metric in ("ttft", "tpot", "itl", "e2el"):
        same |= {f"{stat}_{metric}_ms": f"{stat}_{metric}_ms" for stat in ("mean", "median", "std")}
        for p, value in theirs[f"percentiles_{metric}_ms"]:
            word = str(int(p)) if int(p) == p else str(p)
            assert ours[f"p{word}_{metric}_ms"] == pytest.approx(value, rel=1e-12), (metric, p)
    for vllm_name, key in same.items():
        assert ours[key] == pytest.approx(theirs[vllm_name], rel=1e-12), key
    assert 0 < theirs["request_goodput"] < theirs["request_throughput"]  # the SLO sorts some requests out
    # headway's own summary: the same samples, in seconds
    assert summary.tpot.mean * 1000 == pytest.approx(theirs["mean_tpot_ms"], rel=1e-12)
    assert summary.itl.p99 * 1000 == pytest.approx(theirs["percentiles_itl_ms"][2][1], rel=1e-12)
    assert summary.ttft.p90 * 1000 == pytest.approx(theirs["percentiles_ttft_ms"][1][1], rel=1e-12)
    assert summary.e2e.p50 * 1000 == pytest.approx(theirs["median_e2el_ms"], rel=1e-12)
    assert summary.request_throughput == pytest.approx(theirs["request_throughput"], rel=1e-12)


def _saved(tmp_path: Path, *args: str) -> dict[str, Any]:
    assert main(["bench", "serve", *args, "--save-result", "--result-dir", str(tmp_path), "--json"]) == 0
    (path,) = tmp_path.iterdir()
    result: dict[str, Any] = json.loads(path.read_text())
    path.unlink()
    return result


@pytest.mark.parametrize("stream", [True, False])
def test_the_result_file_counts_prompt_tokens_as_the_server_did(make_stub, tmp_path, capsys, stream) -> None:
    # vllm bench serve takes each prompt's length from the answer's usage.prompt_tokens (the stub says 1),
    # not from what it meant to send (here 8 words each)
    stub = make_stub()
    args = ["--base-url", stub.url, "--workload", "burst", "--num-prompts", "4", "--max-prompt-tokens", "8",
            "--max-output-tokens", "3", *([] if stream else ["--no-stream"])]  # fmt: skip
    result = _saved(tmp_path, *args)
    assert result["input_lens"] == [1] * 4 and result["total_input_tokens"] == 4
    assert result["total_token_throughput"] == pytest.approx((4 + 12) / result["duration"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["total_prompt_tokens"] == 32  # headway's own summary keeps the workload's units


def test_the_result_files_request_rate_is_the_rate_sent_at(make_stub, tmp_path) -> None:
    # vllm bench serve's request_rate is the rate its requests were sent at ("inf": all at once)
    stub = make_stub()
    base = ["--base-url", stub.url, "--num-prompts", "3", "--max-output-tokens", "1", "--max-prompt-tokens", "4"]
    assert _saved(tmp_path, *base, "--workload", "burst")["request_rate"] == "inf"
    assert _saved(tmp_path, *base, "--workload", "default", "--request-rate", "40")["request_rate"] == 40.0
    # --time-scale 0.5 sends twice as fast
    assert _saved(tmp_path, *base, "--workload", "default", "--request-rate", "40", "--time-scale", "0.5")[
        "request_rate"
    ] == pytest.approx(80.0)
    # no --request-rate: the workload's own arrivals (timed, not all at once)
    own = _saved(tmp_path, *base, "--workload", "default", "--time-scale", "0.01")["request_rate"]
    assert isinstance(own, float) and math.isfinite(own) and own > 0
