"""The OpenAI wire format as the gateway reads it: parsing and validating request bodies,
splitting SSE events, reading ``usage`` from an answer, telling vLLM's admission control's 503 apart.

Validation checks only the fields the gateway relies on and raises :class:`BadRequest` naming
the field (a 400 ``invalid_value``); everything else goes to the backend as it came.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_ABS_PRIORITY",
    "MAX_N",
    "MAX_TOKENS_CEILING",
    "BadRequest",
    "NonFinite",
    "Parsed",
    "admission_rejection",
    "completion_tokens",
    "estimate_tokens",
    "is_int",
    "loads_json",
    "nonfinite_field",
    "sse_data",
    "sse_newlines",
    "validate_body",
]


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def sse_newlines(chunk: bytes) -> tuple[bytes, bytes]:
    """``chunk`` with CRLF and CR line ends made LF, and a trailing CR held back (the next chunk
    may start with its LF)."""
    held = b""
    if chunk.endswith(b"\r"):
        chunk, held = chunk[:-1], b"\r"
    return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), held


def sse_data(event: bytes) -> bytes:
    """The data of one SSE event (LF line ends, ending in a blank line), per the spec: the value of
    its ``data`` fields, each without one leading space, joined by LF (b"" when none)."""
    parts = []
    for line in event.split(b"\n"):
        field, colon, value = line.partition(b":")
        if field == b"data" and colon:
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            parts.append(b"")
    return b"\n".join(parts)


class NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise NonFinite(name)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def loads_json(raw: bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity (``NonFinite``): JSON has no such numbers."""
    return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def nonfinite_field(raw: bytes) -> str | None:
    """Where the first NaN/Infinity of a body is, e.g. ``temperature`` or ``logit_bias.50256``."""
    marker = object()
    try:
        body = json.loads(raw, parse_constant=lambda _: marker)

        def find(v: object, path: str) -> str | None:
            if v is marker:
                return path
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
            for k, x in items:
                hit = find(x, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else k)
                if hit is not None:
                    return hit
            return None

        return find(body, "")
    except (ValueError, RecursionError):
        return None


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(slots=True)
class Parsed:
    prompt_text: str
    """Every message's content (or the prompt), in order: what prefix hashing and the token estimate read."""
    num_prompt_tokens: int
    max_tokens: int | None
    max_tokens_field: str
    """The field ``max_tokens`` came from (``max_completion_tokens`` in chat)."""
    stream: bool
    priority: int
    wants_usage: bool
    query_text: str | None
    """What the length predictor reads: a chat request's last user message (the one being answered:
    the predictors are trained on single user prompts, and a system prompt or earlier turns ahead
    of it would fill the scorer's window), blank when that message is (scored as a blank prompt, as
    the vLLM plugin and the simulator score it); :attr:`prompt_text` for a chat request without a user
    message or a completions request; None for a prompt of token ids (nothing the scorer reads)."""
    answers: int = 1
    """How many answers the engine generates: ``n`` for each prompt of a completions request's list
    (usage counts the tokens of all of them)."""
    single_prompt: bool = True
    """False for a completions request with a list of several prompts: its :attr:`query_text` joins them."""


MAX_TOKENS_CEILING = 2**31 - 1
"""Largest ``max_tokens`` accepted even without ``max_tokens_limit`` (anything larger is no real
request, and would not fit the 32-bit integers of engines and the Redis queue keys)."""


MAX_N = 128
"""Largest ``n`` (completions per request) accepted, as OpenAI's API: the queue counts a request
once, so a larger one would take a backend's work out of turn."""


