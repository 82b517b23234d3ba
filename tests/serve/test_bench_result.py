"""``headway bench serve --save-result`` against ``vllm bench serve``'s own numbers: the same per-request
outcomes through vLLM's ``calculate_metrics`` (in the vLLM venv) and through headway's result file and
summary; the prompt lengths and the request rate the file carries."""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headway.core import Request, RequestState
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
def test_the_result_file_has_vllms_numbers_for_the_same_outcomes(vllm_python: Path) -> None:
    python = vllm_python
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


def test_the_result_files_burstiness_is_the_gamma_shape_the_arrivals_were_drawn_with(
    make_stub, tmp_path, tmp_path_factory
) -> None:
    # vllm bench serve's burstiness is the shape of the Gamma its gaps come from; headway wrote 1.0 whatever
    # the arrivals were (the default workload's own are Gamma with shape 0.5)
    stub = make_stub()
    base = ["--base-url", stub.url, "--num-prompts", "3", "--max-output-tokens", "1", "--max-prompt-tokens", "4",
            "--time-scale", "0.01"]  # fmt: skip
    saved = _saved(tmp_path, *base, "--workload", "default", "--request-rate", "40", "--burstiness", "0.25")
    assert (saved["burstiness"], saved["request_rate"]) == (0.25, pytest.approx(4000.0))
    default = _saved(tmp_path, *base, "--workload", "default")
    assert (default["burstiness"], default["request_rate"]) == (0.5, pytest.approx(600.0))  # 6 req/s, scaled
    assert (
        _saved(tmp_path, *base, "--workload", "default", "--arrivals", "poisson", "--request-rate", "40")["burstiness"]
        == 1.0
    )
    burst = _saved(tmp_path, *base, "--workload", "burst")
    assert (burst["burstiness"], burst["request_rate"]) == (1.0, "inf")  # vLLM's at an infinite rate
    # a trace's own times: no Gamma drew them (null, as vLLM writes max_concurrency without a limit);
    # their rate is their mean
    trace = tmp_path_factory.mktemp("trace") / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0000000,4,1\n"
                     "2023-11-16 18:15:46.5000000,4,1\n2023-11-16 18:15:48.0000000,4,1\n")  # fmt: skip
    replayed = _saved(tmp_path, "--base-url", stub.url, "--workload", str(trace), "--time-scale", "0.01")
    assert replayed["burstiness"] is None and replayed["request_rate"] == pytest.approx(2 / 0.02)


def test_the_result_file_has_vllms_client_queue_times(make_stub, tmp_path) -> None:
    # vllm bench serve's queue_times: how long each request waited for a --max-concurrency slot
    stub = make_stub(token_delay_s=0.05)
    base = ["--base-url", stub.url, "--workload", "burst", "--num-prompts", "3", "--max-output-tokens", "4",
            "--max-prompt-tokens", "4"]  # fmt: skip
    one = _saved(tmp_path, *base, "--max-concurrency", "1")
    waits = sorted(one["queue_times"])
    assert waits[0] < 0.05 and 0.15 < waits[1] < waits[2]  # the second waits for the first's 4 tokens
    assert one["mean_client_queue_time_ms"] == pytest.approx(sum(waits) / 3 * 1000)
    assert "mean_e2el_including_client_queue_ms" not in one  # (vLLM: not at an infinite rate)
    free = _saved(tmp_path, *base)
    assert max(free["queue_times"]) < 0.05 and "mean_client_queue_time_ms" not in free
    assert one["rtfx"] == 0.0  # (no audio)


# Runs in the vLLM venv: vLLM's own client for /v1/completions against a URL; prints its outcome.
_VLLM_CLIENT = """
import asyncio, json, sys
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
async def main():
    async with aiohttp.ClientSession() as session:
        inp = RequestFuncInput(prompt="hi", api_url=sys.argv[1] + "/v1/completions", prompt_len=1,
                               output_len=int(sys.argv[2]), model="m")
        o = await async_request_openai_completions(inp, session)
    print(json.dumps({"success": o.success, "ttft": o.ttft, "itl": o.itl, "latency": o.latency}))
asyncio.run(main())
"""


@pytest.mark.vllm
def test_a_stream_vllm_fails_fails_here_and_keeps_vllms_partial_times(servers, tmp_path, vllm_python: Path) -> None:
    # vLLM's client parses every chunk: one that is not JSON fails the request (headway counted it as a
    # token); a failed request keeps the TTFT and the gaps it had, and its latency is 0, as vLLM's
    from headway.serve import BenchConfig, run_bench_sync, serve_in_thread
    from headway.workload import RequestSpec, Workload

    from .test_bench import TOKEN, _raw_sse_app, _usage

    python = vllm_python
    bad = {3: b'{"choices":[{"text":"t"}', 4: b"[1]", 5: b'{"choices":[{"text":"t"}]} tail'}
    """max_tokens -> the chunk that follows its three tokens: cut short, a JSON list, JSON and more."""

    def body(n: int) -> list[tuple[float, bytes]]:
        # the bad event and the token after it in one write: vLLM's client strips each read and parses
        # an event only once a later one ends it in the same read (a bad event read alone stays in its
        # buffer, never parsed, and the request succeeds: its verdict would depend on the machine's load)
        token = b"data: " + TOKEN.encode() + b"\n\n"
        tokens = [(0.02, token)] * 3
        worse = b"data: " + bad[n] + b"\n\n" if n in bad else b""
        rest = [(0.02, worse + token), (0.0, b"data: " + _usage(4).encode() + b"\n\n")]
        return [*tokens, *rest, (0.0, b"data: [DONE]\n\n")]

    url = servers.enter_context(serve_in_thread(_raw_sse_app(body)))
    specs = [RequestSpec(f"r{n}", 0.0, num_prompt_tokens=4, num_output_tokens=n) for n in (3, 4, 5, 6)]
    reqs = run_bench_sync(Workload.from_specs("w", specs), BenchConfig(url, model="m", timeout_s=30))
    theirs = []
    for n in (3, 4, 5, 6):
        done = subprocess.run([str(python), "-c", _VLLM_CLIENT, url, str(n)], capture_output=True, text=True,
                              timeout=300, check=True)  # fmt: skip
        theirs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [t["success"] for t in theirs] == [False, False, False, True]
    assert [r.state is RequestState.FINISHED for r in reqs] == [False, False, False, True]
    assert [r.extra.get("abort_reason") for r in reqs[:3]] == ["bad_chunk"] * 3
    assert "a streamed chunk is not JSON" in reqs[0].extra["error_message"]
    ours = vllm_bench_result(reqs, label="x", model_id="m", request_rate=math.inf, burstiness=1.0,
                             max_concurrency=None, goodput=None, duration=1.0)  # fmt: skip
    for i, t in enumerate(theirs):  # the same shape of per-request record: a TTFT, its gaps, latency 0 if failed
        assert (ours["ttfts"][i] > 0, len(ours["itls"][i])) == (t["ttft"] > 0, len(t["itl"])), (i, t)
        assert (ours["latencies"][i] == 0.0) == (t["latency"] == 0.0), (i, t)
    assert [len(g) for g in ours["itls"]] == [2, 2, 2, 3] and ours["output_lens"] == [0, 0, 0, 4]
    assert ours["completed"] == 1 and ours["failed"] == 3
    assert summarize(reqs).itl.count == 3  # the statistics stay of the completed requests
