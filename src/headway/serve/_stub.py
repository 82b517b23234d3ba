"""A fast OpenAI-compatible stub backend (for unit tests and the gateway-overhead benchmark).

It generates exactly ``max_tokens`` tokens (as vLLM does with ``ignore_eos``), one SSE
event per token, ``token_delay_s`` apart, runs at most ``max_num_seqs`` requests at once
(FCFS beyond that, like vLLM's waiting queue) and publishes vLLM-style gauges on
``/metrics``. Failures can be injected for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headway.serve._wire import lax_bool, lax_int

__all__ = ["StubConfig", "StubStats", "create_stub_app"]


@dataclass(slots=True)
class StubConfig:
    """Behaviour of the stub (mutable: tests flip failure modes at run time)."""

    model: str = "stub-model"
    token_delay_s: float = 0.0
    """Sleep between generated tokens (0 = as fast as possible)."""
    first_token_delay_s: float = 0.0
    max_num_seqs: int = 0
    """Requests generating at once (0 = unlimited); the rest wait FCFS."""
    default_max_tokens: int = 16
    fail_status: int = 0
    """Answer every completion request with this HTTP status (0 = off), as vLLM's server answers an
    error: ``{"error": {"message", "type", "param", "code"}}``."""
    fail_message: str = "injected failure"
    """That error's message."""
    fail_after_tokens: int = 0
    """Drop the connection after this many streamed tokens (0 = off)."""
    max_num_queued_reqs: int = 0
    """As vLLM's option: answer 503 to a request arriving while this many are unfinished (0 = no
    limit, vLLM's None)."""
    cached_tokens: int | None = None
    """Report this many prompt tokens found cached in every answer's ``usage``
    (``prompt_tokens_details.cached_tokens``, as vLLM with ``--enable-prompt-tokens-details``), of
    ``prompt_tokens`` = this + 100; None: no such field (vLLM's default) and ``prompt_tokens`` 1."""


@dataclass(slots=True)
class StubStats:
    started: int = 0
    completed: int = 0
    aborted: int = 0
    running: int = 0
    waiting: int = 0
    rejected: int = 0
    """Requests answered 503 by ``max_num_queued_reqs``."""
    failed: int = 0
    """Requests answered ``fail_status``."""
    most_unfinished: int = 0
    order: list[str] = field(default_factory=list)
    """``prompt`` of each request in the order it started generating."""


