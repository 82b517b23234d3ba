"""A backend's stream that breaks off after the client's 200: the client reads what vLLM's own server
sends a stream that fails (``serving_completion``/``serving_chat``: an OpenAI error event, then
``data: [DONE]``), never part of an event, and the gateway counts the request failed; the log
keeps the first failure of each kind and counts the rest."""

from __future__ import annotations

import json
import logging
import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest

from headway.serve._logging import FailureLog

from .test_gateway import COMPLETION

STREAM = {**COMPLETION, "stream": True}
VLLM_ERROR = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
"""What vLLM 0.32 sends a stream whose generation failed (``create_streaming_error_response``)."""


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _token(i: int, usage: bool = False) -> bytes:
    chunk: dict[str, object] = {"id": "cmpl-1", "object": "text_completion", "model": "m",
                                "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}  # fmt: skip
    if usage:  # vLLM's continuous_usage_stats: usage in every content chunk
        chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": i + 1, "total_tokens": i + 4}
    return _event(chunk)


USAGE = _event({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


def _stream(make_raw_backend, make_gateway, behaviour: str, answer: bytes, body: dict[str, object] = STREAM):
    """The gateway's answer, as the client reads it, to a stream request whose backend sends ``answer``
    and then ends as ``behaviour`` says (``cut``: the connection closed mid-body; ``end``: the body ended)."""
    url, _ = make_raw_backend(behaviour, answer)
    gw = make_gateway([url])
    with gw.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    assert raw.endswith("\n\n"), raw  # every event the client gets is whole
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), raw
    return gw, [e.removeprefix("data: ") for e in events]


def _rejections(gw) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith("headway_rejections_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = out.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _failed_with_an_error_event(gw, datas: list[str], tokens: int) -> dict[str, object]:
    assert [json.loads(d)["choices"][0]["text"] for d in datas[:tokens]] == [f" t{i}" for i in range(tokens)]
    assert len(datas) == tokens + 2 and datas[-1] == "[DONE]", datas
    assert gw.gateway.finished_requests[0].state.name == "ABORTED"
    assert _rejections(gw) == {"backend_error_midstream": 1.0}
    error: dict[str, object] = json.loads(datas[-2])["error"]
    return error


@pytest.mark.parametrize("behaviour", ["cut", "end"])
def test_a_stream_cut_after_some_tokens_ends_with_an_error_event_and_done(make_raw_backend, make_gateway, behaviour):
    gw, datas = _stream(make_raw_backend, make_gateway, behaviour, b"".join(_token(i) for i in range(3)))
    err = _failed_with_an_error_event(gw, datas, 3)
    why = "the backend failed mid-stream: " if behaviour == "cut" else "the backend closed the stream early"
    assert err["code"] == "upstream_error" and str(err["message"]).startswith(why), err


@pytest.mark.parametrize("behaviour", ["cut", "end"])
def test_a_stream_cut_inside_an_event_passes_no_part_of_it(make_raw_backend, make_gateway, behaviour):
    # a part of an event before the error event made one malformed event of both: an SDK's JSON error
    answer = b"".join(_token(i) for i in range(2)) + _token(2)[:25]
    gw, datas = _stream(make_raw_backend, make_gateway, behaviour, answer)
    _failed_with_an_error_event(gw, datas, 2)


@pytest.mark.parametrize("behaviour", ["cut", "end"])
def test_a_stream_with_usage_in_every_chunk_cut_is_a_failure(make_raw_backend, make_gateway, behaviour):
    # vLLM's continuous_usage_stats puts usage in each token's chunk: that is no proof the answer is whole
    body = {**STREAM, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    gw, datas = _stream(make_raw_backend, make_gateway, behaviour, b"".join(_token(i, True) for i in range(3)), body)
    _failed_with_an_error_event(gw, datas, 3)


@pytest.mark.parametrize("behaviour", ["cut", "end"])
def test_vllms_own_error_event_is_passed_on_and_counted_a_failure(make_raw_backend, make_gateway, behaviour):
    # vLLM ends a stream whose generation failed with its error event and [DONE] (the finish, "end"), or
    # dies after the error event ("cut"): the client gets the backend's error and [DONE] either way
    answer = _token(0) + _token(1) + _event(VLLM_ERROR) + (b"data: [DONE]\n\n" if behaviour == "end" else b"")
    gw, datas = _stream(make_raw_backend, make_gateway, behaviour, answer)
    assert _failed_with_an_error_event(gw, datas, 2) == VLLM_ERROR["error"]
    assert gw.gateway.finished_requests[0].num_output_tokens == 2  # (the error event is no token)


@pytest.mark.parametrize("wants_usage", [True, False])
def test_a_whole_answer_whose_done_did_not_come_is_finished_and_ends_with_done(
    make_raw_backend, make_gateway, wants_usage
):
    # the final usage chunk (no choice in it) comes after every token: the answer is whole
    body = {**STREAM, "stream_options": {"include_usage": True}} if wants_usage else STREAM
    gw, datas = _stream(make_raw_backend, make_gateway, "end", _token(0) + _token(1) + USAGE, body)
    assert datas[-1] == "[DONE]" and len(datas) == 3 + wants_usage
    assert gw.gateway.finished_requests[0].state.name == "FINISHED" and _rejections(gw) == {}


def test_a_done_without_its_blank_line_ends_the_answer(make_raw_backend, make_gateway):
    gw, datas = _stream(make_raw_backend, make_gateway, "end", _token(0) + _token(1) + b"data: [DONE]")
    assert datas[-1] == "[DONE]" and len(datas) == 3
    assert gw.gateway.finished_requests[0].state.name == "FINISHED"


# ---------------------------------------------------------------------------------- the log
def test_the_failure_log_keeps_the_first_of_each_kind_and_counts_the_rest(caplog, monkeypatch) -> None:
    from headway.serve import _logging

    now = [100.0]
    monkeypatch.setattr(_logging.time, "monotonic", lambda: now[0])
    log = logging.getLogger("test.failures")
    failures = FailureLog(log, every_s=5.0)
    with caplog.at_level(logging.WARNING, logger="test.failures"):
        for i in range(300):  # an outage: 300 failures of one kind and 30 of another in 3 s
            now[0] = 100.0 + i * 0.01
            failures("b1: lost", "request %s lost on b1", f"r{i}")
            if i % 10 == 0:
                failures("b1: mid-stream", "request %s: b1 failed mid-stream", f"m{i}")
        assert [r.getMessage() for r in caplog.records] == ["request r0 lost on b1", "request m0: b1 failed mid-stream"]
        now[0] = 105.0  # 5 s after the first: one summary line, at the next failure (no event loop here)
        failures("b1: lost", "request %s lost on b1", "r300")
        assert caplog.records[-1].getMessage() == (
            "329 more request failures in the last 5 s, not logged one by one (b1: lost: 300, b1: mid-stream: 29)"
        )
        now[0] = 106.0
        failures("b1: lost", "request %s lost on b1", "r301")
        failures.flush()  # (at shutdown) what is left
        assert caplog.records[-1].getMessage() == (
            "1 more request failure in the last 1 s, not logged one by one (b1: lost: 1)"
        )
        now[0] = 120.0  # quiet for longer than every_s: the next one is logged in full again
        failures("b1: lost", "request %s lost on b1", "r302")
        assert caplog.records[-1].getMessage() == "request r302 lost on b1" and len(caplog.records) == 5


@pytest.mark.parametrize(
    ("behaviour", "status", "kind", "reason"),
    [("cut", 200, "mid-stream", "backend_error_midstream"), ("drop", 502, "lost", "backend_error")],
)
def test_an_outage_under_load_logs_a_few_lines_and_counts_every_failure(
    make_raw_backend, make_gateway, caplog, behaviour, status, kind, reason
):
    # "cut": each stream breaks after two tokens; "drop": the backend takes each request and closes the
    # connection (each request fails there once, then is answered 502: no other backend to try)
    import asyncio

    url, _ = make_raw_backend(behaviour, _token(0) + _token(1))
    gw = make_gateway([url], backend_down_s=0)

    async def load() -> list[int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            rs = await asyncio.gather(*[c.post("/v1/completions", json=STREAM) for _ in range(40)])
        return [r.status_code for r in rs]

    with caplog.at_level(logging.WARNING, logger="headway.serve"):
        assert asyncio.run(load()) == [status] * 40
    lines = [r.getMessage() for r in caplog.records if r.name == "headway.serve"]
    assert _rejections(gw) == {reason: 40.0}  # every failure counted
    assert len(lines) <= 3, lines  # the first in full, then a summary at most every 5 s
    assert url in lines[0] and ("mid-stream" in lines[0] or "failed on" in lines[0]), lines[0]
    gw.gateway.exchange.failures.flush()
    counted = {kind: 0}
    for line in caplog.records[1:]:
        counted[kind] += int(line.getMessage().split(f"{url}: {kind}: ")[1].rstrip(")"))
    assert counted == {kind: 39}, [r.getMessage() for r in caplog.records]


@pytest.mark.vllm
def test_the_openai_sdk_raises_the_backends_error_for_a_stream_cut_mid_way(
    make_raw_backend, make_gateway, vllm_python: Path
) -> None:
    # the client the gateway's stream is for: OpenAI's Python SDK (vLLM's venv has it) raises APIError with
    # the error event's message, rather than returning a truncated answer as if whole
    python = vllm_python
    url, _ = make_raw_backend("end", b"".join(_token(i, True) for i in range(3)))
    gw = make_gateway([url])
    script = textwrap.dedent(f"""
        import openai
        client = openai.OpenAI(base_url="{gw.url}/v1", api_key="x", max_retries=0)
        stream = client.completions.create(model="m", prompt="hi", max_tokens=5, stream=True,
                                           stream_options={{"include_usage": True, "continuous_usage_stats": True}})
        text = ""
        try:
            for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
        except openai.APIError as exc:
            print("APIError", repr(text), exc.message)
        else:
            print("no error", repr(text))
    """)
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "APIError ' t0 t1 t2' the backend closed the stream early", done.stderr[-2000:]


def test_a_server_errors_event_before_any_token_is_a_5xx_before_the_200(make_raw_backend, make_stub, make_gateway):
    """vLLM sends its 200 with a stream's headers, so a request that fails in its engine before any
    token comes as a stream whose first event is the error. The gateway holds its own 200 until that
    first event: the request has streamed nothing, so it goes as a 5xx does, to another backend, and
    after ``max_attempts`` the client gets a 502 (it got a 200 stream holding only the error); a
    500's event that the last backend to try sends is the request's own failure, passed on as it came."""
    retryable = {"error": {**VLLM_ERROR["error"], "message": "Request failed; please retry", "code": 503}}
    url, seen = make_raw_backend("end", _event(retryable) + b"data: [DONE]\n\n")  # vLLM's RetryableRequestError
    gw = make_gateway([url], max_attempts=1)
    with gw.client() as c:
        r = c.post("/v1/completions", json=STREAM)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
    assert "a server error's event before any token (Request failed; please retry)" in r.json()["error"]["message"]
    assert seen == [1]
    answer = _event(VLLM_ERROR) + b"data: [DONE]\n\n"
    url, seen = make_raw_backend("end", answer)
    gw = make_gateway([url], max_attempts=1)
    with gw.client() as c:
        r = c.post("/v1/completions", json=STREAM)
    assert r.status_code == 200 and r.text == answer.decode() and seen == [1], r.text
    stub = make_stub()
    gw = make_gateway([make_raw_backend("end", answer)[0], stub.url], max_attempts=2)
    with gw.client() as c:
        for _ in range(2):  # (whichever backend the dispatcher picks first)
            r = c.post("/v1/completions", json=STREAM)
            assert r.status_code == 200 and '"error"' not in r.text and r.text.endswith("data: [DONE]\n\n"), r.text


def test_a_client_errors_event_before_any_token_is_passed_on(make_raw_backend, make_gateway):
    # an error of the request itself (code 400): any backend would say the same, so it goes as vLLM sent it
    error = {"error": {"message": "bad input", "type": "BadRequestError", "param": None, "code": 400}}
    _, datas = _stream(make_raw_backend, make_gateway, "end", _event(error) + b"data: [DONE]\n\n")
    assert [json.loads(d) for d in datas[:-1]] == [error] and datas[-1] == "[DONE]"
