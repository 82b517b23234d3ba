"""Load generator: replay a workload against any OpenAI-compatible endpoint.

Each :class:`~headway.workload.RequestSpec` becomes one streamed request sent at its
arrival time, with ``max_tokens`` = its output length and ``ignore_eos`` so the engine
generates exactly that many tokens (as ``vllm bench serve`` does). The result is a list
of :class:`~headway.core.Request` with the times filled in (seconds since the start of
the run), so ``headway.metrics.summarize`` reports TTFT, TPOT, E2E and per-token
latency exactly as for the simulator.

A request that follows another (:attr:`~headway.workload.RequestSpec.after`: a conversation's next
turn, as ``sharegpt-sessions`` makes them) is sent its think time after that one finished, with the
conversation so far as a client keeps it: the earlier messages, the answers the engine gave (their
text, read from the response), and a new message; the arrival time it reports is when it was sent.
If the turn before failed, the conversation ends there (``previous_turn_failed``).

Timing of a streamed request follows ``vllm bench serve``: a *content chunk* is an SSE event
with a non-empty ``choices`` list (the trailing usage-only chunk, a chunk with no choice, and
``[DONE]`` are not); TTFT ends at the first,
E2E at the last; the gaps between consecutive ones are its inter-token latencies (ITL, kept in
``extra["itl"]``). A stream with no content chunk is aborted (``no_tokens``), as vLLM marks it
failed, and so is one with a chunk that is not a JSON object or an event that is not one ``data:`` line
(``bad_chunk``: vLLM's client parses every event but a comment and fails the request on one it cannot
read, an ``event:`` line's included) or an error event (``stream_error``; vLLM's client skips those).
A request that fails after its first token keeps that token's time and the gaps so far, as vLLM's
record of it does.

A request that fails keeps a short, stable reason (``extra["abort_reason"]``: ``http_400``,
``stream_error``, ...) and, when the backend said why, its message (``extra["error_message"]``: the
``message`` of vLLM's and OpenAI's error bodies). A request's ``max_tokens`` is the one it was sent
with (the output length, capped by ``max_output_tokens``), not the workload's own cap, and its
prompt length that of the synthetic prompt sent (capped by ``max_prompt_tokens``).

The client is aiohttp (as ``vllm bench serve``): on a small machine the load generator shares its
CPUs with what it measures, and aiohttp spent half of httpx's CPU replaying a burst of 96 streamed
requests (the gateway's measurement notes, ``git show 403bc55:benchmarks/results/gateway.md``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import json
import math
import random
import re
import time
from array import array
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from headway.core import Request, RequestState
from headway.serve._wire import admission_rejection
from headway.workload import RequestSpec, Workload

__all__ = ["BenchConfig", "BenchError", "run_bench", "run_bench_sync", "synthetic_prompt"]

ERROR_MESSAGE_KEY = "error_message"
"""``Request.extra`` key of the message the backend gave with a failed request (the error body of a
non-200 answer, or of an error event in a stream), as it said it (up to :data:`_MAX_ERROR_CHARS`):
the abort reason stays short (``http_400``), this says why. The report's ``requests.csv`` has it as
``abort_message`` (``headway.metrics.ERROR_MESSAGE_KEY``, the same key: not imported here, as
``_ITL_KEY`` below)."""

_MAX_ERROR_CHARS = 2000

_ITL_KEY = "itl"
"""Where a streamed request keeps its inter-token gaps (``headway.metrics.ITL_KEY``; not imported
here so that the gateway's import does not pull in the metrics package)."""

USAGE_PROMPT_TOKENS_KEY = "usage_prompt_tokens"
"""``Request.extra`` key of the prompt's length as the server counted it (``usage.prompt_tokens``), where
an answer said it. ``num_prompt_tokens`` stays in the workload's units (a synthetic prompt's words)
unless the server also reported cached tokens (:func:`_note_cached`); ``--save-result``'s
``input_lens`` and ``total_input_tokens`` take this one, as ``vllm bench serve`` does."""

SCHEDULED_KEY = "scheduled_time"
"""``Request.extra`` key of when a request was due to be sent (seconds since the start of the run): its
arrival, or the end of its think time after the turn it follows. Its ``arrival_time`` is when it was
sent; the difference is the time it waited for a ``max_concurrency`` slot, ``--save-result``'s
``queue_times`` (``vllm bench serve``'s ``client_queue_time``)."""

_MODELS_TIMEOUT_S = 30.0
"""Longest wait for ``GET /v1/models`` (the default model): an endpoint that does not answer a
model list this soon will not serve a benchmark either."""


class BenchError(Exception):
    """The endpoint cannot be benchmarked: unreachable, not an OpenAI-compatible base URL, or it
    refuses the key (the message says which and what to pass)."""


_WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "short", "work", "waits",
    "behind", "long", "work", "so", "please", "explain", "schedule", "queue", "token", "request", "answer",
]  # fmt: skip