class _Stub:
    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.stats = StubStats()
        self._sem: asyncio.Semaphore | None = None
        self._unfinished = 0

    def _usage(self, completion_tokens: int) -> dict[str, object]:
        cached = self.config.cached_tokens
        prompt = 1 if cached is None else cached + 100
        usage: dict[str, object] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": completion_tokens + prompt,
        }
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.config.max_num_seqs and self._sem is None:
            self._sem = asyncio.Semaphore(self.config.max_num_seqs)
        return self._sem

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": self.config.model, "object": "model", "owned_by": "headway"}]}
        )

    async def health(self, request: Request) -> Response:
        return Response(b"", status_code=200)

    async def metrics(self, request: Request) -> Response:
        s, c = self.stats, self.config
        kv = s.running / c.max_num_seqs if c.max_num_seqs else 0.0
        text = (
            f'vllm:num_requests_running{{model_name="{c.model}"}} {float(s.running)}\n'
            f'vllm:num_requests_waiting{{model_name="{c.model}"}} {float(s.waiting)}\n'
            f'vllm:num_requests_waiting_by_reason{{model_name="{c.model}",reason="capacity"}} '
            f"{float(s.waiting)}\n"
            f'vllm:kv_cache_usage_perc{{model_name="{c.model}"}} {kv}\n'
        )
        return Response(text.encode(), media_type="text/plain")

    async def stats_endpoint(self, request: Request) -> Response:
        s = self.stats
        stats = {
            "started": s.started,
            "completed": s.completed,
            "aborted": s.aborted,
            "running": s.running,
            "waiting": s.waiting,
            "order": s.order,
        }
        # ASCII-escaped: a prompt may hold a lone surrogate, which UTF-8 cannot encode
        return Response(json.dumps(stats).encode(), media_type="application/json")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        c = self.config
        body = json.loads(await request.body())
        if c.fail_status:
            self.stats.failed += 1
            kind = HTTPStatus(c.fail_status).phrase.replace(" ", "")  # vLLM's InternalServerError, BadRequestError
            kind += "" if kind.endswith("Error") else "Error"
            error = {"message": c.fail_message, "type": kind, "param": None, "code": c.fail_status}
            return JSONResponse({"error": error}, status_code=c.fail_status)
        if c.max_num_queued_reqs and self._unfinished + 1 > c.max_num_queued_reqs:
            self.stats.rejected += 1
            message = (  # vLLM 0.32's QueueOverflowError
                "The engine is currently busy and cannot accept new requests. "
                "Please try again later or on a different instance."
            )
            error = {"message": message, "type": "Service Unavailable", "param": None, "code": 503}  # vLLM's
            return JSONResponse({"error": error}, status_code=503)
        self._unfinished += 1
        self.stats.most_unfinished = max(self.stats.most_unfinished, self._unfinished)
        try:
            return await self._answer(request, body, chat)
        except BaseException:
            self._unfinished -= 1
            raise

    def _done(self) -> None:
        self._unfinished -= 1

    async def _answer(self, request: Request, body: dict[str, Any], chat: bool) -> Response:
        """The answer to an accepted request; :meth:`_done` when it ends (streamed: at its end)."""
        c = self.config
        # (fields read as vLLM's request models read them: lax ints and bools, "5.00", "true")
        given = body.get("max_completion_tokens") if chat else None  # (chat's: before its max_tokens)
        if given is None:
            given = body.get("max_tokens")
        n = (lax_int(given) if given is not None else 0) or c.default_max_tokens
        answers = lax_int(body.get("n") if body.get("n") is not None else 1)  # choices: each n tokens long
        msgs = body.get("messages") or [{}]  # (vLLM takes an empty list too)
        label = str(body.get("prompt") if not chat else msgs[-1].get("content"))
        stream = body.get("stream") is not None and lax_bool(body.get("stream"))
        usage_opt = lax_bool((body.get("stream_options") or {}).get("include_usage") or False)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{time.monotonic_ns()}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        if not stream:
            whole = await self._generate_whole(request, label, n)
            self._done()
            if not whole:
                self.stats.aborted += 1
                return Response(status_code=499)  # nobody is listening
            self.stats.completed += 1
            choices: list[dict[str, object]] = [
                {
                    "index": k,
                    "message": {"role": "assistant", "content": " tok" * n},
                    "finish_reason": "length",
                }
                if chat
                else {"index": k, "text": " tok" * n, "finish_reason": "length"}
                for k in range(answers)
            ]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": c.model,
                    "choices": choices,
                    "usage": self._usage(n * answers),
                }
            )

        def chunk(i: int, k: int) -> bytes:
            if chat:
                ch: dict[str, object] = {
                    "index": k,
                    "delta": {"content": " tok"},
                    "finish_reason": "length" if i == n - 1 else None,
                }
            else:
                ch = {"index": k, "text": " tok", "finish_reason": "length" if i == n - 1 else None}
            d = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": c.model,
                "choices": [ch],
                "usage": None,
            }
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            finished = False
            try:
                async with self._slot(label):
                    if c.first_token_delay_s:
                        await asyncio.sleep(c.first_token_delay_s)
                    for i in range(n):
                        if c.fail_after_tokens and i >= c.fail_after_tokens:
                            raise RuntimeError("injected mid-stream failure")
                        if c.token_delay_s:
                            await asyncio.sleep(c.token_delay_s)
                        for k in range(answers):
                            yield chunk(i, k)
                    if usage_opt:
                        u = {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": c.model,
                            "choices": [],
                            "usage": self._usage(n * answers),
                        }
                        yield b"data: " + json.dumps(u, separators=(",", ":")).encode() + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    finished = True
            finally:
                self._done()
                if finished:
                    self.stats.completed += 1
                else:
                    self.stats.aborted += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @contextlib.asynccontextmanager
    async def _slot(self, label: str) -> AsyncIterator[None]:
        sem = self._semaphore()
        if sem is not None:
            self.stats.waiting += 1
            try:
                await sem.acquire()
            finally:
                self.stats.waiting -= 1
        self.stats.started += 1
        self.stats.running += 1
        self.stats.order.append(label)
        if len(self.stats.order) > 10_000:
            del self.stats.order[:5_000]
        try:
            yield
        finally:
            self.stats.running -= 1
            if sem is not None:
                sem.release()

    async def _generate_whole(self, request: Request, label: str, n: int) -> bool:
        """Take a slot and "generate" ``n`` tokens for a non-streamed answer; False when the
        client disconnected first (vLLM aborts such a request too)."""
        c = self.config
        if not (c.max_num_seqs or c.first_token_delay_s or c.token_delay_s):
            async with self._slot(label):
                return True  # nothing to wait for

        async def work() -> None:
            async with self._slot(label):
                await self._sleep_tokens(n)

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        job, gone = asyncio.ensure_future(work()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (job, gone):
                t.cancel()
            await asyncio.gather(job, gone, return_exceptions=True)
        return job.done() and not job.cancelled()

    async def _sleep_tokens(self, n: int) -> None:
        c = self.config
        delay = c.first_token_delay_s + c.token_delay_s * n
        if delay:
            await asyncio.sleep(delay)


def create_stub_app(config: StubConfig | None = None) -> Starlette:
    """The stub as an ASGI app; ``app.state.stub.stats`` / ``.config`` for tests."""
    stub = _Stub(config or StubConfig())
    app = Starlette(
        routes=[
            Route("/v1/completions", stub.completions, methods=["POST"]),
            Route("/v1/chat/completions", stub.chat, methods=["POST"]),
            Route("/v1/models", stub.models, methods=["GET"]),
            Route("/health", stub.health, methods=["GET"]),
            Route("/metrics", stub.metrics, methods=["GET"]),
            Route("/stub/stats", stub.stats_endpoint, methods=["GET"]),
        ]
    )
    app.state.stub = stub
    return app


def prompt_length_scores(prompts: list[str]) -> list[float]:
    """A trivial scorer (log prompt length) for demos and stub tests.

    Use as ``--scorer headway.serve._stub:prompt_length_scores``.
    """
    import math

    return [math.log1p(len(p)) for p in prompts]
