"""Requests vLLM 0.32 takes, the gateway takes and forwards as sent, reading its fields as vLLM does.

Each body here is one that vLLM's own validation takes (``test_vllm_protocol.py`` checks them all
against it) and that the gateway refused with a 400, or read otherwise than vLLM, before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from headway.serve import BackendConfig, GatewayConfig, serve_in_thread
from headway.serve._intake import Intake
from headway.serve._tenants import ANONYMOUS
from headway.serve._wire import BadRequest, lax_bool, lax_int, validate_body

EMBEDS = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDIsIDQpLCB9ICAgIAo="
MSGS = [{"role": "user", "content": "hi"}]


class Recorder:
    """A backend that records each generation body; answers a stream when ``stream`` is set."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.stream = False

    async def generate(self, request: HTTPRequest) -> Response:
        self.seen.append(await request.body())
        if self.stream:
            events = (
                b'data: {"id":"c","choices":[{"index":0,"text":"a","finish_reason":"length"}]}\n\n'
                b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
                b"data: [DONE]\n\n"
            )
            return Response(events, media_type="text/event-stream")
        return JSONResponse({"id": "c", "choices": [{"text": "a"}], "usage": {"completion_tokens": 1}})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
            ]
        )


def _request(body: dict[str, Any], chat: bool = False) -> Any:
    intake = Intake(GatewayConfig(backends=(BackendConfig("http://b"),)), hash_prefixes=False)
    return intake.new_request("r", 0.0, body, validate_body(body, chat), ANONYMOUS)


def test_a_prompt_embeds_request_is_forwarded_as_sent_and_takes_the_missing_score_path(servers, make_gateway):
    """vLLM takes ``prompt_embeds`` without a ``prompt`` (``--enable-prompt-embeds``); the gateway
    refused it (400 ``prompt``). Its text cannot be read: the request has no prompt to score."""
    rec = Recorder()
    gw = make_gateway([servers.enter_context(serve_in_thread(rec.app()))])
    bodies = [
        {"model": "m", "prompt_embeds": EMBEDS, "max_tokens": 3},
        {"model": "m", "prompt": "", "prompt_embeds": [EMBEDS, EMBEDS], "max_tokens": 3},
    ]
    with gw.client() as c:
        for body in bodies:
            raw = json.dumps(body).encode()
            r = c.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            assert rec.seen[-1] == raw
    assert [q.prompt for q in gw.gateway.finished_requests] == [None, None]
    req = _request(bodies[1])
    assert req.prompt is None and req.extra["answers"] == 3  # two embeds and the empty text prompt, as vLLM runs them


@pytest.mark.parametrize(
    ("value", "read"),
    [(5, 5), (True, 1), (5.0, 5), (-0.0, 0), ("5", 5), (" +5\n", 5), ("1_000", 1000), ("5.00", 5), ("\u30005", 5)],
)
def test_integers_are_read_as_pydantics_lax_mode_reads_them(value, read):
    assert lax_int(value) == read


@pytest.mark.parametrize("value", [5.5, float("nan"), float("inf"), 2.0**63, "5.5", "5.", "1__0", "0x10", "", "\x1c5"])
def test_what_is_no_integer_to_pydantic_is_none_here(value):
    with pytest.raises(ValueError):
        lax_int(value)


def test_booleans_are_read_as_pydantics_lax_mode_reads_them():
    assert [lax_bool(v) for v in (True, 1, 1.0, "true", "TRUE", "yes", "On", "1", "t", "y")] == [True] * 10
    assert [lax_bool(v) for v in (False, 0, 0.0, "false", "no", "off", "0", "f", "N")] == [False] * 9
    for v in (2, 0.5, " true", "1.0", "", None, []):
        with pytest.raises(ValueError):
            lax_bool(v)


