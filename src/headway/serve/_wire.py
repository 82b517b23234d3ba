"""The OpenAI wire format as the gateway reads it: parsing and validating request bodies,
splitting SSE events, reading ``usage`` from an answer, telling vLLM's admission control's 503 apart.

Validation checks only the fields the gateway relies on and raises :class:`BadRequest` naming
the field (a 400 ``invalid_value``); everything else goes to the backend as it came.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANSWERED_STATUSES",
    "MAX_ABS_PRIORITY",
    "MAX_N",
    "MAX_TOKENS_CEILING",
    "VLLM_COMPLETIONS_MAX_TOKENS",
    "BadRequest",
    "Parsed",
    "admission_rejection",
    "completion_tokens",
    "engine_dead",
    "error_text",
    "estimate_tokens",
    "is_int",
    "lax_bool",
    "lax_int",
    "loads_json",
    "server_error_event",
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


def loads_json(raw: bytes) -> Any:
    """The body as vLLM's server reads it (Starlette's ``Request.json``: ``json.loads`` of the bytes,
    UTF-8/16/32 detected, NaN and Infinity read as floats)."""
    return json.loads(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
"""Unicode's White_Space characters, which pydantic-core (Rust's ``str::trim``) strips around a
number in a string (Python's ``str.strip`` also strips U+001C-U+001F)."""
_INT_STRING = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?", re.ASCII)
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "n", "no", "off"})
_I64 = 2**63


def lax_int(v: object) -> int:
    """``v`` as pydantic's lax mode reads an ``int`` field of vLLM's request models: an int, a bool
    (0 or 1), a float with no fraction inside the 64-bit range, or a string of one (``" 5 "``,
    ``"+5"``, ``"1_000"``, ``"5.0"``); else :class:`ValueError`."""
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        if math.isfinite(v) and v.is_integer() and -_I64 < v < _I64:
            return int(v)
        raise ValueError(v)
    if isinstance(v, str):
        s = v.strip(_WHITESPACE)
        if _INT_STRING.fullmatch(s) and len(s) <= 4300:
            return int(s.partition(".")[0])
    raise ValueError(v)


def lax_bool(v: object) -> bool:
    """``v`` as pydantic's lax mode reads a ``bool`` field: a bool, 0 or 1 (int or float), or one of
    pydantic's words in any case (``"true"``, ``"yes"``, ``"on"``, ``"1"``, ...); else :class:`ValueError`."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return v == 1
    if isinstance(v, str):
        word = v.lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    raise ValueError(v)


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _lax_field(body: dict[str, Any], name: str, read: Callable[[object], Any], kind: str, where: str | None) -> Any:
    """``body[name]`` read by ``read`` (:func:`lax_int`, :func:`lax_bool`) as vLLM reads an optional
    field of that ``kind`` (None when absent or null); a 400 naming ``where`` (or it) otherwise."""
    v = body.get(name)
    if v is None:
        return None
    try:
        return read(v)
    except ValueError:
        raise BadRequest(f"'{where or name}' must be {kind}, got {_shown(v)}", where or name) from None


def _int_field(body: dict[str, Any], name: str, where: str | None = None) -> int | None:
    """``body[name]`` read as vLLM reads an optional int field (None when absent or null)."""
    value: int | None = _lax_field(body, name, lax_int, "an integer", where)
    return value


def _bool_field(body: dict[str, Any], name: str, where: str | None = None) -> bool:
    """``body[name]`` read as vLLM reads an optional bool field (False when absent or null)."""
    return bool(_lax_field(body, name, lax_bool, "a boolean", where))


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
    message or a completions request; None for a prompt of token ids (text only with ``--tokenizer``:
    :attr:`prompt_token_ids`)."""
    answers: int = 1
    """How many answers the engine generates: ``n`` for each prompt of a completions request's list
    (usage counts the tokens of all of them)."""
    single_prompt: bool = True
    """False for a completions request with a list of several prompts: its :attr:`query_text` joins them."""
    implied_max_tokens: int | None = None
    """The ``max_tokens`` vLLM applies to a body that leaves the field out: ``CompletionRequest``'s
    default, :data:`VLLM_COMPLETIONS_MAX_TOKENS`, for a completions request; None for chat (vLLM's
    limit there is the model's context) or when the field is given (null included: vLLM then uses
    its generation config's or the context's limit)."""
    prompt_token_ids: list[list[int]] | None = None
    """A completions prompt of token ids (each prompt's, for a list of them), as vLLM reads them;
    None for any other prompt, or an empty one."""


MAX_TOKENS_CEILING = 2**31 - 1
"""Largest ``max_tokens`` accepted even without ``max_tokens_limit`` (anything larger is no real
request, and would not fit the 32-bit integers of engines and the Redis queue keys)."""


