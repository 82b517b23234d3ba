"""The load generator against the stub, directly and through the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from starlette.applications import Starlette

from headway.core import Tier
from headway.metrics import summarize
from headway.serve import BackendConfig, BenchConfig, TenantConfig, free_port, hash_api_key, run_bench_sync
from headway.serve._cli import main
from headway.workload import RequestSpec, Workload


def _workload() -> Workload:
    specs = [
        RequestSpec(f"r{i}", 0.02 * i, num_prompt_tokens=10, num_output_tokens=n,
                    tenant_id="acme" if i % 2 else "bulk")
        for i, n in enumerate([3, 12, 5, 20, 8, 1])
    ]  # fmt: skip
    return Workload.from_specs("tiny", specs)


def test_bench_fills_request_times_for_metrics(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.002)
    tenants = (
        TenantConfig("acme", Tier.PREMIUM, (hash_api_key("ka"),)),
        TenantConfig("bulk", Tier.BATCH, (hash_api_key("kb"),)),
    )
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)], tenants=tenants)
    cfg = BenchConfig(gw.url, tenant_keys={"acme": "ka", "bulk": "kb"}, timeout_s=30)
    reqs = run_bench_sync(_workload(), cfg)
    assert [r.state.name for r in reqs] == ["FINISHED"] * 6
    assert [r.num_output_tokens for r in reqs] == [3, 12, 5, 20, 8, 1]
    for r in reqs:
        assert r.first_token_time is not None and r.last_token_time is not None and r.finish_time is not None
        assert r.arrival_time <= r.first_token_time <= r.last_token_time <= r.finish_time
    assert reqs[3].arrival_time >= 0.05  # arrivals follow the workload's times
    s = summarize(reqs, name="gw")
    assert s.num_completed == 6 and s.e2e.p99 > 0 and s.tpot.count == 5
    assert s.itl.count > 0 and s.itl.mean > 0  # streamed: the gaps between chunks were seen
    assert {q.tenant_id for q in gw.gateway.finished_requests} == {"acme", "bulk"}


def test_bench_without_streaming_takes_the_tokens_from_usage(make_stub, make_gateway):
    stub = make_stub(token_delay_s=0.002)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)])
    for endpoint in (stub.url, gw.url):
        reqs = run_bench_sync(_workload(), BenchConfig(endpoint, model="m", stream=False, timeout_s=30))
        assert [r.state.name for r in reqs] == ["FINISHED"] * 6
        assert [r.num_output_tokens for r in reqs] == [3, 12, 5, 20, 8, 1]
        for r in reqs:
            assert r.arrival_time < r.first_token_time == r.finish_time
            assert r.last_token_time is None  # tokens not seen one by one
        assert reqs[3].finish_time - reqs[3].arrival_time >= 20 * 0.002  # the whole answer was waited for
        s = summarize(reqs, name="x")
        assert s.num_completed == 6 and s.tpot.count == 0  # TPOT n/a, not 0
        assert s.itl.count == 0  # no chunks, no ITL


def test_bench_without_streaming_records_an_answer_without_usage_as_a_bad_response(servers):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from headway.serve import serve_in_thread

    async def completions(request: Request) -> Response:
        body = await request.json()
        if body["max_tokens"] == 3:
            return PlainTextResponse("not json")
        if body["max_tokens"] == 12:
            return JSONResponse({"choices": [{"text": "x"}], "usage": {"completion_tokens": "many"}})
        return JSONResponse({"choices": [{"text": "x"}]})  # no usage: the tokens are unknown

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    url = servers.enter_context(serve_in_thread(app))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", stream=False, timeout_s=30))
    assert [r.state.name for r in reqs] == ["ABORTED"] * 6
    assert {r.extra["abort_reason"] for r in reqs} == {"bad_response"}
    assert summarize(reqs, name="x").num_completed == 0


@pytest.mark.parametrize("stream", [True, False])
def test_bench_reports_the_prefix_cache_hits_the_server_reports(make_stub, make_gateway, stream):
    """usage.prompt_tokens_details.cached_tokens (vLLM with --enable-prompt-tokens-details), through the
    gateway as straight from the server, gives each request's cached tokens and the run's hit rate."""
    stub = make_stub(cached_tokens=16)
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)])
    for endpoint in (stub.url, gw.url):
        reqs = run_bench_sync(_workload(), BenchConfig(endpoint, model="m", stream=stream, timeout_s=30))
        assert [r.num_cached_tokens for r in reqs] == [16] * 6
        assert [r.num_prompt_tokens for r in reqs] == [116] * 6  # the server's count, not the words sent
        s = summarize(reqs, name="x")
        assert s.prefix_cache_hit_rate == pytest.approx(16 / 116)
    plain = make_stub()  # (vLLM's default: no such field) no hit rate, not 0
    reqs = run_bench_sync(_workload(), BenchConfig(plain.url, model="m", stream=stream, timeout_s=30))
    assert summarize(reqs, name="x").prefix_cache_hit_rate is None


def test_bench_records_rejections_as_aborted(make_stub, make_gateway):
    stub = make_stub()
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("ka"),)),)
    gw = make_gateway([stub.url], tenants=tenants)
    reqs = run_bench_sync(_workload(), BenchConfig(gw.url, model="m", tenant_keys={"acme": "ka"}, timeout_s=30))
    by_tenant = {r.tenant_id: r for r in reqs}
    assert by_tenant["acme"].state.name == "FINISHED"
    assert by_tenant["bulk"].state.name == "ABORTED" and by_tenant["bulk"].extra["abort_reason"] == "http_401"


def test_bench_cli_against_the_stub(make_stub, capsys, tmp_path):
    stub = make_stub()
    rc = main(["bench", "serve", "--base-url", stub.url, "--workload", "burst", "--num-requests", "8",
               "--max-output-tokens", "4", "--max-prompt-tokens", "16", "--json", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    assert '"num_completed": 8' in capsys.readouterr().out
    assert (tmp_path / "summary.json").exists()


def test_bench_cli_report_says_how_it_was_made(make_stub, tmp_path):
    import json

    from headway.cli import main as headway_main

    stub = make_stub()
    argv = ["bench", "serve", "--base-url", stub.url, "--workload", "burst", "--num-requests", "3",
            "--max-output-tokens", "4", "--max-prompt-tokens", "16", "--no-progress",
            "--out", str(tmp_path)]  # fmt: skip
    assert headway_main(argv) == 0
    meta = json.loads((tmp_path / "summary.json").read_text())["meta"]
    assert meta["command"].startswith("headway bench serve --base-url " + stub.url)
    assert any(stub.url in note for note in meta["notes"])  # the endpoint the numbers were measured on
    out2 = tmp_path / "again"
    assert main([*argv[:-1], str(out2)]) == 0  # python -m headway.serve
    assert json.loads((out2 / "summary.json").read_text())["meta"]["command"].startswith(
        "python -m headway.serve bench serve"
    )


def test_bench_cli_reports_goodput(make_stub, capsys):
    # a loose target every request meets and an impossible one none meets
    stub = make_stub()
    base = ["bench", "serve", "--base-url", stub.url, "--workload", "burst", "--num-requests", "6",
            "--max-output-tokens", "4", "--max-prompt-tokens", "16", "--json"]  # fmt: skip
    import json

    assert main([*base, "--goodput", "e2el:60000"]) == 0
    loose = json.loads(capsys.readouterr().out)
    assert loose["slo_attainment"] == 1.0 and loose["goodput"] > 0
    assert main([*base, "--goodput", "ttft:0.001"]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["slo_attainment"] == 0.0 and tight["goodput"] == 0.0
    assert main([*base, "--goodput", "speed:5"]) == 2
    assert "--goodput" in capsys.readouterr().err


def test_bench_config_validation():
    with pytest.raises(ValueError, match="endpoint"):
        BenchConfig("localhost:8000")
    with pytest.raises(ValueError, match="time_scale"):
        BenchConfig("http://x", time_scale=0)
    for name in ("time_scale", "timeout_s", "request_timeout_s"):
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValueError, match=f"{name} must be a finite number > 0"):
                BenchConfig("http://x", **{name: bad})


# ------------------------------------------------------------- unusable endpoints
BASE = ["bench", "serve", "--workload", "burst", "--num-requests", "3", "--max-output-tokens", "2"]


def test_bench_cli_says_why_an_endpoint_cannot_be_benchmarked(make_stub, make_gateway, make_hole, capsys):
    import time

    dead = f"http://127.0.0.1:{free_port()}"
    stub = make_stub()
    gw = make_gateway([stub.url], tenants=(TenantConfig("acme", Tier.PREMIUM, (hash_api_key("ka"),)),))
    cases = [
        ([dead], f"headway: error: cannot reach {dead}/v1/models: ConnectError"),
        (["http://no-such-host.invalid"], "headway: error: cannot reach http://no-such-host.invalid/v1/models"),
        ([stub.url + "/foo"], f"headway: error: GET {stub.url}/foo/v1/models answered 404: --base-url must be"),
        ([gw.url], f"headway: error: GET {gw.url}/v1/models answered 401: the endpoint wants an API key (--api-key"),
        ([make_hole(), "--timeout", "1"], "/v1/models: no answer within 1 s (--model NAME skips this lookup)"),
    ]
    for extra, message in cases:
        t0 = time.monotonic()
        assert main([*BASE, "--base-url", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert time.monotonic() - t0 < 15


def test_bench_cli_prints_why_requests_were_aborted(capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    assert main([*BASE, "--base-url", dead, "--model", "m"]) == 1
    assert "aborted requests by reason: ConnectError: 3" in capsys.readouterr().out


def test_bench_cli_checks_its_arguments_before_the_run(tmp_path, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    base = ["bench", "serve", "--base-url", dead, "--model", "m"]
    out_file = tmp_path / "f"
    out_file.write_text("")
    burstgpt = tmp_path / "b.csv"
    burstgpt.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,GPT-4,4,2,6,API log\n")
    for extra, message in [
        (["--num-requests", "0"], "--num-prompts must be >= 1, got 0"),
        (["--num-requests", "2", "--time-scale", "inf"], "--time-scale must be a finite number > 0, got inf"),
        (["--num-requests", "2", "--timeout", "nan"], "--timeout must be a finite number > 0, got nan"),
        # a setting's error names its flag, as simulate's do (a file's error keeps its own words)
        (["--num-requests", "2", "--request-rate", "-1"], "--request-rate must be a positive finite number"),
        (["--workload", str(burstgpt), "--format", "nope"], "--format must be one of"),
        (["--num-requests", "2", "--out", str(out_file)], f"--out {out_file}: exists and is not a folder"),
        # --format reaches the reader, as simulate's does (a BurstGPT file read as an Azure trace)
        (["--workload", str(burstgpt), "--format", "azure"], f"{burstgpt}:1: header: missing column(s) TIMESTAMP"),
        (["--num-requests", "2", "--max-concurrency", "-1"], "--max-concurrency must be >= 0, got -1"),
        (["--num-requests", "2", "--max-output-tokens", "-2"], "--max-output-tokens must be >= 0, got -2"),
        # the result file's folder, before the run rather than after it
        (["--num-requests", "2", "--save-result", "--result-dir", str(out_file)], f"--result-dir: {out_file} is not"),
        (["--num-requests", "2", "--save-result", "--result-filename", str(tmp_path)], f"--result-filename {tmp_path}"),
        (
            ["--num-requests", "2", "--save-result", "--result-dir", str(out_file), "--result-filename", "r.json"],
            f"--result-dir: {out_file} is not",
        ),  # (the folder is --result-dir's, though a file name is given)
    ]:
        assert main([*base, *extra]) == 2, extra
        captured = capsys.readouterr()
        assert captured.err.startswith(f"headway: error: {message}") and captured.out == "", captured
    base[base.index("--base-url") + 1] = "127.0.0.1:8000"  # the setting's name is its flag's here too
    assert main([*base, "--num-requests", "2"]) == 2
    assert capsys.readouterr().err == "headway: error: --base-url must be an http(s) URL, got '127.0.0.1:8000'\n"


def test_bench_reads_sse_without_the_space_after_data(servers):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from headway.serve import serve_in_thread

    async def completions(request: Request) -> Response:
        n = (await request.json())["max_tokens"]
        chunks = [b'data:{"choices":[{"text":"t"}]}\r\n\r\n'] * n
        chunks += [b'data:{"choices":[],"usage":{"completion_tokens":%d}}\r\n\r\n' % n, b"data:[DONE]\r\n\r\n"]
        return StreamingResponse(iter(chunks), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    url = servers.enter_context(serve_in_thread(app))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30))
    assert [r.state.name for r in reqs] == ["FINISHED"] * 6
    assert [r.num_output_tokens for r in reqs] == [3, 12, 5, 20, 8, 1]
    # tokens were seen as they came; the last one ends the request
    assert all(r.first_token_time < r.finish_time for r in reqs if r.num_output_tokens > 1)
    assert all(r.first_token_time <= r.last_token_time == r.finish_time for r in reqs)


def _sse_app(chunks_for: Callable[[int], list[tuple[float, str]]]) -> Starlette:
    """A /v1/completions that streams ``chunks_for(max_tokens)``: (seconds to wait, SSE data) pairs."""
    return _raw_sse_app(lambda n: [(wait, f"data: {data}\n\n".encode()) for wait, data in chunks_for(n)])


TOKEN = '{"choices":[{"text":"t"}]}'


def _usage(n: int) -> str:
    return '{"choices":[],"usage":{"completion_tokens":' + str(n) + "}}"


def test_bench_streamed_e2e_ends_at_the_last_token_and_records_itl(servers):
    # as vLLM: the usage chunk and [DONE], sent 0.4 s after the last token here, are not part of E2E
    from headway.metrics._summary import ITL_KEY
    from headway.serve import serve_in_thread

    def chunks(n: int) -> list[tuple[float, str]]:
        return [(0.002, TOKEN)] * n + [(0.4, _usage(n)), (0.0, "[DONE]")]

    url = servers.enter_context(serve_in_thread(_sse_app(chunks)))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30))
    assert [r.state.name for r in reqs] == ["FINISHED"] * 6
    assert [r.num_output_tokens for r in reqs] == [3, 12, 5, 20, 8, 1]
    for r in reqs:
        assert r.finish_time == r.last_token_time  # not the stream's close
        assert r.e2e_latency < 0.4, r.e2e_latency  # the wait before the usage chunk is not counted
        gaps = r.extra[ITL_KEY]
        assert len(gaps) == r.num_output_tokens - 1  # one gap between each two content chunks
        assert sum(gaps) == pytest.approx(r.last_token_time - r.first_token_time)
        assert min(gaps, default=0.0) >= 0.0
    s = summarize(reqs, name="x")
    assert s.itl.count == sum(n - 1 for n in [3, 12, 5, 20, 8, 1])
    # mean TPOT weighs requests, mean ITL weighs gaps: both come from the same times
    assert s.itl.mean == pytest.approx(sum(sum(r.extra[ITL_KEY]) for r in reqs) / s.itl.count)
    from headway.metrics._html import render_html

    assert "ITL, every gap between tokens (s)" in render_html({"x": (s, reqs)})  # the report shows it


def test_bench_aborts_a_stream_without_tokens(servers):
    # vLLM marks such a response failed ("Never received a valid chunk to calculate TTFT")
    from headway.serve import serve_in_thread

    def chunks(n: int) -> list[tuple[float, str]]:
        if n == 3:
            return [(0.0, "[DONE]")]  # nothing at all
        if n == 12:
            return [(0.0, _usage(12)), (0.0, "[DONE]")]  # a usage chunk but no content
        return [(0.0, TOKEN)] * n + [(0.0, _usage(n)), (0.0, "[DONE]")]

    url = servers.enter_context(serve_in_thread(_sse_app(chunks)))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30))
    assert [r.state.name for r in reqs] == ["ABORTED", "ABORTED", "FINISHED", "FINISHED", "FINISHED", "FINISHED"]
    assert [r.extra.get("abort_reason") for r in reqs[:2]] == ["no_tokens", "no_tokens"]
    assert all(r.first_token_time is None for r in reqs[:2])
    s = summarize(reqs, name="x")
    assert s.num_completed == 4 and dict(s.aborted_by_reason) == {"no_tokens": 2} and s.ttft.count == 4


def _raw_sse_app(body_for: Callable[[int], list[tuple[float, bytes]]]) -> Starlette:
    """A /v1/completions that streams ``body_for(max_tokens)``: (seconds to wait, raw bytes) pairs."""
    import asyncio

    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> Response:
        n = (await request.json())["max_tokens"]

        async def events() -> AsyncIterator[bytes]:
            for wait, raw in body_for(n):
                if wait:
                    await asyncio.sleep(wait)
                yield raw

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_bench_reads_lone_cr_line_endings_and_long_events(servers):
    # SSE lines may end in a lone CR; one event may be long (a token's text, logprobs): 1 MB here,
    # over aiohttp's default line limit (512 KiB)
    from headway.serve import serve_in_thread

    big = b'data: {"choices":[{"text":"' + b"x" * 1_000_000 + b'"}]}\n\n'

    def body(n: int) -> list[tuple[float, bytes]]:
        tokens = [(0.0, b'data: {"choices":[{"text":"t"}]}\r\r')] * (n - 1) + [(0.0, big)]
        usage = b'data: {"choices":[],"usage":{"completion_tokens":%d}}\r\r' % n
        return [*tokens, (0.0, usage), (0.0, b"data: [DONE]\r\r")]

    url = servers.enter_context(serve_in_thread(_raw_sse_app(body)))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30))
    assert [r.state.name for r in reqs] == ["FINISHED"] * 6
    assert [r.num_output_tokens for r in reqs] == [3, 12, 5, 20, 8, 1]
    assert [len(r.extra["itl"]) for r in reqs] == [2, 11, 4, 19, 7, 0]  # every token seen as a chunk


def test_bench_aborts_a_stalled_stream_after_the_request_timeout(servers):
    # a stream that stops sending: aborted ("Timeout") once no byte came for request_timeout_s,
    # while a stream as slow but steady is not (the limit is per read, not per stream)
    import time

    from headway.serve import serve_in_thread

    def body(n: int) -> list[tuple[float, bytes]]:
        token = b'data: {"choices":[{"text":"t"}]}\n\n'
        if n == 3:
            return [(0.0, token), (30.0, token)]  # stalls after its first token
        return [(0.3, token)] * 4 + [(0.0, b"data: [DONE]\n\n")]  # 1.2 s in all, a token every 0.3 s

    url = servers.enter_context(serve_in_thread(_raw_sse_app(body)))
    specs = [RequestSpec("stall", 0.0, num_prompt_tokens=4, num_output_tokens=3),
             RequestSpec("slow", 0.0, num_prompt_tokens=4, num_output_tokens=4)]  # fmt: skip
    t0 = time.monotonic()
    reqs = run_bench_sync(Workload.from_specs("w", specs), BenchConfig(url, model="m", request_timeout_s=1.0))
    assert time.monotonic() - t0 < 10
    assert reqs[0].state.name == "ABORTED" and reqs[0].extra["abort_reason"] == "Timeout"
    assert reqs[1].state.name == "FINISHED" and reqs[1].num_output_tokens == 4


def test_bench_itl_key_is_the_metrics_one():
    from headway.metrics._summary import ITL_KEY
    from headway.serve._bench import _ITL_KEY

    assert _ITL_KEY == ITL_KEY


def test_bench_error_message_key_is_the_metrics_one():
    from headway.metrics._summary import ERROR_MESSAGE_KEY
    from headway.serve._bench import ERROR_MESSAGE_KEY as bench_key

    assert bench_key == ERROR_MESSAGE_KEY  # the requests CSV's abort_message reads what the bench wrote


# ------------------------------------------------------------- vllm bench serve's vocabulary
def test_bench_cli_speaks_vllm_bench_serve(make_stub, capsys, tmp_path):
    import json

    stub = make_stub()
    args = ["bench", "serve", "--base-url", stub.url, "--endpoint", "/v1/chat/completions", "--workload", "default",
            "--num-prompts", "5", "--request-rate", "50", "--max-concurrency", "2", "--max-output-tokens", "3",
            "--max-prompt-tokens", "8", "--goodput", "e2el:60000", "--save-result", "--result-dir", str(tmp_path),
            "--metric-percentiles", "50,99", "--json"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    (path,) = tmp_path.iterdir()
    assert str(path) in err
    # vLLM's file name: {label}-{request_rate}qps-concurrency{N}-{model}-{date}.json
    assert path.name.startswith("openai-50.0qps-concurrency2-stub-model-") and path.suffix == ".json"
    result = json.loads(path.read_text())
    vllm_keys = {
        "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
        "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
        "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests",
        "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors",
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
        "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
    }  # fmt: skip
    assert vllm_keys <= set(result)
    assert (result["num_prompts"], result["completed"], result["failed"]) == (5, 5, 0)
    assert result["output_lens"] == [3] * 5 and result["max_concurrency"] == 2 and result["request_rate"] == 50.0
    assert all(len(gaps) == 2 for gaps in result["itls"])  # 3 streamed tokens: 2 gaps each
    assert result["request_goodput"] > 0 and result["p99_e2el_ms"] >= result["median_e2el_ms"] > 0
    assert stub.stub.stats.completed == 5  # chat, through --endpoint /v1/chat/completions


def test_the_result_json_has_vllms_peak_throughput_and_concurrency():
    # vllm bench serve writes max_output_tokens_per_s and max_concurrent_requests (the busiest
    # one-second buckets from the first request's start); tools reading its files read them too
    from headway.core import Request, RequestState
    from headway.serve._bench_result import vllm_bench_result

    def done(rid: str, start: float, first: float, gaps: list[float]) -> Request:
        r = Request(rid, start, 8, 16)
        r.state = RequestState.FINISHED
        r.first_token_time, r.extra["itl"] = first, gaps
        r.num_output_tokens = len(gaps) + 1
        r.last_token_time = r.finish_time = first + sum(gaps)
        return r

    a = done("a", 0.0, 0.5, [0.25, 0.5])  # tokens at 0.5, 0.75 | 1.25
    b = done("b", 0.25, 0.75, [0.125] * 3)  # tokens at 0.75, 0.875 | 1.0, 1.125
    c = Request("c", 0.5, 8, 16)
    c.state, c.finish_time = RequestState.ABORTED, 3.0  # failed: not counted
    result = vllm_bench_result([a, b, c], label="x", model_id="m", request_rate=1.0, burstiness=1.0,
                               max_concurrency=None, goodput=None, duration=1.25)  # fmt: skip
    assert result["max_output_tokens_per_s"] == 4.0
    assert result["max_concurrent_requests"] == 2
    empty = vllm_bench_result([c], label="x", model_id="m", request_rate=1.0, burstiness=1.0,
                              max_concurrency=None, goodput=None, duration=1.0)  # fmt: skip
    assert (empty["max_output_tokens_per_s"], empty["max_concurrent_requests"]) == (0.0, 0)


def test_bench_cli_endpoint_spellings(make_stub, capsys, tmp_path):
    stub = make_stub()
    base = ["bench", "serve", "--workload", "burst", "--num-prompts", "2", "--max-output-tokens", "2", "--json"]
    assert main([*base, "--endpoint", stub.url]) == 0  # the old spelling: a URL in --endpoint
    assert "old spelling of --base-url" in capsys.readouterr().err
    assert main([*base, "--base-url", stub.url, "--endpoint", "/v1/embeddings"]) == 2
    assert "--endpoint must be /v1/completions or /v1/chat/completions" in capsys.readouterr().err
    assert main(base) == 2
    assert "--base-url URL is required" in capsys.readouterr().err
    assert main([*base, "--base-url", stub.url, "--metric-percentiles", "99,x"]) == 2


def _shared(a: str, b: str) -> int:
    """Words two texts start with alike."""
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


def test_synthetic_prompts_share_a_prefix_only_where_the_workload_says() -> None:
    from headway.serve._bench import synthetic_prompt

    assert len(synthetic_prompt(100, "0/a").split()) == 100
    assert synthetic_prompt(100, "0/a") == synthetic_prompt(100, "0/a")  # seeded: a rerun sends the same
    # without block hashes no two requests, nor two seeds of one, start alike (but for a chance word or
    # two: the words are drawn from a few dozen)
    texts = [synthetic_prompt(n, f"0/r{i}") for i, n in enumerate([40, 400, 64, 1000, 17])]
    texts += [synthetic_prompt(400, "1/r1")]
    assert max(_shared(a, b) for i, a in enumerate(texts) for b in texts[i + 1 :]) <= 2
    # block hashes (16 words each): a text prefix as long as the blocks two requests share
    first = synthetic_prompt(80, "0/x", (11, 12, 13, 14, 15))
    assert 32 <= _shared(first, synthetic_prompt(70, "0/y", (11, 12, 99))) <= 34
    assert 32 <= _shared(synthetic_prompt(48, "0/z", (11, 12)), first) <= 34  # past its hashes: its own words
    long = synthetic_prompt(1024, "0/m", (7, 8), block_size=512)
    assert 512 <= _shared(long, synthetic_prompt(600, "0/n", (7,), 512)) <= 514


def test_the_bench_sends_the_synthetic_texts(make_stub) -> None:
    stub = make_stub()
    specs = [RequestSpec(f"s{i}", 0.0, num_prompt_tokens=48, num_output_tokens=2) for i in range(4)]
    specs.append(RequestSpec("h", 0.0, num_prompt_tokens=48, num_output_tokens=2, block_hashes=(5, 6)))
    specs.append(RequestSpec("k", 0.0, num_prompt_tokens=48, num_output_tokens=2, block_hashes=(5, 6, 7)))
    reqs = run_bench_sync(Workload.from_specs("texts", specs), BenchConfig(stub.url, model="m", prompt_seed=3))
    assert all(r.state.name == "FINISHED" for r in reqs)
    sent = stub.stub.stats.order
    assert len(set(sent)) == 6 and all(len(p.split()) == 48 for p in sent)
    longest = sorted(max(_shared(p, q) for q in sent if q is not p) for p in sent)
    assert all(n <= 2 for n in longest[:4]) and all(32 <= n <= 34 for n in longest[4:])  # h and k share 2 blocks


def test_bench_serve_puts_shared_system_prompts_before_the_prompts(make_stub) -> None:
    stub = make_stub()
    argv = ["bench", "serve", "--base-url", stub.url, "--workload", "default", "--num-requests", "6",
            "--max-output-tokens", "2", "--system-prompts", "1", "--system-prompt-tokens", "64", "--json"]  # fmt: skip
    assert main(argv) == 0
    sent = stub.stub.stats.order
    assert len(sent) == 6 and all(_shared(p, sent[0]) >= 64 for p in sent[1:])  # one system prompt: 4 blocks
    assert all(_shared(p, q) <= 66 for i, p in enumerate(sent) for q in sent[i + 1 :])  # then their own words


def _conversations(think: float) -> Workload:
    """Two conversations of three turns (the shape sharegpt-sessions gives): turn k's prompt is the
    history (earlier prompts and answers) and a new message of 8 tokens."""
    specs = []
    for c in range(2):
        history, prev = 0, None
        for k in range(3):
            rid = f"c{c}-{k}"
            specs.append(RequestSpec(rid, 0.01 * c, num_prompt_tokens=history + 8, num_output_tokens=3,
                                     after=prev, think_time=think if prev else 0.0))  # fmt: skip
            history, prev = history + 8 + 3, rid
    return Workload.from_specs("talks", specs)


def test_a_conversation_goes_turn_by_turn_with_the_answers_it_got(make_stub) -> None:
    stub = make_stub(token_delay_s=0.01)
    reqs = {r.request_id: r for r in run_bench_sync(_conversations(0.05), BenchConfig(stub.url, model="m"))}
    assert all(r.state.name == "FINISHED" for r in reqs.values())
    for c in range(2):
        for k in (1, 2):
            this, before = reqs[f"c{c}-{k}"], reqs[f"c{c}-{k - 1}"]
            assert this.arrival_time >= before.finish_time + 0.05  # a think time after the answer
    sent = {p.split()[0]: p for p in stub.stub.stats.order}  # (each conversation starts its own way)
    assert len(stub.stub.stats.order) == 6
    for first in [p for p in stub.stub.stats.order if len(p.split()) == 8]:
        second = next(p for p in stub.stub.stats.order if p != first and p.startswith(first + " "))
        third = next(p for p in stub.stub.stats.order if p != second and p.startswith(second + " "))
        # the conversation so far, the stub's answer (" tok" a token), a new message of 8 words
        assert second == first + " tok tok tok " + second.split(" tok tok tok ", 1)[1]
        assert len(second.split()) == 8 + 3 + 8 and len(third.split()) == 2 * (8 + 3) + 8
    assert len(sent) == 2


def test_a_failed_turn_ends_its_conversation(make_stub) -> None:
    stub = make_stub(fail_status=503)
    reqs = {r.request_id: r for r in run_bench_sync(_conversations(0.0), BenchConfig(stub.url, model="m"))}
    assert {rid: r.extra.get("abort_reason") for rid, r in reqs.items()} == {
        "c0-0": "http_503", "c0-1": "previous_turn_failed", "c0-2": "previous_turn_failed",
        "c1-0": "http_503", "c1-1": "previous_turn_failed", "c1-2": "previous_turn_failed",
    }  # fmt: skip


def test_vllms_admission_rejections_are_named_as_the_simulator_names_them(make_stub) -> None:
    # a burst of 6 on a server that holds 2 unfinished requests (vLLM's --max-num-queued-reqs 2): the
    # others get vLLM's 503, named by the limit as in the simulator's summaries, not "http_503"
    stub = make_stub(max_num_seqs=1, token_delay_s=0.02, max_num_queued_reqs=2)
    wl = Workload.from_specs("burst", [RequestSpec(f"r{i}", 0.0, 10, 5) for i in range(6)])
    reqs = run_bench_sync(wl, BenchConfig(stub.url, model="m"))
    reasons = sorted(str(r.extra.get("abort_reason")) for r in reqs)
    assert reasons == ["None"] * 2 + ["rejected: max_num_queued_reqs"] * 4
    assert stub.stub.stats.rejected == 4


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        (b'{"error": {"message": "The engine is currently busy and cannot accept new requests. Please try '
         b'again later or on a different instance.", "type": "Service Unavailable", "code": 503}}',
         "max_num_queued_reqs"),
        (b'{"error": {"message": "The engine has reached its prefill token backlog limit. Please try again '
         b'later or on a different instance.", "type": "Service Unavailable", "code": 503}}',
         "max_num_queued_tokens"),
        (b'{"error": {"message": "something else", "type": "Service Unavailable"}}', "admission"),
        (b'{"error": {"message": "injected failure", "code": 503}}', None),
        (b"Service Unavailable", None),
        (b'{"error": "busy"}', None),
    ],
)  # fmt: skip
def test_admission_rejection_reads_vllms_503(body: bytes, limit: str | None) -> None:
    from headway.serve._wire import admission_rejection

    assert admission_rejection(body) == limit


def test_a_streamed_chunk_with_usage_and_choices_gives_both_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's continuous usage stats put usage in every content chunk: the token text and the count
    # come from one parse of it
    import asyncio
    import json

    from headway.core import Request, RequestState
    from headway.serve import _bench

    chunks = [
        {"choices": [{"index": 0, "text": "Hel"}], "usage": {"completion_tokens": 1}},
        {"choices": [{"index": 0, "text": "lo"}], "usage": {"completion_tokens": 2}},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]

    async def lines() -> AsyncIterator[str]:
        for c in chunks:  # (each event ended by its blank line)
            yield "data: " + json.dumps(c)
            yield ""
        yield "data: [DONE]"

    parses = []
    loads = json.loads
    monkeypatch.setattr(_bench.json, "loads", lambda s, *a, **k: parses.append(s) or loads(s, *a, **k))
    req, answer = Request("r", 0.0, 4, max_tokens=8), []
    req.transition(RequestState.RUNNING)  # (sent)
    asyncio.run(_bench._read_stream(lines(), req, 0.0, answer))
    assert ("".join(answer), req.num_output_tokens, len(parses)) == ("Hello", 2, 3)


def _read_timed_stream(monkeypatch: pytest.MonkeyPatch, events: list[tuple[float, str]]) -> Any:
    """A sent request after ``_bench._read_stream`` read ``events`` (time, ``data:`` payload), the
    bench's clock standing at each event's time as it comes."""
    import asyncio
    import types

    from headway.core import Request, RequestState
    from headway.serve import _bench

    now = [0.0]
    monkeypatch.setattr(_bench, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    async def lines() -> AsyncIterator[str]:
        for t, data in events:
            now[0] = t
            yield "data: " + data
            yield ""  # (the event's end)

    req = Request("r", 0.0, 4, max_tokens=8)
    req.transition(RequestState.RUNNING)  # (sent)
    asyncio.run(_bench._read_stream(lines(), req, 0.0))
    return req


def test_a_streamed_chunk_without_a_choice_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # vllm bench serve (lib/endpoint_request_func.py) times only chunks whose "choices" is not empty: a
    # first chunk with no choice (Azure OpenAI's prompt_filter_results) is not the first token, and a
    # usage chunk is not the last one even when its usage lacks completion_tokens
    from headway.core import RequestState

    events = [
        (0.125, '{"choices":[],"prompt_filter_results":[{"prompt_index":0}]}'),
        (0.25, TOKEN),
        (0.375, '{"choices": [{"index": 0, "text": "t"}]}'),
        (0.625, TOKEN),
        (0.75, '{"id":"x","choices":[]}'),
        (0.875, '{"choices":[],"usage":{"prompt_tokens":7}}'),
        (1.0, "[DONE]"),
    ]
    req = _read_timed_stream(monkeypatch, events)
    assert req.state is RequestState.FINISHED and req.num_output_tokens == 3
    assert (req.first_token_time, req.finish_time, list(req.extra["itl"])) == (0.25, 0.625, [0.125, 0.25])


@pytest.mark.parametrize(
    ("data", "why"),
    [('{"choices":[{"text":"t"}', "not JSON"), ("[1]", "not a JSON object"), ('{"choices":[]} tail', "not JSON")],
)
def test_a_streamed_chunk_that_is_not_a_json_object_fails_the_request(monkeypatch, data, why) -> None:
    # vllm bench serve json.loads every chunk: one it cannot read (or whose .get fails) fails the request;
    # headway counted it as a token. The request keeps its TTFT and gaps so far, as vLLM's does
    from headway.core import RequestState

    events = [(0.25, TOKEN), (0.5, TOKEN), (0.75, data), (1.0, TOKEN), (1.25, _usage(3)), (1.5, "[DONE]")]
    req = _read_timed_stream(monkeypatch, events)
    assert req.state is RequestState.ABORTED and req.extra["abort_reason"] == "bad_chunk"
    assert req.extra["error_message"].startswith(f"a streamed chunk is {why}") and data in req.extra["error_message"]
    assert (req.first_token_time, req.finish_time, list(req.extra["itl"])) == (0.25, 0.75, [0.25])


def test_bench_reports_each_request_as_it_is_sent_and_as_it_ends(make_stub) -> None:
    stub = make_stub(token_delay_s=0.001)
    events: list[tuple[str, str]] = []
    reqs = run_bench_sync(
        _workload(),
        BenchConfig(stub.url),
        on_sent=lambda r: events.append(("sent", r.request_id)),
        on_done=lambda r: events.append(("done", r.request_id)),
    )
    ids = [r.request_id for r in reqs]
    assert sorted(i for what, i in events if what == "sent") == sorted(ids)
    assert sorted(i for what, i in events if what == "done") == sorted(ids)
    assert all(events.index(("sent", i)) < events.index(("done", i)) for i in ids)


def test_bench_cli_says_what_it_starts_and_shows_progress_on_a_terminal(make_stub, capsys, monkeypatch):
    """A long run (500 requests at 8/s: a minute) says what it does before it starts, and on a
    terminal shows requests sent and done while it runs; stdout has only the results."""
    import json
    import sys

    stub = make_stub()
    args = ["bench", "serve", "--base-url", stub.url + "/v1", "--workload", "default", "--num-prompts", "6",
            "--request-rate", "50", "--max-output-tokens", "2", "--max-prompt-tokens", "8", "--json"]  # fmt: skip
    assert main(args) == 0  # stderr is no terminal here: the start line only
    out, err = capsys.readouterr()
    start = f"headway: sending 6 requests to {stub.url}/v1/completions, arriving over about "
    assert err.startswith(start) and err.endswith(" s (50 requests/s)\n") and err.count("\n") == 1, err
    assert json.loads(out)["num_completed"] == 6
    start = err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err.startswith(start) and "6/6" in err and "6 sent, 0 aborted" in err, err
    assert json.loads(out)["num_completed"] == 6
    assert main([*args, "--no-progress"]) == 0
    assert capsys.readouterr().err == start


def test_bench_start_line_says_how_long_the_arrivals_take() -> None:
    from headway.serve._bench_cli import _start_line

    url = "http://h/v1/completions"
    specs = [RequestSpec(f"r{i}", i / 8, num_prompt_tokens=10, num_output_tokens=5) for i in range(500)]
    wl = Workload.from_specs("w", specs)
    assert _start_line(wl, url, 8.0, 1.0, 0) == (
        "headway: sending 500 requests to http://h/v1/completions, arriving over about 62 s (8 requests/s)"
    )
    assert _start_line(wl, url, None, 2.0, 4) == (
        "headway: sending 500 requests to http://h/v1/completions, arriving over about 2 min (4 requests/s), "
        "at most 4 at a time"
    )
    burst = Workload.from_specs("b", [RequestSpec(f"r{i}", 0.0, num_prompt_tokens=1, num_output_tokens=1)
                                      for i in range(3)])  # fmt: skip
    assert _start_line(burst, url, None, 1.0, 0) == f"headway: sending 3 requests to {url}, all at once"


# ------------------------------------------------------------- what a failed request was told, what was sent
def _context_app(context: int, sent: list[int], old_style: bool = False) -> Starlette:
    """A /v1/completions that, as vLLM, answers 400 when the prompt (one token a word) and
    ``max_tokens`` do not fit ``context`` tokens, else streams ``max_tokens`` tokens; ``sent``
    collects every request's ``max_tokens``. ``old_style``: vLLM's older ``{"object": "error"}`` body."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> Response:
        body = await request.json()
        n, out = len(body["prompt"].split()), body["max_tokens"]
        sent.append(out)
        if n + out > context:
            message = (
                f"This model's maximum context length is {context} tokens. However, you requested {n + out} "
                f"tokens ({n} in the messages, {out} in the completion). Please reduce the length of the "
                "messages or completion."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"object": "error", **error} if old_style else {"error": error}, status_code=400)
        chunks = [f"data: {TOKEN}\n\n"] * out + [f"data: {_usage(out)}\n\n", "data: [DONE]\n\n"]
        return StreamingResponse(iter(chunks), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_bench_cli_prints_what_the_backend_said_with_each_reason(servers, capsys):
    from headway.serve import serve_in_thread

    url = servers.enter_context(serve_in_thread(_context_app(1024, [])))
    # burst's first 8 prompts: 1115, 395, 1077, 821, 1554, 1239, 1050, 1115 tokens; 6 do not fit 1024
    args = ["bench", "serve", "--base-url", url, "--model", "m", "--workload", "burst", "--num-prompts", "8",
            "--max-output-tokens", "4"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "aborted requests by reason: http_400: 6\n" in out  # the reason stays short and stable
    (line,) = [x for x in out.splitlines() if x.startswith("  http_400 (6): ")]
    assert line.startswith("  http_400 (6): This model's maximum context length is 1024 tokens. However, you")
    assert len(line) <= len("  http_400 (6): ") + 200
    assert "hint: 6 requests did not fit the server's context (1024 tokens): --max-prompt-tokens N caps" in out
    assert main([*args, "--max-prompt-tokens", "512"]) == 0  # the hint's cure
    out = capsys.readouterr().out
    assert "aborted requests" not in out and "hint" not in out


@pytest.mark.parametrize("old_style", [False, True])
def test_bench_keeps_the_backends_message_with_a_failed_request(servers, old_style: bool) -> None:
    from headway.serve import serve_in_thread
    from headway.serve._bench import ERROR_MESSAGE_KEY

    url = servers.enter_context(serve_in_thread(_context_app(16, [], old_style)))
    specs = [RequestSpec("short", 0.0, 5, 3), RequestSpec("long", 0.0, 40, 3)]
    reqs = run_bench_sync(Workload.from_specs("w", specs), BenchConfig(url, model="m", timeout_s=30))
    assert [r.state.name for r in reqs] == ["FINISHED", "ABORTED"]
    assert ERROR_MESSAGE_KEY not in reqs[0].extra
    assert reqs[1].extra["abort_reason"] == "http_400"
    assert str(reqs[1].extra[ERROR_MESSAGE_KEY]).startswith("This model's maximum context length is 16 tokens.")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "too long", "type": "BadRequestError", "param": null, "code": 400}}', "too long"),
        (b'{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}', "too long"),
        (b'{"error": "busy"}', "busy"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"error": {"code": 500}}', '{"error": {"code": 500}}'),  # no message: the body as it came
        (b"Internal Server Error\n", "Internal Server Error"),
        (b"", None),
    ],
)  # fmt: skip
def test_error_message_reads_vllms_error_bodies(body: bytes, message: str | None) -> None:
    from headway.serve._bench import _error_message

    assert _error_message(body) == message
    assert _error_message(body.decode()) == message  # a stream's error event, already text


