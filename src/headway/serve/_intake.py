"""Request intake: read and check a generation request's body, build its
:class:`~headway.core.Request`, and the payload that goes upstream.

Every refusal is a :class:`Refused` carrying its ``headway_rejections`` reason and the
OpenAI-style answer: 413 over ``max_body_bytes``, 408 after ``body_timeout_s``, 400 naming the
field (JSON that does not parse, a value of a field the gateway reads that vLLM refuses too, ``max_tokens`` over
``max_tokens_limit``, a ``priority`` below the caller's ``min_priority``). A request that gives no
``max_tokens`` (nor, in chat, ``max_completion_tokens``) is sent with ``default_max_tokens``, else
with ``max_tokens_limit`` when one is set.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from headway.core import Request
from headway.predict.score import scoring_text
from headway.serve._config import GatewayConfig
from headway.serve._errors import api_error
from headway.serve._prefix_hash import HASH_BLOCK_TOKENS, prefix_block_hashes
from headway.serve._tenants import Identity
from headway.serve._tokenizer import PromptDecoder
from headway.serve._wire import BadRequest, Parsed, loads_json, validate_body

__all__ = ["SCORED_TOKENS_DEFAULT", "Intake", "Refused"]

SCORED_TOKENS_DEFAULT = 512
"""Tokens' worth of a prompt kept for scoring without ``scorer_max_length``: the longest input
of the BERT-family encoders the predictors use; a scorer keeps fewer if its checkpoint's
length is shorter."""


class Refused(Exception):
    """A request refused at intake: ``reason`` (its ``headway_rejections`` label) and ``response``."""

    def __init__(self, reason: str, response: Response) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response


def check_length(request: HTTPRequest, limit: int) -> None:
    """:class:`Refused` (413) at once for a ``Content-Length`` over ``limit`` (before any work)."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise Refused("too_large", api_error("request_too_large", limit=limit))


async def read_body(request: HTTPRequest, limit: int, timeout_s: float) -> bytes:
    """The body, or :class:`Refused`: 413 over ``limit`` bytes, 408 when it has not arrived whole
    within ``timeout_s``, ``client_disconnected`` (a bare 499) for a client gone before it was in
    (not uvicorn's traceback). Generation requests and passed-through ones alike."""
    buf = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                buf += chunk
                if len(buf) > limit:
                    raise Refused("too_large", api_error("request_too_large", limit=limit))
    except TimeoutError:
        raise Refused(
            "body_timeout", api_error("body_timeout", headers={"Connection": "close"}, seconds=timeout_s)
        ) from None
    except ClientDisconnect:
        raise Refused("client_disconnected", Response(status_code=499)) from None
    return bytes(buf)


