"""Request bodies for ``/v1/completions`` and ``/v1/chat/completions``, valid and near misses, for the
differential check of the gateway's intake against vLLM's own validation (``test_vllm_protocol.py``).

:func:`corpus` gives ``(chat, raw body)`` pairs: a base body with one field set to each value of
:data:`COMMON` / :data:`COMPLETION` / :data:`CHAT` (every field vLLM 0.32's ``CompletionRequest`` and
``ChatCompletionRequest`` define that a client sets, and unknown ones; for each, valid values and
near misses: wrong types, out-of-range values, empty strings and lists, the strings and floats
pydantic's lax mode turns into ints and booleans), then seeded random combinations of several, and
bodies that are no JSON object. Numbers that are not finite are written as Python's ``json`` writes
them (``NaN``, ``Infinity``), as vLLM's server reads them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

__all__ = ["CHAT", "COMMON", "COMPLETION", "LAX_BOOLS", "LAX_INTS", "corpus"]

NAN = float("nan")
INF = float("inf")

# fmt: off
LAX_INTS: list[Any] = [
    0, 1, 2, 5, -1, 16, 127, 128, 129, 4096, 2**31 - 1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), 10**30,
    True, False, 5.0, -0.0, 5.5, 1e20, 2.0**62, NAN, INF, -INF,
    "5", " 5 ", "5.0", "5.00", "5.5", "+5", "-5", "1_000", "1__0", "_1", "0x10", "", " ", "05", "5e2", "\u0665",
    "5\n", "\t5", "-0", "9" * 30, "nan", None, [], {}, [5], {"v": 5},
]
"""Values for the integer fields the gateway reads (``max_tokens``, ``n``, ``priority``)."""

LAX_BOOLS: list[Any] = [
    True, False, None, 0, 1, 2, -1, 0.0, 1.0, 0.5, "true", "True", "TRUE", "tRuE", "yes", "YES", "on", "On", "1", "t",
    "T", "y", "Y", "false", "off", "no", "0", "f", "F", "n", "N", " true", "true ", "2", "1.0", "", "null", [], {},
    [True],
]
"""Values for the boolean fields the gateway reads (``stream``, ``echo``, ``stream_options.include_usage``)."""

# fmt: on
_FLOATS: list[Any] = [0, 0.5, 1, 1.5, 2, 2.5, -1, "0.7", NAN, INF, None, "x", True, []]
_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}

# fmt: off
COMMON: dict[str, list[Any]] = {
    "model": ["m", "", None, 5, ["m"], True],
    "max_tokens": LAX_INTS,
    "n": LAX_INTS,
    "priority": LAX_INTS,
    "stream": LAX_BOOLS,
    "stream_options": [
        None, {}, {"include_usage": True}, {"include_usage": False}, {"include_usage": "false"},
        {"include_usage": "yes"}, {"include_usage": 1}, {"include_usage": "maybe"}, {"continuous_usage_stats": True},
        {"include_usage": True, "continuous_usage_stats": True}, {"unknown": 1}, "yes", [], True, 1,
    ],
    "temperature": _FLOATS,
    "top_p": _FLOATS,
    "top_k": [None, -1, 0, 5, -2, 5.0, "5", 5.5],
    "min_p": _FLOATS,
    "frequency_penalty": _FLOATS,
    "presence_penalty": _FLOATS,
    "repetition_penalty": _FLOATS,
    "length_penalty": _FLOATS,
    "seed": [None, 0, 42, -1, 2**63 - 1, 2**63, "42", 4.0, 4.5],
    "stop": [None, "x", ["x", "y"], [], "", [""], [1], 5, ["a"] * 5],
    "stop_token_ids": [None, [], [1, 2], [-1], ["1"], [1.5], 1],
    "min_tokens": [0, 1, 5, -1, 10**6, "2", 2.0, None],
    "ignore_eos": LAX_BOOLS[:12],
    "include_stop_str_in_output": [True, False, "x", None],
    "skip_special_tokens": [True, False, "no", None],
    "spaces_between_special_tokens": [True, False, 3],
    "logit_bias": [None, {}, {"5": 1.0}, {"5": -100}, {"5": -INF}, {"5": NAN}, {"x": 1}, {"5": "a"}, [], {"5": 200}],
    "allowed_token_ids": [None, [], [1, 2], [-1], "1"],
    "bad_words": [[], ["x"], [""], "x", None, [1]],
    "truncate_prompt_tokens": [None, -1, 0, 5, -2, 2**63, 2**70, "5"],
    "truncation_side": [None, "left", "right", "middle", 1],
    "prompt_logprobs": [None, 0, 1, -1, -2, "1", 1.5],
    "logprob_token_ids": [None, [1, 2], [], ["x"]],
    "use_beam_search": [False, True, "yes", None],
    "cache_salt": [None, "salt", "", "s" * 1025, 5],
    "user": [None, "u", "", 5],
    "request_id": ["r-1", "", 5, None],
    "session_id": [None, "s", 5],
    "vllm_xargs": [None, {}, {"k": "v"}, {"k": 1}, {"k": 1.5}, {"k": [1, "a"]}, {"k": {"x": 1}}, {"k": None}, [],
                   {"k": NAN}],
    "kv_transfer_params": [None, {}, {"do_remote_decode": True}, [], "x"],
    "structured_outputs": [
        None, {}, {"json": _SCHEMA}, {"json": '{"type": "object"}'}, {"regex": "[a-z]+"}, {"choice": ["a", "b"]},
        {"grammar": "root ::= 'a'"}, {"json_object": True}, {"regex": "a", "choice": ["a"]}, {"unknown": 1}, "json", [],
    ],
    "guided_json": [_SCHEMA, "x"],
    "guided_regex": ["[a-z]+", 5],
    "guided_choice": [["a", "b"]],
    "guided_grammar": ["root ::= 'a'"],
    "guided_decoding_backend": ["xgrammar"],
    "response_format": [
        None, {"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "s",
        "schema": _SCHEMA}}, {"type": "json_schema"}, {"type": "yaml"}, {}, "json", {"type": "structural_tag",
        "format": {"type": "const_string", "value": "x"}},
    ],
    "repetition_detection": [None, {}, {"max_pattern_size": 4}, "x"],
    "thinking_token_budget": [None, -1, 0, 10, -2, "10"],
    "stream_interval": [None, 1, 4, 0, -1, "2"],
    "return_token_ids": [None, True, False, "x"],
    "return_tokens_as_token_ids": [None, True, "yes"],
    "add_special_tokens": [True, False, "x"],
    "watermarking": [None, True, False],
    "routed_experts_prompt_start": [0, 5, -1],
    "mm_payload": ["tensors", "none", "x"],
    "return_mm_kwargs": [True, False],
    "unknown_field": [1, "x", None, {"a": [1]}, NAN, INF],
    "best_of": [None, 1, 2, 0],
    "metadata": [{"k": "v"}],
}
"""Fields both endpoints define (or neither: unknown ones), each with values to try."""

_TEXT = "Say something about the weather."
_EMBEDS = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDIsIDQpLCB9ICAgIAo="

COMPLETION: dict[str, list[Any]] = {
    "prompt": [
        _TEXT, "", " ", "\n", ["a", "b"], [""], ["a", ""], [], [1, 2, 3], [0], [-1], [1, -2], [[1, 2], [3]], [[1]],
        [[]], [[1], []], [[-1]], [1.0, 2.0], [1.5], ["1", 2], [1, "a"], [True, False], [[1.0]], [[1], "a"],
        [["a"]], 5, 5.0, True, {"text": "x"}, None, "x" * 5000, ["x"] * 3000,
    ],
    "prompt_embeds": [None, _EMBEDS, [_EMBEDS], [_EMBEDS, _EMBEDS], [], "", 5, [5], {"x": 1}],
    "echo": LAX_BOOLS[:14],
    "logprobs": [None, 0, 1, 5, -1, -2, "1", 1.5, True],
    "suffix": [None, "x", 5],
}
"""Fields of ``CompletionRequest`` alone."""

_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
_AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}

CHAT: dict[str, list[Any]] = {
    "messages": [
        [{"role": "user", "content": _TEXT}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": _TEXT}],
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": _TEXT}],
        [{"role": "user", "content": [{"type": "text", "text": _TEXT}]}],
        [{"role": "user", "content": [{"type": "text", "text": "a"}, _IMAGE]}],
        [{"role": "user", "content": [_IMAGE]}],
        [{"role": "user", "content": [_AUDIO, {"type": "text", "text": "b"}]}],
        [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}]}],
        [{"role": "user", "content": [{"image_url": "http://x/i.png"}]}],
        [{"role": "user", "content": ["plain part"]}],
        [{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": [{"type": "unknown", "x": 1}]}],
        [{"role": "user", "content": [{}]}],
        [{"role": "user", "content": [5]}],
        [{"role": "user", "content": [[]]}],
        [{"role": "user", "content": []}],
        [{"role": "user", "content": ""}],
        [{"role": "user", "content": None}],
        [{"role": "user"}],
        [{"role": "user", "content": {"type": "text", "text": "x"}}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": "x", "name": "bob"}],
        [{"role": "user", "content": "x", "extra": [1]}],
        [{"role": "custom", "content": "x"}],
        [{"role": "", "content": "x"}],
        [{"role": 5, "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [_CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_CALL]}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": "r"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        [{"role": "assistant", "content": "partial"}],
        [{"role": "tool", "content": "r"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "x"}],
        [],
        "x",
        {"role": "user", "content": "x"},
        ["x"],
        [5],
        None,
    ],
    "max_completion_tokens": LAX_INTS,
    "logprobs": [None, True, False, "yes", 1, 5, "x"],
    "top_logprobs": [None, 0, 5, 20, 21, -1, "3", 2.0],
    "tools": [None, [], [_TOOL], [{"type": "function"}], [{"type": "function", "function": {"name": "f"}}], "x"],
    "tool_choice": [None, "none", "auto", "required", {"type": "function", "function": {"name": "get_weather"}},
                    "bogus", 5],
    "parallel_tool_calls": [None, True, False],
    "add_generation_prompt": [True, False, "no"],
    "continue_final_message": [False, True],
    "chat_template": [None, "{{ messages[0]['content'] }}", 5],
    "chat_template_kwargs": [None, {}, {"enable_thinking": False}, "x"],
    "documents": [None, [{"title": "t", "text": "x"}], [{"a": 1}]],
    "mm_processor_kwargs": [None, {}, {"num_crops": 4}],
    "media_io_kwargs": [None, {"video": {"num_frames": 4}}, {"video": 1}],
    "reasoning_effort": [None, "low", "medium", "high", "none", "max", 5],
    "include_reasoning": [True, False],
    "echo": [False, True, "yes"],
    "return_prompt_text": [None, True],
}
"""Fields of ``ChatCompletionRequest`` alone."""

# fmt: on
_BASE_COMPLETION: dict[str, Any] = {"model": "m", "prompt": _TEXT, "max_tokens": 8}
_BASE_CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": _TEXT}], "max_tokens": 8}


_EMBEDS_ONLY: list[dict[str, Any]] = [
    {"model": "m", "prompt_embeds": _EMBEDS, "max_tokens": 8},
    {"model": "m", "prompt": "", "prompt_embeds": _EMBEDS, "max_tokens": 8},
    {"model": "m", "prompt": None, "prompt_embeds": [_EMBEDS, _EMBEDS], "max_tokens": 8, "n": 2},
    {"model": "m", "prompt_embeds": _EMBEDS, "stream": True},
    {"model": "m", "prompt_embeds": []},
    {"model": "m", "prompt": "", "prompt_embeds": []},
    {"model": "m", "prompt_embeds": 5},
    {"model": "m", "prompt": [], "prompt_embeds": _EMBEDS},
]
"""Completions requests whose prompt is only ``prompt_embeds`` (vLLM's ``--enable-prompt-embeds``)."""


def _raw(body: object) -> bytes:
    return json.dumps(body).encode()


def corpus(combinations: int = 1500, seed: int = 0) -> Iterator[tuple[bool, bytes]]:
    """Every single-field variant of both endpoints' base bodies (with ``stream`` on for
    ``stream_options``, as vLLM wants), then ``combinations`` seeded random bodies of 2-6 fields
    per endpoint, then bodies that are no request at all."""
    for chat, base, own in ((False, _BASE_COMPLETION, COMPLETION), (True, _BASE_CHAT, CHAT)):
        fields = {**COMMON, **own}
        for name, values in fields.items():
            for v in values:
                body = {**base, name: v}
                if name == "stream_options":
                    body["stream"] = True
                yield chat, _raw(body)
            yield chat, _raw({k: v for k, v in base.items() if k != name})  # the field left out
        if not chat:
            yield from ((False, _raw(b)) for b in _EMBEDS_ONLY)
        rng = random.Random(seed * 2 + chat)
        names = list(fields)
        for _ in range(combinations):
            body = dict(base)
            for name in rng.sample(names, rng.randint(2, 6)):
                body[name] = rng.choice(fields[name])
            yield chat, _raw(body)
        for raw in (b"[]", b'"x"', b"1", b"null", b"{", b"", b'{"a": 1}', b"\xff\xfe", b'{"prompt": "x",}'):
            yield chat, raw