def test_bench_reports_the_max_tokens_it_sent(servers, tmp_path, capsys) -> None:
    import csv

    from headway.serve import serve_in_thread

    sent: list[int] = []
    url = servers.enter_context(serve_in_thread(_context_app(100_000, sent)))
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30, max_output_tokens=4))
    assert sorted(sent) == [1, 3, 4, 4, 4, 4]
    assert [r.max_tokens for r in reqs] == [3, 4, 4, 4, 4, 1]  # not the workload's 4096
    sent.clear()
    reqs = run_bench_sync(_workload(), BenchConfig(url, model="m", timeout_s=30))
    assert [r.max_tokens for r in reqs] == [3, 12, 5, 20, 8, 1] and sorted(sent) == [1, 3, 5, 8, 12, 20]
    # and in the report, as the operator read it
    sent.clear()
    args = ["bench", "serve", "--base-url", url, "--model", "m", "--workload", "default", "--num-prompts", "5",
            "--max-output-tokens", "32", "--max-prompt-tokens", "16", "--out", str(tmp_path), "--json"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    with (tmp_path / "requests_bench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["max_tokens"]) for r in rows] == [32] * 5 and sent == [32] * 5
    # the prompts sent were cut to 16 (synthetic) tokens by --max-prompt-tokens: so is the report
    assert [int(r["num_prompt_tokens"]) for r in rows] == [16] * 5


def test_bench_start_line_says_how_many_records_the_workload_skipped() -> None:
    from headway.serve._bench_cli import _start_line
    from headway.workload import RequestSpec, Workload

    spec = RequestSpec("a", 0.0, 5, 5)
    wl = Workload("log", (spec,), {"skipped": 3, "skipped_why": "no prompt/response pair or 0 tokens"})
    url = "http://127.0.0.1:8000/v1/completions"
    assert _start_line(wl, url, None, 1.0, 0) == (
        f"headway: sending 1 request to {url}, all at once; 3 records of log skipped: "
        "no prompt/response pair or 0 tokens"
    )


def test_an_interrupted_bench_says_how_far_it_got_and_writes_no_report(monkeypatch, tmp_path, capsys):
    # Ctrl-C (or SIGTERM) mid-run: the requests still running are the slowest, so no report is written
    # from the finished ones; the line says how many were done and sent
    import headway.serve._bench as bench
    from headway.cli import main as headway_main  # (its Ctrl-C handling: exit 130)

    def cut_off(workload, cfg, *, on_done=None, on_sent=None):  # type: ignore[no-untyped-def]
        reqs = [spec.to_request() for spec in list(workload)[:5]]
        for r in reqs:
            on_sent(r)
        for r in reqs[:3]:
            on_done(r)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench_sync", cut_off)
    out = tmp_path / "out"
    argv = ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m", "--workload", "burst",
            "--num-requests", "8", "--out", str(out), "--save-result", "--result-dir", str(tmp_path)]  # fmt: skip
    assert headway_main(argv) == 130
    err = capsys.readouterr().err
    assert "bench serve stopped with 3 of 8 requests done (5 sent); no report or result file" in err
    assert err.rstrip().endswith("headway: interrupted")
    assert not (out.exists() and any(out.iterdir())) and not list(tmp_path.glob("*.json"))


def test_run_bench_sync_inside_a_running_event_loop_says_to_await_run_bench() -> None:
    """A notebook runs an event loop: asyncio.run would fail there with its own message (and leave
    run_bench's coroutine never awaited); the error names what to call instead."""
    import asyncio

    async def in_a_notebook() -> None:
        with pytest.raises(RuntimeError, match=r"await run_bench\(workload, cfg\)"):
            run_bench_sync(_workload(), BenchConfig(f"http://127.0.0.1:{free_port()}", model="m"))

    asyncio.run(in_a_notebook())