class Intake:
    """Reads, checks and builds requests as ``config`` says; ``hash_prefixes``: compute the
    prompt-text prefix hashes (only a router that reads them needs them)."""

    def __init__(self, config: GatewayConfig, *, hash_prefixes: bool) -> None:
        self.config = config
        self._hash_prefixes = hash_prefixes
        limit = config.max_tokens_limit
        self.default_max_tokens = min(config.default_max_tokens, limit or config.default_max_tokens)
        """``default_max_tokens``, at most ``max_tokens_limit``: a request without ``max_tokens`` is
        sent and queued with it (0: none)."""
        self.assumed_max_tokens = self.default_max_tokens or min(
            config.assumed_output_tokens, limit or config.assumed_output_tokens
        )
        """The queued length of a request without ``max_tokens`` (a scheduling estimate)."""
        self.added_max_tokens = self.default_max_tokens or limit
        """The ``max_tokens`` added to a request that gives none (0: nothing added, the request
        goes as sent): ``default_max_tokens``, else ``max_tokens_limit``, so that leaving
        ``max_tokens`` out does not get round the limit (the backend's own default can be far
        larger). Only the former is also its queued length: the limit is a cap, not an estimate."""
        self.scored_tokens = config.scorer_max_length or SCORED_TOKENS_DEFAULT
        """The scorer reads at most this many tokens' worth of a prompt (see ``scoring_text``): a
        request keeps that prefix only, whatever the prompt's size."""
        self.tokenizer = PromptDecoder(config.tokenizer, self.scored_tokens) if config.tokenizer else None
        """``--tokenizer``: decodes a prompt of token ids for the scorer (:meth:`token_text`)."""

    def check_length(self, request: HTTPRequest) -> None:
        """413 at once for a ``Content-Length`` over ``max_body_bytes`` (before any work)."""
        check_length(request, self.config.max_body_bytes)

    async def read(self, request: HTTPRequest, chat: bool) -> tuple[dict[str, Any], bytes, Parsed]:
        """The body as JSON, as received, and checked; or :class:`Refused`."""
        raw = await read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)
        try:
            body = loads_json(raw)
        except ValueError as exc:
            raise Refused(
                "invalid", api_error("invalid_json", detail=f"request body is not valid JSON: {exc}")
            ) from None
        except RecursionError:
            raise Refused("invalid", api_error("invalid_json", detail="request body is nested too deeply")) from None
        try:
            parsed = validate_body(body, chat)
        except BadRequest as exc:
            raise Refused("invalid", api_error("invalid_value", param=exc.param, detail=exc)) from None
        limit = self.config.max_tokens_limit
        if limit and parsed.max_tokens is not None and parsed.max_tokens > limit:
            name = parsed.max_tokens_field
            raise Refused(
                "invalid",
                api_error(
                    "invalid_value", param=name, detail=f"'{name}' must be at most {limit}, got {parsed.max_tokens}"
                ),
            )
        return body, raw, parsed

    @staticmethod
    def bound_priority(body: dict[str, Any], parsed: Parsed, ident: Identity) -> None:
        """Hold ``parsed.priority`` to the caller's ``min_priority`` (lower runs first): a request
        asking for less is refused (400 naming ``priority``); one that gives none is queued at it
        when it is above vLLM's default, 0. The body goes upstream as it came."""
        floor = ident.min_priority
        if floor is None:
            return
        if body.get("priority") is None:
            parsed.priority = max(parsed.priority, floor)
        elif parsed.priority < floor:
            raise Refused(
                "invalid",
                api_error(
                    "invalid_value",
                    param="priority",
                    detail=f"'priority' must be at least {floor} for this API key (lower runs first), "
                    f"got {parsed.priority}",
                ),
            )

    def new_request(
        self, request_id: str, now: float, body: dict[str, Any], parsed: Parsed, ident: Identity
    ) -> Request:
        req = Request(
            request_id=request_id,
            arrival_time=now,
            num_prompt_tokens=parsed.num_prompt_tokens,
            max_tokens=self.queued_max_tokens(parsed),
            tenant_id=ident.tenant,
            tier=ident.tier,
            priority=parsed.priority,
            prompt=None if parsed.query_text is None else scoring_text(parsed.query_text, self.scored_tokens),
            block_hashes=prefix_block_hashes(parsed.prompt_text) if self._hash_prefixes else (),
            hash_block_size=HASH_BLOCK_TOKENS,
        )
        model = body.get("model")
        req.extra["model"] = model if isinstance(model, str) else ""
        req.extra["stream"] = parsed.stream
        if parsed.answers > 1 or not parsed.single_prompt:  # (what online learning divides or skips)
            req.extra["answers"] = parsed.answers
            req.extra["single_prompt"] = parsed.single_prompt
        return req

    def token_text(self, parsed: Parsed) -> str | None:
        """What the scorer reads of a completions prompt of token ids (the ``Request.prompt`` that
        :meth:`new_request` could not give it), decoded by :attr:`tokenizer`; None without one or
        without token ids. Milliseconds for a long prompt: call it off the event loop."""
        if self.tokenizer is None or parsed.prompt_token_ids is None:
            return None
        return self.tokenizer(parsed.prompt_token_ids)

    def queued_max_tokens(self, parsed: Parsed) -> int:
        """The length a request is queued at: its ``max_tokens``; without one, the ``max_tokens`` the
        gateway adds if it adds one, else vLLM's own default where it has one (a completions
        request: 16) if below ``assumed_max_tokens``, else ``assumed_max_tokens``."""
        if parsed.max_tokens is not None:
            return parsed.max_tokens
        if not self.added_max_tokens and parsed.implied_max_tokens is not None:
            return min(parsed.implied_max_tokens, self.assumed_max_tokens)
        return self.assumed_max_tokens

    def payload(self, body: dict[str, Any], raw: bytes, parsed: Parsed, req: Request) -> bytes:
        """What goes upstream: the request as the client sent it, unless a documented option adds
        a field (``add_stream_usage``; ``default_max_tokens`` or ``max_tokens_limit``: ``max_tokens``
        to a request that gives neither it nor chat's ``max_completion_tokens``)."""
        payload = raw
        if parsed.stream and not parsed.wants_usage and self.config.add_stream_usage:
            body = dict(body)
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts
            payload = json.dumps(body).encode()
        if parsed.max_tokens is None and self.added_max_tokens:
            # with default_max_tokens the queued length and the upstream cap agree; else the limit caps it
            if payload is raw:
                body = dict(body)
            body["max_tokens"] = self.added_max_tokens
            payload = json.dumps(body).encode()
        return payload