MAX_N = 128
"""Largest ``n`` (completions per request) accepted, as OpenAI's API: the queue counts a request
once, so a larger one would take a backend's work out of turn."""


MAX_ABS_PRIORITY = 2**53
"""Largest ``|priority|`` accepted: every integer up to it is exact as a float (the Redis queue
encodes keys as doubles, and a larger one overflows or collides)."""


VLLM_COMPLETIONS_MAX_TOKENS = 16
"""vLLM 0.32's ``CompletionRequest.max_tokens`` default (OpenAI's too): a completions request that
leaves ``max_tokens`` out generates at most this many tokens."""


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _seq_len(prompt: object) -> int:
    """How many prompts vLLM makes of a ``prompt`` or ``prompt_embeds`` it took (``prompt_to_seq``)."""
    if prompt is None:
        return 0
    if isinstance(prompt, list) and (not prompt or not all(is_int(p) for p in prompt)):
        return len(prompt)
    return 1


def _token_ids(v: object) -> list[int] | None:
    """``v`` as vLLM's ``list[Annotated[int, Field(ge=0)]]`` reads it, or None."""
    if not isinstance(v, list):
        return None
    try:
        ids = [lax_int(t) for t in v]
    except ValueError:
        return None
    return ids if all(t >= 0 for t in ids) else None


def _read_prompt(body: dict[str, Any]) -> tuple[str, int, int, list[list[int]] | None]:
    """A completions request's prompt text, its token count (estimated for text), how many prompts
    vLLM runs and its token ids (a prompt of them), reading ``prompt`` as vLLM's ``CompletionRequest``
    does: a string, a list of strings, of token ids or of lists of token ids (pydantic's smart union:
    an exact match first, then lax ints, so ``[1.0, "2"]`` is token ids), plus ``prompt_embeds`` (a
    string or a list of them, prompts ahead of the text ones, whose text and length the gateway
    cannot read: 1 token each)."""
    prompt = body.get("prompt")
    embeds = body.get("prompt_embeds")
    texts: list[str] = []
    ntok = 0
    token_ids: list[list[int]] | None = None
    if prompt is None or isinstance(prompt, str):
        texts = [] if prompt is None else [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) and prompt:
        texts = prompt
    elif (ids := _token_ids(prompt)) is not None:
        ntok, prompt = len(ids), ids
        token_ids = [ids] if ids else None
    elif isinstance(prompt, list) and None not in (lists := [_token_ids(p) for p in prompt]):
        token_ids = [x for x in lists if x is not None]
        ntok = sum(map(len, token_ids))
    else:
        raise BadRequest(
            "'prompt' must be a string, an array of strings, of token ids or of arrays of token ids", "prompt"
        )
    if (
        embeds is not None
        and not isinstance(embeds, str)
        and not (isinstance(embeds, list) and all(isinstance(e, str) for e in embeds))
    ):
        raise BadRequest("'prompt_embeds' must be a base64 string or an array of them", "prompt_embeds")
    if (prompt is None or prompt == "") and (embeds is None or embeds == []):
        raise BadRequest("either 'prompt' or 'prompt_embeds' must be given and non-empty", "prompt")
    prompts = _seq_len(prompt) + _seq_len(embeds)
    text = "\n".join(texts)
    ntok += estimate_tokens(text) if texts else 0
    return text, max(ntok, _seq_len(embeds), 1), prompts, token_ids


