"""The stub backend itself: its stats, client disconnects and SIGTERM."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from headway.serve import free_port

from .conftest import wait_until


def test_stats_survive_a_prompt_with_a_lone_surrogate(make_stub):
    stub = make_stub()
    raw = b'{"prompt": "x \\ud800 y", "max_tokens": 2}'
    r = httpx.post(stub.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    stats = httpx.get(stub.url + "/stub/stats")
    assert stats.status_code == 200 and stats.json()["order"] == ["x \ud800 y"]


def test_fields_are_read_as_vllm_reads_them(make_stub):
    # vLLM's request models read ints and bools in pydantic's lax mode ("5.00" is 5, "false" is False):
    # a body vLLM takes must not make the stub fail with a 500
    stub = make_stub()
    chat = "/v1/chat/completions"
    for path, body, tokens, answers in [
        ("/v1/completions", {"prompt": "x", "max_tokens": "5.00", "n": "2", "stream": "false"}, 5, 2),
        (chat, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4.0, "n": 3.0}, 4, 3),
        # chat's max_completion_tokens comes before its max_tokens, as in vLLM's ChatCompletionRequest
        (chat, {"messages": [{"content": "x"}], "max_completion_tokens": " 6 ", "max_tokens": 9}, 6, 1),
    ]:
        r = httpx.post(stub.url + path, json=body)
        assert r.status_code == 200, (body, r.text)
        assert (r.json()["usage"]["completion_tokens"], len(r.json()["choices"])) == (tokens * answers, answers), body
    body = {"prompt": "x", "max_tokens": "3", "stream": "on", "stream_options": {"include_usage": "true"}}
    with httpx.stream("POST", stub.url + "/v1/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and len(events) == 3 + 2 and events[-1] == "data: [DONE]", events  # 3 tokens, usage
    assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 3


def test_non_streamed_request_ends_when_its_client_disconnects(make_stub):
    stub = make_stub(token_delay_s=0.05)  # 1000 tokens: 50 s
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stub.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1000}, timeout=0.3)
    wait_until(lambda: stub.stub.stats.aborted == 1, what="request aborted")
    assert stub.stub.stats.running == 0 and stub.stub.stats.completed == 0


def test_stub_process_exits_on_sigterm_with_a_request_in_flight():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "headway.serve", "stub", "--port", str(port), "--token-delay", "0.05"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def long_request() -> None:  # 50 s; its connection stays open
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1000}, timeout=30)

    try:
        wait_until(lambda: _healthy(url), timeout=20, what="stub up")
        threading.Thread(target=long_request, daemon=True).start()
        wait_until(lambda: httpx.get(url + "/stub/stats").json()["running"] == 1, what="request running")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) is not None
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False