@pytest.mark.parametrize(
    ("body", "chat", "field", "read"),
    [
        ({"prompt": "x", "max_tokens": "5"}, False, "max_tokens", 5),
        ({"prompt": "x", "max_tokens": 5.0}, False, "max_tokens", 5),
        ({"prompt": "x", "max_tokens": 0, "echo": True}, False, "max_tokens", 1),  # vLLM runs one token
        ({"messages": MSGS, "max_tokens": 0, "max_completion_tokens": 5}, True, "max_tokens", 5),
        ({"prompt": "x", "priority": "3"}, False, "priority", 3),
        ({"prompt": "x", "stream": "true"}, False, "stream", True),
        ({"prompt": "x", "stream": 0}, False, "stream", False),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "false"}}, False, "wants_usage", False),
        ({"prompt": "x", "n": "2"}, False, "answers", 2),
        ({"prompt": [[1, 2], [3]], "n": 2}, False, "answers", 4),
        ({"prompt": [[1, 2], [3]]}, False, "num_prompt_tokens", 3),
        ({"prompt": [1.0, "2", True]}, False, "num_prompt_tokens", 3),  # lax token ids
        ({"prompt": []}, False, "answers", 0),  # no prompt: vLLM runs none
        ({"messages": []}, True, "prompt_text", ""),
        ({"messages": [{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}]}, True, "query_text", "a\nb"),
        ({"messages": [{"role": "user", "content": {"type": "text"}}]}, True, "query_text", ""),
        ({"messages": [{"role": "user"}]}, True, "query_text", ""),
    ],
)
def test_fields_are_read_as_vllm_reads_them(body, chat, field, read):
    parsed = validate_body({"model": "m", **body}, chat)
    assert getattr(parsed, field) == read


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"prompt": [-1]}, False, "prompt"),
        ({"prompt": [1, "a"]}, False, "prompt"),
        ({"prompt": 5}, False, "prompt"),
        ({"prompt": ""}, False, "prompt"),
        ({"prompt": "x", "prompt_embeds": 5}, False, "prompt_embeds"),
        ({"prompt": "x", "max_tokens": "5.5"}, False, "max_tokens"),
        ({"prompt": "x", "max_tokens": float("nan")}, False, "max_tokens"),
        ({"prompt": "x", "max_tokens": 0}, False, "max_tokens"),
        ({"prompt": "x", "max_tokens": -1, "echo": True}, False, "max_tokens"),
        ({"messages": MSGS, "max_tokens": 5, "max_completion_tokens": 0}, True, "max_completion_tokens"),
        ({"messages": MSGS, "max_tokens": "x", "max_completion_tokens": 5}, True, "max_tokens"),
        ({"prompt": "x", "n": 0}, False, "n"),
        ({"prompt": "x", "stream": "maybe"}, False, "stream"),
        ({"prompt": "x", "stream_options": {"include_usage": 2}}, False, "stream_options.include_usage"),
        ({"messages": [{"role": "user", "content": 5}]}, True, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, True, "messages[0]"),
    ],
)
def test_what_vllm_refuses_in_a_field_the_gateway_reads_is_a_400_naming_it(body, chat, param):
    with pytest.raises(BadRequest) as exc:
        validate_body({"model": "m", **body}, chat)
    assert exc.value.param == param


def test_non_finite_numbers_go_upstream_as_sent(servers, make_gateway):
    """vLLM's server reads NaN and Infinity (``json.loads``) and takes them where its checks allow
    (a ``logit_bias`` of -Infinity bans a token); the gateway refused every body with one (400)."""
    rec = Recorder()
    gw = make_gateway([servers.enter_context(serve_in_thread(rec.app()))])
    with gw.client() as c:
        for raw in (
            b'{"prompt": "x", "logit_bias": {"50256": -Infinity}}',
            b'{"prompt": "x", "vllm_xargs": {"w": NaN}}',
            b'{"prompt": "x", "temperature": NaN}',  # (vLLM answers this one with its own 400)
        ):
            r = c.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            assert rec.seen[-1] == raw
        r = c.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": NaN}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert r.json()["error"]["message"] == "'max_tokens' must be an integer, got nan"
    assert len(rec.seen) == 3


@pytest.mark.parametrize(
    ("body", "chat", "options", "queued"),
    [
        ({"model": "m", "prompt": "hi"}, False, {}, 16),  # vLLM's CompletionRequest default
        ({"model": "m", "prompt": "hi", "max_tokens": None}, False, {}, 256),  # null: the context's limit
        ({"model": "m", "messages": MSGS}, True, {}, 256),  # chat: the context's limit
        ({"model": "m", "prompt": "hi", "max_tokens": 40}, False, {}, 40),
        ({"model": "m", "prompt": "hi"}, False, {"assumed_output_tokens": 8}, 8),
        ({"model": "m", "prompt": "hi"}, False, {"max_tokens_limit": 100}, 100),  # sent with max_tokens 100
        ({"model": "m", "prompt": "hi"}, False, {"default_max_tokens": 64}, 64),
    ],
)
def test_a_request_without_max_tokens_is_queued_at_what_vllm_will_run(
    body: dict[str, Any], chat: bool, options: dict[str, int], queued: int
) -> None:
    # a completions request that leaves max_tokens out runs at most 16 tokens on vLLM; it was queued at 256
    intake = Intake(GatewayConfig(backends=(BackendConfig("http://b"),), **options), hash_prefixes=False)
    parsed = validate_body(body, chat)
    assert intake.new_request("r", 0.0, body, parsed, ANONYMOUS).max_tokens == queued