MAX_ABS_PRIORITY = 2**53
"""Largest ``|priority|`` accepted: every integer up to it is exact as a float (the Redis queue
encodes keys as doubles, and a larger one overflows or collides)."""


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def validate_body(body: object, chat: bool) -> Parsed:
    """Check the fields the gateway relies on; raise ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    prompts = 1  # a completions request may carry a list of them
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty array of messages", "messages")
        parts: list[str] = []
        query: list[str] | None = None  # the last user message's parts
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]")
            content = m.get("content")
            first = len(parts)
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                for j, c in enumerate(content):
                    if not isinstance(c, dict):
                        raise BadRequest(f"'messages[{i}].content[{j}]' must be a content part object",
                                          f"messages[{i}].content[{j}]")  # fmt: skip
                    parts.append(str(c.get("text", "")))
            elif content is not None:
                raise BadRequest(f"'messages[{i}].content' must be a string or an array", f"messages[{i}].content")
            if m["role"] == "user":
                query = parts[first:]
        text = "\n".join(parts)
        ntok = estimate_tokens(text)
        query_text: str | None = text if query is None else "\n".join(query)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            text, ntok = prompt, estimate_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
            ntok = estimate_tokens(text)
            prompts = len(prompt)
        elif isinstance(prompt, list) and prompt and all(is_int(p) for p in prompt):
            text, ntok = "", len(prompt)
        else:
            raise BadRequest("'prompt' must be a non-empty string, array of strings or of token ids", "prompt")
        query_text = text if text else None
    max_tokens: int | None = None
    max_tokens_field = "max_tokens"
    for name in ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",):
        v = body.get(name)
        if v is None:
            continue
        if not is_int(v) or v < 1:
            raise BadRequest(f"'{name}' must be a positive integer, got {v!r}", name)
        if v > MAX_TOKENS_CEILING:
            raise BadRequest(f"'{name}' must be at most {MAX_TOKENS_CEILING}, got {v}", name)
        max_tokens, max_tokens_field = v, name
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}", "stream")
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not is_int(priority):
        raise BadRequest(f"'priority' must be an integer, got {priority!r}", "priority")
    if abs(priority) > MAX_ABS_PRIORITY:
        shown = str(priority) if len(str(priority)) <= 40 else f"an integer of {len(str(abs(priority)))} digits"
        raise BadRequest(f"'priority' must be between -{MAX_ABS_PRIORITY} and {MAX_ABS_PRIORITY}, got {shown}",
                          "priority")  # fmt: skip
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    wants_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    n = body.get("n")
    if n is not None and (not is_int(n) or n < 1):
        raise BadRequest(f"'n' must be a positive integer, got {n!r}", "n")
    if n is not None and n > MAX_N:
        raise BadRequest(f"'n' must be at most {MAX_N}, got {n}", "n")
    answers = (n or 1) * prompts
    return Parsed(
        text, ntok, max_tokens, max_tokens_field, stream, priority, wants_usage, query_text, answers, prompts == 1
    )


def completion_tokens(content: bytes) -> int | None:
    """``usage.completion_tokens`` of a non-streamed answer, or None when it has no usable one."""
    try:
        n = json.loads(content)["usage"]["completion_tokens"]
        count = None if isinstance(n, bool) else int(n)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError):
        return None
    return count if count is not None and count >= 0 else None


_ADMISSION_MESSAGES = (
    ("The engine is currently busy", "max_num_queued_reqs"),  # vLLM's QueueOverflowError
    ("The engine has reached its prefill token backlog limit", "max_num_queued_tokens"),  # MaxQueuedTokensError
)


def admission_rejection(body: bytes) -> str | None:
    """The limit of vLLM's admission control that a 503's body says turned the request away (its
    ``GracefulHTTPError``s, error type ``Service Unavailable``), as vLLM's
    ``vllm:admission_rejections`` labels it: ``max_num_queued_reqs``, ``max_num_queued_tokens``,
    or ``admission`` for another message of that type; None for any other body (a failure)."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(error, dict) or error.get("type") != "Service Unavailable":
        return None
    message = str(error.get("message", ""))
    return next((limit for start, limit in _ADMISSION_MESSAGES if message.startswith(start)), "admission")