def synthetic_prompt(num_tokens: int, key: str = "", block_hashes: Sequence[int] = (), block_size: int = 16) -> str:
    """About ``num_tokens`` tokens of filler text (one common word per token), drawn block by block
    (``block_size`` words): a block that ``block_hashes`` covers from a generator seeded by its hash,
    so requests whose hashes agree share a text prefix (the engine's prefix cache then finds it, as
    the simulator does), every other block from one seeded by ``key`` and its place, so that no
    other request's text starts the same (a prefix shared by accident would be served from an
    engine's prefix cache, where the simulator computes it)."""
    words: list[str] = []
    n = max(1, num_tokens)
    for b in range(-(-n // block_size)):
        seed = f"hash:{block_hashes[b]}" if b < len(block_hashes) else f"own:{key}:{b}"
        rng = random.Random(int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big"))
        words += rng.choices(_WORDS, k=min(block_size, n - b * block_size))
    return " ".join(words)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """How to replay a workload."""

    endpoint: str
    """Base URL (``http://host:port``; a trailing ``/v1`` is accepted)."""
    model: str | None = None
    """``model`` field to send (default: the first of ``GET /v1/models``)."""
    workload_models: bool = False
    """Send each request under its workload's model (:attr:`RequestSpec.model`, a prompt log's
    ``model``) where it has one, else under :attr:`model`: for a gateway or fleet that serves those
    models, and a gateway learning each model's lengths online."""
    chat: bool = False
    """Use ``/v1/chat/completions`` instead of ``/v1/completions``."""
    stream: bool = True
    """Stream the responses (SSE). ``False``: one JSON answer per request, so the client and
    any gateway do no per-token work; TTFT then equals E2E (the first token is not seen)."""
    api_key: str | None = None
    tenant_keys: Mapping[str, str] = field(default_factory=dict)
    """API key per tenant id (overrides ``api_key`` for that tenant's requests)."""
    max_concurrency: int = 0
    """Most requests in flight at once (0 = unlimited, open loop)."""
    max_prompt_tokens: int = 0
    """Cap synthetic prompts at this many tokens (0 = no cap): a conversation's first message; a later
    turn carries the history whole (a prefix cut short would share nothing)."""
    max_output_tokens: int = 0
    """Cap output lengths (0 = no cap)."""
    time_scale: float = 1.0
    """Multiply arrival times (0.5 = twice as fast)."""
    request_timeout_s: float = 600.0
    timeout_s: float = 3600.0
    """Whole-run limit: requests still open then are aborted (``bench_timeout``)."""
    use_workload_prompts: bool = True
    """Send the workload's prompt text when it has one (else synthetic text)."""
    prompt_seed: int = 0
    """Salt of the synthetic texts (with each request's id): another seed, other texts, so a run
    does not meet the last one's prompts in a warm engine's prefix cache."""

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        for name in ("time_scale", "timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        for name in ("max_concurrency", "max_prompt_tokens", "max_output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def _base(endpoint: str) -> str:
    return endpoint.rstrip("/").removesuffix("/v1")


_CLIENT_ERRORS = (aiohttp.ClientError, TimeoutError)
"""What a request to the endpoint can raise (refused, reset, timed out, a malformed answer)."""


def _error_reason(exc: BaseException) -> str:
    """A short, stable name for why a request failed (the abort reason)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"  # refused, unreachable, or the name did not resolve
    if isinstance(exc, TimeoutError):
        return "Timeout"
    return type(exc).__name__


async def _default_model(session: aiohttp.ClientSession, cfg: BenchConfig) -> str:
    """The first model of ``GET /v1/models``; :class:`BenchError` saying why there is none."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    if not headers and cfg.tenant_keys:
        headers = {"Authorization": f"Bearer {next(iter(cfg.tenant_keys.values()))}"}
    url = _base(cfg.endpoint) + "/v1/models"
    wait = min(_MODELS_TIMEOUT_S, cfg.timeout_s, cfg.request_timeout_s)
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=wait)) as r:
            status, body = r.status, await r.read()
    except TimeoutError:
        raise BenchError(f"GET {url}: no answer within {wait:g} s (--model NAME skips this lookup)") from None
    except aiohttp.ClientError as exc:
        raise BenchError(f"cannot reach {url}: {_error_reason(exc)}: {exc}") from None
    if status in (401, 403):
        raise BenchError(f"GET {url} answered {status}: the endpoint wants an API key (--api-key KEY)")
    if status != 200:
        raise BenchError(
            f"GET {url} answered {status}: --base-url must be the server's base URL, "
            "e.g. http://127.0.0.1:8000 (or give --model NAME)"
        )
    try:
        return str(json.loads(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"GET {url} listed no model (give --model NAME)") from None


def _abort(req: Request, reason: str, now: float, message: str | None = None) -> None:
    if not req.is_finished:
        req.transition(RequestState.ABORTED)
        req.finish_time = now
        req.extra["abort_reason"] = reason
        if message:
            req.extra[ERROR_MESSAGE_KEY] = message


def _error_message(body: bytes | str) -> str | None:
    """What an error body says: the ``message`` of OpenAI's and vLLM's ``{"error": {"message": ...}}``,
    of vLLM's older ``{"object": "error", "message": ...}`` (also a bare ``{"message": ...}``, a string
    ``error`` or FastAPI's string ``detail``), else the body's text as it came; None for an empty body.
    At most :data:`_MAX_ERROR_CHARS` characters."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    message: object = None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        if message is None:
            message = obj.get("message", obj.get("detail"))
    out = (message if isinstance(message, str) else text).strip()  # no message in it: the body as it came
    return out[:_MAX_ERROR_CHARS] or None


def synthetic_first_prompt(spec: RequestSpec, cfg: BenchConfig) -> bool:
    """Whether ``spec`` is sent as a synthetic prompt of its length, the one ``max_prompt_tokens``
    caps: not a workload's own prompt text (``use_workload_prompts``), nor a later turn's conversation."""
    return spec.after is None and not (cfg.use_workload_prompts and spec.prompt)


def request_url(cfg: BenchConfig) -> str:
    """Where each request goes: ``/v1/chat/completions`` or ``/v1/completions`` of ``cfg.endpoint``."""
    return _base(cfg.endpoint) + ("/v1/chat/completions" if cfg.chat else "/v1/completions")


def _sent_prompt_tokens(spec: RequestSpec, cfg: BenchConfig) -> int:
    """The length of the synthetic prompt a request that follows no other is sent with, and
    reported with: its own, capped by ``cfg.max_prompt_tokens`` (:func:`synthetic_first_prompt`)."""
    if cfg.max_prompt_tokens and synthetic_first_prompt(spec, cfg):
        return min(spec.num_prompt_tokens, cfg.max_prompt_tokens)
    return spec.num_prompt_tokens


def _sent_max_tokens(spec: RequestSpec, cfg: BenchConfig) -> int:
    """The ``max_tokens`` a request is sent with, and reported with: its output length (the engine is
    told to ``ignore_eos``), capped by ``cfg.max_output_tokens``."""
    if cfg.max_output_tokens:
        return min(spec.num_output_tokens, cfg.max_output_tokens)
    return spec.num_output_tokens


Message = dict[str, str]
"""A chat message (``role``, ``content``)."""


async def _one(
    session: aiohttp.ClientSession,
    cfg: BenchConfig,
    model: str,
    spec: RequestSpec,
    req: Request,
    t0: float,
    history: tuple[list[Message], int] | None = None,
    answer: list[str] | None = None,
) -> list[Message]:
    """Send one request; returns the messages it sent. ``history``: the conversation so far and the
    length of the new message (a turn that follows another); ``answer``: collects the answer's text."""
    key = f"{cfg.prompt_seed}/{spec.request_id}"
    if history is not None:  # the conversation so far, with the answers the engine gave, and a new message
        messages = [*history[0], {"role": "user", "content": synthetic_prompt(history[1], key)}]
    elif cfg.use_workload_prompts and spec.prompt:
        messages = [{"role": "user", "content": spec.prompt}]
    else:
        n = _sent_prompt_tokens(spec, cfg)
        messages = [{"role": "user", "content": synthetic_prompt(n, key, spec.block_hashes, spec.hash_block_size)}]
    body: dict[str, object] = {
        "model": model,
        "max_tokens": _sent_max_tokens(spec, cfg),
        "ignore_eos": True,
        "stream": cfg.stream,
        "temperature": 0.0,
    }
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    if cfg.chat:
        body["messages"] = messages
    else:
        body["prompt"] = _as_text(messages)
    api_key = cfg.tenant_keys.get(spec.tenant_id, cfg.api_key)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode()
    url = request_url(cfg)
    clock = time.perf_counter
    req.arrival_time = max(0.0, clock() - t0)
    req.transition(RequestState.RUNNING)
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            if resp.status != 200:
                error = await resp.read()
                # vLLM's admission control, named as the simulator and vLLM's metric name it
                limit = admission_rejection(error) if resp.status == 503 else None
                reason = f"http_{resp.status}" if limit is None else f"rejected: {limit}"
                _abort(req, reason, clock() - t0, _error_message(error))
            elif not cfg.stream:
                _finish_unstreamed(req, await resp.read(), clock() - t0, answer)
            else:
                await _read_stream(_lines(resp.content), req, t0, answer)
    except _CLIENT_ERRORS as exc:
        _abort(req, _error_reason(exc), clock() - t0)
    except _LineTooLong:
        _abort(req, "line_too_long", clock() - t0)
    return messages


def _as_text(messages: list[Message]) -> str:
    """A conversation as one completions prompt: an answer continues the text it completed, as the
    engine generated it (so its tokens are the ones the engine cached); a new message after a space."""
    text = ""
    for m in messages:
        if m["role"] == "assistant":
            text += m["content"]
        else:
            text = f"{text} {m['content']}" if text else m["content"]
    return text


def _text_of(choice: object) -> str:
    """The text of an answer's first choice (or of a stream chunk's): completions' ``text``, chat's
    ``message`` or ``delta`` ``content``."""
    if not isinstance(choice, dict):
        return ""
    part = choice.get("text")
    if part is None:
        msg = choice.get("message") or choice.get("delta") or {}
        part = msg.get("content") if isinstance(msg, dict) else None
    return part if isinstance(part, str) else ""


_MAX_LINE_CHARS = 1 << 23
"""Longest SSE line read (8 Mi characters); a longer one aborts the request (``line_too_long``)."""

_LINE_END = re.compile(r"\r\n|\r|\n")


class _LineTooLong(Exception):
    pass


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The lines of a stream as they come, ended by LF, CRLF or a lone CR (as SSE allows); a CRLF
    split between two reads ends one line (an extra blank one would end an event early)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    head: list[str] = []  # the pieces of a line not yet ended
    size = 0
    after_cr = False  # the text so far ends with CR: an LF that comes next ends no line of its own
    async for chunk in content.iter_any():
        text = decoder.decode(chunk)
        if not text:  # (the start of a character only)
            continue
        if after_cr and text[0] == "\n":
            text = text[1:]
        after_cr = text.endswith("\r")
        *lines, tail = _LINE_END.split(text)
        if lines:
            lines[0] = "".join(head) + lines[0]
            head.clear()
            size = 0
            for line in lines:
                yield line
        head.append(tail)
        size += len(tail)
        if size > _MAX_LINE_CHARS:
            raise _LineTooLong
    last = "".join(head) + decoder.decode(b"", final=True)
    if last:
        yield last


class _Chunks:
    """The content chunks of a streamed answer so far: their times and gaps, the usage it reported,
    the first choice's text (``answer``)."""

    __slots__ = ("answer", "gaps", "last", "req", "usage")

    def __init__(self, req: Request, answer: list[str] | None) -> None:
        self.req = req
        self.answer = answer
        self.usage: int | None = None
        self.last: float | None = None  # time of the latest content chunk
        self.gaps = array("d")  # inter-token latencies: the gaps between consecutive content chunks

    def take(self, now: float, obj: dict[str, Any], data: str) -> bool:
        """One event's JSON object, received at ``now``; False when it ended the request."""
        req = self.req
        if obj.get("error"):  # an error event (vLLM's ends a stream whose generation failed)
            _abort(req, "stream_error", now, _error_message(data))
            return False
        if isinstance(obj.get("usage"), dict):
            _note_usage(req, obj["usage"])
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.usage = int(obj["usage"]["completion_tokens"])
        choices = obj.get("choices")
        if not choices:  # no choice (a usage chunk, a filter's note): not a token, as vLLM
            return True
        if self.answer is not None:
            with contextlib.suppress(TypeError, IndexError, AttributeError, KeyError):
                if choices[0].get("index", 0) == 0:
                    self.answer.append(_text_of(choices[0]))
        if self.last is None:
            req.first_token_time = now
            req.extra[_ITL_KEY] = self.gaps
        else:
            self.gaps.append(now - self.last)
        req.last_token_time = self.last = now
        req.num_output_tokens += 1
        return True


async def _read_stream(lines: AsyncIterator[str], req: Request, t0: float, answer: list[str] | None = None) -> None:
    """Time a streamed answer's content chunks as they come (see the module's docstring); ``answer``
    collects the first choice's text. Each event is read as ``vllm bench serve`` reads the events it
    receives together (vLLM 0.32, ``benchmarks/lib/endpoint_request_func.py``: ``StreamedResponseHandler``
    splits them, ``async_request_openai_completions`` reads each): one that opens with a comment line
    (``:``, a ping) is skipped whole; any other is one ``data:`` line of a JSON object or ``[DONE]``. Any
    other line in it (``event:``, ``id:``, ``retry:``, a second ``data:``, a comment after the data) or
    data that is not a JSON object fails the request (``bad_chunk``), as vLLM's ``json.loads`` of the
    event fails it, and the event's data is not counted; a chunk is timed when its data line comes.
    The gaps go into ``extra["itl"]`` from the first content chunk on, so a request that fails later
    keeps the TTFT and the gaps it had (vLLM's ``RequestFuncOutput`` of a failed request keeps them too)."""
    clock = time.perf_counter
    chunks = _Chunks(req, answer)
    event: str | None = None  # the event being read: None between two, ":" a comment, "data" one with its data
    held: tuple[float, dict[str, Any], str] | None = None  # its data: counted when the event ends
    async for line in lines:
        if not line:  # a blank line ends an event
            if held is not None and not chunks.take(*held):
                return
            event = held = None
        elif event == ":" or (event is None and line.startswith(":")):
            event = ":"  # (skipped whole: vLLM skips an event that starts with a comment, its data too)
        elif event is None and line.startswith("data:"):
            event = "data"
            data = line[6:] if line.startswith("data: ") else line[5:]
            if data == "[DONE]":
                break
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError) as exc:
                obj = exc
            if not isinstance(obj, dict):  # (vLLM's json.loads raises, or its data.get does)
                why = f"not JSON ({obj})" if isinstance(obj, BaseException) else "not a JSON object"
                _abort(req, "bad_chunk", clock() - t0, f"a streamed chunk is {why}: {data[:200]}")
                return
            held = (clock() - t0, obj, data)
        else:
            why = "a second data line" if line.startswith("data:") else "a line other than its data"
            _abort(req, "bad_chunk", clock() - t0, f"a streamed event has {why}: {line[:200]}")
            return
    if held is not None and not chunks.take(*held):  # the last event, its blank line not sent
        return
    if chunks.last is None:  # an answer without a token: no TTFT to measure (vLLM marks it failed)
        _abort(req, "no_tokens", clock() - t0)
        return
    _finish(req, chunks.last, chunks.usage)  # E2E ends at the last token, not at the stream's close (as vLLM)


def _note_usage(req: Request, usage: object) -> None:
    """What an answer's ``usage`` says of the prompt: its length as the server counted it
    (``usage.prompt_tokens``, kept in ``extra[USAGE_PROMPT_TOKENS_KEY]``: the ``input_lens`` of
    ``--save-result``, as ``vllm bench serve`` takes them) and its cached tokens (:func:`_note_cached`)."""
    with contextlib.suppress(KeyError, TypeError):
        prompt = usage["prompt_tokens"]  # type: ignore[index]
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            req.extra[USAGE_PROMPT_TOKENS_KEY] = prompt
    _note_cached(req, usage)


def _note_cached(req: Request, usage: object) -> None:
    """The prompt tokens the server found in its prefix cache, when its ``usage`` says
    (``prompt_tokens_details.cached_tokens``: OpenAI's field; vLLM fills it with
    ``--enable-prompt-tokens-details``): the report's prefix-cache hit rate. The request's prompt
    tokens become the server's count (``usage.prompt_tokens``) then, so that the rate is of tokens
    over tokens: what was sent is counted in the workload's units (a synthetic prompt's words)."""
    with contextlib.suppress(KeyError, TypeError, ValueError):
        cached = usage["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
        prompt = usage["prompt_tokens"]  # type: ignore[index]
        if all(isinstance(n, int) and not isinstance(n, bool) for n in (cached, prompt)) and 0 <= cached <= prompt:
            req.num_prompt_tokens = prompt
            req.num_cached_tokens = cached


def _finish(req: Request, now: float, usage: int | None) -> None:
    """A completed request: its output tokens (``usage`` when the server reported it) and times
    (an unstreamed request, whose tokens were not seen, gets its first token at the finish)."""
    if usage is not None:
        req.num_output_tokens = usage
    req.num_computed_tokens = req.num_prompt_tokens + req.num_output_tokens
    req.finish_time = now
    if req.first_token_time is None:
        req.first_token_time = req.last_token_time = now
    req.transition(RequestState.FINISHED)


def _finish_unstreamed(req: Request, body: bytes, now: float, answer: list[str] | None = None) -> None:
    """One request answered as a whole: its finish time, and its tokens from ``usage``."""
    try:
        obj = json.loads(body)
        usage = int(obj["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        _abort(req, "bad_response", now)
        return
    _note_usage(req, obj["usage"])
    if answer is not None:
        with contextlib.suppress(KeyError, TypeError, IndexError):
            answer.append(_text_of(obj["choices"][0]))
    _finish(req, now, usage)
    req.last_token_time = None  # tokens not seen one by one: no TPOT (n/a, not 0)


async def run_bench(
    workload: Workload | Sequence[RequestSpec],
    cfg: BenchConfig,
    *,
    on_done: Callable[[Request], None] | None = None,
    on_sent: Callable[[Request], None] | None = None,
) -> list[Request]:
    """Replay ``workload`` against ``cfg.endpoint``; returns one Request per spec.

    ``on_sent`` and ``on_done``: called with each request as it is sent and as it ends (progress; one
    never sent, a turn after a failed one, ends unsent). :class:`BenchError` when no ``cfg.model`` is
    given and the endpoint lists none (unreachable, wrong URL, key refused)."""
    specs = list(workload)
    limit = cfg.max_concurrency or max(1, len(specs))
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=cfg.request_timeout_s, sock_read=cfg.request_timeout_s
    )  # per connection attempt and per read, as before with httpx; no limit on a whole stream
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit), timeout=timeout, trust_env=True
    ) as session:
        model = cfg.model or await _default_model(session, cfg)
        reqs = []
        for i, s in enumerate(specs):
            r = s.to_request()
            r.max_tokens = _sent_max_tokens(s, cfg)  # what is sent, not the workload's cap (4096 when none)
            r.num_prompt_tokens = _sent_prompt_tokens(s, cfg)  # (--max-prompt-tokens cuts synthetic ones)
            r.seq = i
            r.extra["spec_arrival_time"] = s.arrival_time
            r.extra["model"] = s.model if cfg.workload_models and s.model else model
            reqs.append(r)
        sem = asyncio.Semaphore(limit)
        t0 = time.perf_counter()
        first = specs[0].arrival_time if specs else 0.0
        # turns that follow another (RequestSpec.after, e.g. sharegpt-sessions) go a think time after
        # it finished, with the conversation so far: its messages and the answer the engine gave
        index = {s.request_id: i for i, s in enumerate(specs)}
        followed = {s.after for s in specs if s.after is not None and s.after in index}
        ended = {rid: asyncio.Event() for rid in followed}
        talks: dict[str, list[Message]] = {}

        async def launch(spec: RequestSpec, req: Request) -> None:
            history: tuple[list[Message], int] | None = None
            try:
                if spec.after in ended:
                    await ended[spec.after].wait()
                    before = specs[index[spec.after]]
                    if spec.after not in talks:  # the turn before failed: the conversation ends there
                        req.arrival_time = time.perf_counter() - t0
                        _abort(req, "previous_turn_failed", req.arrival_time)
                        if on_done is not None:
                            on_done(req)
                        return
                    await asyncio.sleep(spec.think_time * cfg.time_scale)
                    new = spec.num_prompt_tokens - before.num_prompt_tokens - before.num_output_tokens
                    history = (talks[spec.after], max(1, new))
                else:
                    delay = (spec.arrival_time - first) * cfg.time_scale - (time.perf_counter() - t0)
                    if delay > 0:
                        await asyncio.sleep(delay)
                answer: list[str] | None = [] if spec.request_id in ended else None
                req.extra[SCHEDULED_KEY] = time.perf_counter() - t0
                async with sem:
                    if on_sent is not None:
                        on_sent(req)
                    sent = await _one(session, cfg, str(req.extra["model"]), spec, req, t0, history, answer)
                if answer is not None and req.state is RequestState.FINISHED:
                    talks[spec.request_id] = [*sent, {"role": "assistant", "content": "".join(answer)}]
            finally:
                if spec.request_id in ended:
                    ended[spec.request_id].set()
            if on_done is not None:
                on_done(req)

        tasks = [asyncio.ensure_future(launch(s, r)) for s, r in zip(specs, reqs, strict=True)]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=cfg.timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter() - t0
        for r in reqs:
            if r.state in (RequestState.WAITING, RequestState.RUNNING):
                if r.state is RequestState.WAITING:
                    r.arrival_time = end
                _abort(r, "bench_timeout", end)
    return reqs


def run_bench_sync(
    workload: Workload | Sequence[RequestSpec],
    cfg: BenchConfig,
    *,
    on_done: Callable[[Request], None] | None = None,
    on_sent: Callable[[Request], None] | None = None,
) -> list[Request]:
    """:func:`run_bench` from synchronous code (a script): runs it on a new event loop and waits.

    Where an event loop is already running (a Jupyter notebook, an ``async`` function) it cannot
    start one: ``await run_bench(...)`` there instead (a RuntimeError says so)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none running: the case this function is for
        return asyncio.run(run_bench(workload, cfg, on_done=on_done, on_sent=on_sent))
    raise RuntimeError(
        "run_bench_sync() cannot run inside a running event loop (a Jupyter notebook, an async function): "
        "use `await run_bench(workload, cfg)` there"
    )
