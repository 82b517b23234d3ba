"""Replay timed requests against an OpenAI-compatible ``/v1/completions`` endpoint.

Prompts are token-id lists (exact prompt lengths, no tokenizer on the client, no prefix
cache hits between random prompts); ``ignore_eos`` makes the output length exactly
``max_tokens``. Streaming responses carry ``continuous_usage_stats`` so every chunk says
how many tokens were generated, and each token's arrival time is recorded. Needs
``httpx`` (``pip install 'headway[serve]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReplayResult", "ReplaySpec", "next_turn_prompt", "prompt_ids", "random_prompt", "replay", "replay_sync"]


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """One request to send ``arrival_time`` seconds after the replay starts."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    ignore_eos: bool = True
    xargs: Mapping[str, Any] | None = None
    priority: int = 0
    prompt_token_ids: tuple[int, ...] | None = None
    """Explicit prompt; default: random ids (seeded by the request id, see :func:`prompt_ids`)."""
    shared_prefix: tuple[str, int] | None = None
    """``(key, tokens)``: the random prompt's first ``tokens`` ids are drawn from ``key`` alone, so
    every spec with that key starts with the same ids (a shared system prompt) and an engine with
    prefix caching finds them cached; the rest from the request id. Ignored with an explicit prompt."""
    after: str | None = None
    """A chat's next turn: sent ``think_time`` seconds after the request of this id finished
    (``arrival_time`` is then ignored), its prompt that request's prompt and answer, as the engine
    gave its token ids, then its own random ids up to ``num_prompt_tokens`` (which counts all of
    them: the earlier prompt and answer must leave room for at least one). Not with an explicit
    prompt or a shared prefix."""
    think_time: float = 0.0

    def __post_init__(self) -> None:
        if self.shared_prefix is not None and not 0 < self.shared_prefix[1] <= self.num_prompt_tokens:
            raise ValueError(
                f"request {self.request_id!r}: a shared prefix of {self.shared_prefix[1]} tokens does not fit "
                f"its {self.num_prompt_tokens}-token prompt"
            )
        if self.after is not None and (self.prompt_token_ids is not None or self.shared_prefix is not None):
            raise ValueError(f"request {self.request_id!r}: a next turn's prompt is its chat's history, not its own")
        if not (self.think_time >= 0.0 and self.think_time != float("inf")):
            raise ValueError(f"request {self.request_id!r}: think_time must be finite and >= 0, got {self.think_time}")