def _read_messages(body: dict[str, Any]) -> tuple[str, str | None]:
    """A chat request's text (every message's, joined) and the last user message's, read as vLLM's
    ``ChatCompletionRequest`` takes ``messages``: a list of objects with a string ``role``, each
    ``content`` a string, null, or an array (or object) of parts; a part's text is a string part
    itself or an object part's ``text``; what else a part may be is vLLM's renderer's to judge."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise BadRequest("'messages' must be an array of messages", "messages")
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
            for c in content:  # (one entry a part: the text's line breaks stay where they were)
                parts.append(c if isinstance(c, str) else str(c.get("text", "")) if isinstance(c, dict) else "")
        elif content is not None and not isinstance(content, dict):
            raise BadRequest(f"'messages[{i}].content' must be a string or an array", f"messages[{i}].content")
        if m["role"] == "user":
            query = parts[first:]
    text = "\n".join(parts)
    return text, text if query is None else "\n".join(query)


def validate_body(body: object, chat: bool) -> Parsed:
    """Read the fields the gateway relies on as vLLM 0.32's request models read them (pydantic's
    lax mode: ``"5"`` and ``5.0`` are the integer 5, ``"yes"`` is true); raise ``BadRequest``
    naming the field where vLLM refuses it too (checked against vLLM's own validation by
    ``tests/serve/test_vllm_protocol.py``). The gateway's own limits are ``MAX_N``,
    ``MAX_ABS_PRIORITY`` and ``MAX_TOKENS_CEILING``."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    prompts = 1
    token_ids = None
    if chat:
        text, query_text = _read_messages(body)
        ntok = estimate_tokens(text)
    else:
        text, ntok, prompts, token_ids = _read_prompt(body)
        query_text = text if text else None
    stream = _bool_field(body, "stream")
    # the max_tokens vLLM runs: chat's max_completion_tokens when given, else max_tokens
    names = ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",)
    asked = {name: _int_field(body, name) for name in names}
    max_tokens_field = "max_completion_tokens" if asked.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = asked[max_tokens_field]
    if max_tokens is not None:
        if max_tokens == 0 and not chat and _bool_field(body, "echo"):
            max_tokens = 1  # the prompt echoed: vLLM runs one token (CompletionRequest.to_sampling_params)
        if max_tokens < 1:
            raise BadRequest(f"'{max_tokens_field}' must be at least 1, got {max_tokens}", max_tokens_field)
        if max_tokens > MAX_TOKENS_CEILING:
            raise BadRequest(f"'{max_tokens_field}' must be at most {MAX_TOKENS_CEILING}, got {max_tokens}",
                              max_tokens_field)  # fmt: skip
    priority = _int_field(body, "priority") or 0
    if abs(priority) > MAX_ABS_PRIORITY:
        shown = str(priority) if len(str(priority)) <= 40 else f"an integer of {len(str(abs(priority)))} digits"
        raise BadRequest(f"'priority' must be between -{MAX_ABS_PRIORITY} and {MAX_ABS_PRIORITY}, got {shown}",
                          "priority")  # fmt: skip
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    wants_usage = _bool_field(opts, "include_usage", "stream_options.include_usage") if opts else False
    n = _int_field(body, "n")
    if n is not None and n < 1:
        raise BadRequest(f"'n' must be at least 1, got {n}", "n")
    if n is not None and n > MAX_N:
        raise BadRequest(f"'n' must be at most {MAX_N}, got {n}", "n")
    answers = (n or 1) * prompts
    implied = None if chat or "max_tokens" in body else VLLM_COMPLETIONS_MAX_TOKENS
    return Parsed(
        text, ntok, max_tokens, max_tokens_field, stream, priority, wants_usage, query_text, answers, prompts == 1,
        implied, token_ids,
    )  # fmt: skip


def error_text(data: bytes, raw: bool = True) -> str:
    """The ``message`` of an error's ``{"error": {...}}`` (an SSE event's, or a 5xx's body); when it has
    none, the data as it came (``raw``: an event's), else "" (a body: a proxy's page may name a backend)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
        message = json.loads(data)["error"]["message"]
        if isinstance(message, str):
            return message[:500]
    return data[:500].decode("utf-8", "replace") if raw else ""


def server_error_event(head: bytes) -> tuple[int, str] | None:
    """The ``code`` (500 when it has none) and message of a stream's first event when it is a server
    error's event (vLLM's, when the request failed before any token: ``{"error": {..., "code": 500}}``);
    None for a token's event, or a client error's (``code`` under 500: any backend would say the same)."""
    event = sse_newlines(head)[0].partition(b"\n\n")[0]
    data = sse_data(event)
    if not data.startswith(b'{"error"'):
        return None
    status = 500
    with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
        code = json.loads(data)["error"]["code"]
        if isinstance(code, int) and not isinstance(code, bool):
            if code < 500:
                return None
            status = code
    return status, error_text(data)


ANSWERED_STATUSES = (500, 501)
"""vLLM's answers to a request its server could not handle (``create_error_response``: an unexpected
exception, e.g. an ``AttributeError`` in a request model's validator, 500; ``NotImplementedError``
501). A ``GenerationError`` (``finish_reason`` ``error``) is a 500 too and may pass elsewhere: the
first is retried; the same one from a second backend, or from the last one to try, is passed on.
502, 503 and 504 (a proxy's; an engine full or unavailable) say nothing of the request: retried."""


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


_ENGINE_DEAD = "EngineCore encountered an issue"
"""The start of vLLM's ``EngineDeadError`` message (``vllm/v1/engine/exceptions.py``): its server
answers it as a 500 (``InternalServerError``) and then exits (``terminate_if_errored``)."""


def engine_dead(error: str) -> bool:
    """Whether an error message (``{"error": {"message"}}``) is vLLM's for an engine that died: the
    backend is going away, not failing on this request."""
    return error.startswith(_ENGINE_DEAD)