@dataclass(slots=True)
class ReplayResult:
    """What the client saw (seconds since the replay started)."""

    request_id: str
    arrival_time: float
    send_time: float = 0.0
    send_wall: float = 0.0
    """``time.time()`` when it was sent (to match engine-side timestamps)."""
    first_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    finish_order: int = -1
    finish_reason: str | None = None
    error: str | None = None
    aborted: bool = False
    """Not sent, or cancelled in flight, because an earlier request failed (``replay(abort_on_error=True)``)."""
    prompt_token_ids: tuple[int, ...] = ()
    """The prompt sent (once sent)."""
    output_token_ids: list[int] | None = None
    """The answer's token ids, as the engine gave them (vLLM's ``return_token_ids``), when the replay
    asked for them: for a spec another one follows (:attr:`ReplaySpec.after`)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_time is not None

    @property
    def ttft(self) -> float | None:
        """First token time since the request was sent."""
        return None if self.first_token_time is None else self.first_token_time - self.send_time

    @property
    def e2e(self) -> float | None:
        """Last token time since the request was sent."""
        return None if self.finish_time is None else self.finish_time - self.send_time

    @property
    def tpot(self) -> float | None:
        if self.first_token_time is None or self.finish_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)


def random_prompt(num_tokens: int, seed: str | int, vocab: tuple[int, int] = (4, 2047)) -> list[int]:
    """``num_tokens`` token ids drawn uniformly from ``vocab`` (inclusive), seeded."""
    rng = random.Random(str(seed))
    lo, hi = vocab
    return [rng.randint(lo, hi) for _ in range(max(1, num_tokens))]


def prompt_ids(spec: ReplaySpec, salt: str = "") -> tuple[int, ...]:
    """The prompt sent for ``spec``: its explicit ids, else random ids seeded by its request id and
    ``salt`` (after the ids of its ``shared_prefix``, seeded by the prefix's key and ``salt``)."""
    if spec.prompt_token_ids is not None:
        return spec.prompt_token_ids
    own = f"{spec.request_id}/{salt}" if salt else spec.request_id
    if spec.shared_prefix is None:
        return tuple(random_prompt(spec.num_prompt_tokens, own))
    key, shared = spec.shared_prefix
    head = random_prompt(shared, f"{key}/{salt}" if salt else key)
    tail = random_prompt(spec.num_prompt_tokens - shared, own) if spec.num_prompt_tokens > shared else []
    return tuple(head + tail)


def next_turn_prompt(spec: ReplaySpec, before: ReplayResult) -> tuple[int, ...]:
    """The prompt of ``spec``, the turn after ``before``'s (:attr:`ReplaySpec.after`): the chat so far
    (``before``'s prompt and answer), then random ids seeded by ``spec``'s request id up to its
    ``num_prompt_tokens``. ValueError when the chat so far leaves no room for them, or ``before``
    has no answer's ids."""
    if before.output_token_ids is None:
        raise ValueError(f"request {spec.request_id!r}: {before.request_id!r} came back without its answer's token ids")
    history = (*before.prompt_token_ids, *before.output_token_ids)
    own = spec.num_prompt_tokens - len(history)
    if own < 1:
        raise ValueError(
            f"request {spec.request_id!r}: its {spec.num_prompt_tokens}-token prompt leaves no room after the "
            f"{len(history)} tokens of the chat so far"
        )
    return history + tuple(random_prompt(own, spec.request_id))


async def _one(
    client: Any, url: str, model: str, spec: ReplaySpec, res: ReplayResult, t0: float,
    stream: bool, record_tokens: bool, counter: list[int], failed: asyncio.Event,
    prompt: tuple[int, ...] | None = None, want_ids: bool = False,
) -> None:  # fmt: skip
    res.prompt_token_ids = prompt_ids(spec) if prompt is None else prompt
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(res.prompt_token_ids),
        "max_tokens": spec.max_tokens,
        "ignore_eos": spec.ignore_eos,
        "temperature": 0.0,
        "stream": stream,
    }
    if want_ids:
        body["return_token_ids"] = True
        res.output_token_ids = []
    if spec.priority:
        body["priority"] = spec.priority
    body["vllm_xargs"] = {"headway_request_id": spec.request_id, **dict(spec.xargs or {})}
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    res.send_time = time.perf_counter() - t0
    res.send_wall = time.time()
    try:
        if not stream:
            resp = await client.post(url, json=body)
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            data = resp.json()
            now = time.perf_counter() - t0
            res.num_output_tokens = int(data["usage"]["completion_tokens"])
            res.finish_reason = data["choices"][0].get("finish_reason")
            if want_ids:
                res.output_token_ids = _token_ids(data["choices"][0])
            res.first_token_time = res.finish_time = now
        else:
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[6:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter() - t0
                    chunk = json.loads(payload)
                    usage = chunk.get("usage") or {}
                    n = int(usage.get("completion_tokens") or 0)
                    if n > res.num_output_tokens:
                        if res.first_token_time is None:
                            res.first_token_time = now
                        if record_tokens:
                            res.token_times.extend([now] * (n - res.num_output_tokens))
                        res.num_output_tokens = n
                    for choice in chunk.get("choices") or ():
                        if choice.get("finish_reason"):
                            res.finish_reason = choice["finish_reason"]
                        if want_ids and res.output_token_ids is not None:
                            res.output_token_ids += _token_ids(choice)
            res.finish_time = time.perf_counter() - t0
        res.finish_order = counter[0]
        counter[0] += 1
    except Exception as exc:  # recorded per request; the replay goes on (unless abort_on_error)
        res.error = f"{type(exc).__name__}: {exc}"
        failed.set()


def _token_ids(choice: Mapping[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise RuntimeError("the server sent no token_ids (it does not take vLLM's return_token_ids)")
    return [int(i) for i in ids]


async def replay(
    url: str,
    specs: Sequence[ReplaySpec],
    *,
    model: str = "tiny-llama",
    stream: bool = True,
    record_token_times: bool = False,
    timeout_s: float = 600.0,
    abort_on_error: bool = False,
) -> list[ReplayResult]:
    """Send every spec at its arrival time; returns one result per spec (same order).

    A chat's next turn (:attr:`ReplaySpec.after`) is sent its think time after the turn before it
    finished, with that turn's prompt and answer before its own tokens (:func:`next_turn_prompt`);
    when that turn failed, it is not sent (its error says so).

    ``abort_on_error``: once a request fails, send no more and cancel those in flight (their
    results are ``aborted``), for a caller that gives up on any failure: against a dead server
    it learns so at once, not after the workload's whole schedule."""
    import httpx

    endpoint = url.rstrip("/") + "/v1/completions"
    results = [ReplayResult(s.request_id, s.arrival_time) for s in specs]
    index = {s.request_id: i for i, s in enumerate(specs)}
    if len(index) != len(specs):
        raise ValueError("replay: request ids must be unique")
    followed = {s.after for s in specs if s.after is not None}
    for s in specs:
        seen, at = {s.request_id}, s
        while at.after is not None:  # every chat starts at a spec sent at its arrival time
            if at.after not in index:
                raise ValueError(f"request {at.request_id!r} follows {at.after!r}, which is not in the replay")
            if at.after in seen:
                raise ValueError(f"request {s.request_id!r}: its chat's turns follow each other in a circle")
            seen.add(at.after)
            at = specs[index[at.after]]
    counter = [0]
    failed = asyncio.Event()
    ended = {s.request_id: asyncio.Event() for s in specs if s.request_id in followed}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def send(i: int) -> None:
            """Send spec ``i`` (a next turn: once the turn before it has ended, and then only if it
            succeeded); whatever happens, its own end is told to any turn after it."""
            spec, res = specs[i], results[i]
            try:
                prompt = None
                if spec.after is not None:
                    before = results[index[spec.after]]
                    await ended[spec.after].wait()
                    if not before.ok:
                        res.error = f"not sent: the turn before it, {spec.after!r}, failed"
                        return
                    await asyncio.sleep(spec.think_time)
                    assert before.finish_time is not None  # (ok)
                    res.arrival_time = before.finish_time + spec.think_time
                    try:
                        prompt = next_turn_prompt(spec, before)
                    except ValueError as exc:
                        res.error = str(exc)
                        failed.set()
                        return
                await _one(
                    client, endpoint, model, spec, res, t0, stream, record_token_times, counter, failed,
                    prompt, spec.request_id in followed,
                )  # fmt: skip
            finally:
                if spec.request_id in ended:
                    ended[spec.request_id].set()

        tasks = [asyncio.create_task(send(i)) for i, s in enumerate(specs) if s.after is not None]
        order = sorted((i for i, s in enumerate(specs) if s.after is None), key=lambda i: specs[i].arrival_time)
        for i in order:
            delay = specs[i].arrival_time - (time.perf_counter() - t0)
            if delay > 0 and abort_on_error:
                with contextlib.suppress(TimeoutError):  # woken early by a failure
                    await asyncio.wait_for(failed.wait(), delay)
            elif delay > 0:
                await asyncio.sleep(delay)
            if abort_on_error and failed.is_set():
                break
            tasks.append(asyncio.create_task(send(i)))
        if abort_on_error and tasks:
            waiters: list[asyncio.Future[Any]] = [asyncio.gather(*tasks), asyncio.ensure_future(failed.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)  # all done, or one failed
            for task in [*tasks, *waiters]:
                task.cancel()
            await asyncio.gather(*tasks, *waiters, return_exceptions=True)
        else:
            await asyncio.gather(*tasks)
    if abort_on_error and failed.is_set():
        for res in results:
            if res.error is None and res.finish_time is None:
                res.error, res.aborted = "not sent or cancelled: an earlier request failed", True
    return results


def replay_sync(url: str, specs: Sequence[ReplaySpec], **kwargs: Any) -> list[ReplayResult]:
    """:func:`replay` from synchronous code."""
    return asyncio.run(replay(url, specs, **kwargs))
