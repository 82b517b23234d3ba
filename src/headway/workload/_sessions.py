"""Workloads whose requests share prefixes: multi-turn sessions and shared system prompts.

Both give requests chained block hashes (:attr:`headway.core.Request.block_hashes`, 16-token
blocks) so that an engine with prefix caching can reuse the KV of what requests share.

**Sessions.** In a chat, turn ``k``'s prompt is the conversation so far (every earlier prompt
and answer) plus the new message, and the user sends it a think time after the previous answer
arrived. :func:`session_workload` makes turn ``k`` a request of that prompt length that
follows turn ``k - 1`` (``RequestSpec.after``) with an exponential think time; the first turns
arrive by an arrival process. The conversation is one token stream, so block ``i`` of it has
one hash whichever turn computes it: a turn's hashes are those of the stream's whole blocks up
to the end of its answer (the next turn reuses the answer's blocks too, as vLLM, which hashes
generated blocks, does).

**System prompts.** :func:`with_system_prompts` puts one of a few shared prefixes before each
request's prompt (as the instructions of an application are); the prefix's blocks are shared,
the rest of each prompt is its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from headway.workload._arrivals import ArrivalProcess, Seed, arrivals_meta, make_rng
from headway.workload._errors import WorkloadFormatError
from headway.workload._records import PathLike, check_limit, csv_rows, existing_file, int_value
from headway.workload._resample import noisy_lengths
from headway.workload._spec import DEFAULT_MAX_TOKENS, RequestSpec, Workload

__all__ = ["DEFAULT_THINK_TIME", "read_turn_lengths", "resample_answers", "session_workload", "with_system_prompts"]

DEFAULT_THINK_TIME = 10.0
"""Mean seconds between an answer and the user's next message (exponential)."""

_BLOCK = 16
_STREAM = 1 << 40  # hash space of one conversation's (or system prompt's) token stream


def _turn_tokens(path: Path, line: int, field: str, raw: str) -> int:
    """A turn's token count, 0 allowed (a turn without a message or an answer)."""
    try:
        zero = float(raw.strip()) == 0.0
    except ValueError:
        zero = False  # (int_value names the cell)
    return 0 if zero else int_value(path, line, field, raw)


def read_turn_lengths(path: PathLike, *, limit: int | None = None) -> list[list[tuple[int, int]]]:
    """Conversations from a per-turn length table (``conv_id, turn, prompt_tokens,
    response_tokens``, one row a turn): each a list of (message tokens, answer tokens) in turn
    order. ``limit`` stops after that many conversations; a turn without tokens ends its
    conversation there. A malformed row, or a turn a conversation already has, raises
    :class:`~headway.workload.WorkloadFormatError` naming the file and line."""
    check_limit(limit)
    p = existing_file(path)
    convs: dict[str, dict[int, tuple[int, int, int]]] = {}
    for line, cells, _ in csv_rows(p, ("conv_id", "turn", "prompt_tokens", "response_tokens")):
        cid = cells["conv_id"]
        if cid not in convs:
            if limit is not None and len(convs) >= limit:
                break
            convs[cid] = {}
        raw_turn = cells["turn"].strip()
        if not raw_turn.isdecimal():
            raise WorkloadFormatError(p, line, "expected a non-negative integer", field="turn", value=raw_turn)
        turn = int(raw_turn)
        if turn in convs[cid]:
            first = convs[cid][turn][0]
            raise WorkloadFormatError(
                p, line, f"conversation {cid!r} has this turn already (line {first})", field="turn", value=turn
            )
        prompt = _turn_tokens(p, line, "prompt_tokens", cells["prompt_tokens"])
        convs[cid][turn] = (line, prompt, _turn_tokens(p, line, "response_tokens", cells["response_tokens"]))
    out = []
    for turns in convs.values():
        kept: list[tuple[int, int]] = []
        for _, (_, msg, ans) in sorted(turns.items()):
            if msg <= 0 or ans <= 0:
                break
            kept.append((msg, ans))
        if kept:
            out.append(kept)
    return out


def resample_answers(
    conversations: Sequence[Sequence[tuple[int, int]]], cv: float, seed: Seed = 0
) -> list[list[tuple[int, int]]]:
    """The conversations with each answer's length resampled as
    :func:`~headway.workload.resample_output_lengths` resamples an output length (mean-1
    lognormal noise of CV ``cv``, drawn turn by turn in conversation order; capped at
    the larger of ``DEFAULT_MAX_TOKENS`` and the recorded length): done before :func:`session_workload`, so that each
    turn's prompt holds the answers its conversation got."""
    answers = [ans for conv in conversations for _, ans in conv]
    noisy = iter(noisy_lengths(answers, cv, seed))
    return [[(msg, min(next(noisy), max(DEFAULT_MAX_TOKENS, ans))) for msg, ans in conv] for conv in conversations]


def _stream_hashes(stream: int, first: int, last: int) -> tuple[int, ...]:
    return tuple(stream * _STREAM + i for i in range(first, last))


def session_workload(
    conversations: Sequence[Sequence[tuple[int, int]]],
    arrivals: ArrivalProcess,
    *,
    num_requests: int | None = None,
    think_time: float = DEFAULT_THINK_TIME,
    max_model_len: int | None = None,
    seed: Seed = 0,
    name: str = "sessions",
) -> Workload:
    """Multi-turn sessions (module docstring): conversations in the given order, their first
    turns at ``arrivals``' times, until ``num_requests`` turns (all when None); a conversation
    stops before a turn whose prompt and answer exceed ``max_model_len`` tokens."""
    if not (math.isfinite(think_time) and think_time >= 0):
        raise ValueError(f"think_time must be a finite number >= 0, got {think_time!r}")
    rng = make_rng(seed)
    kept: list[list[tuple[int, int]]] = []
    total = 0
    for conv in conversations:
        if num_requests is not None and total >= num_requests:
            break
        turns = list(conv[: None if num_requests is None else num_requests - total])
        if max_model_len is not None:
            history, cut = 0, 0
            for msg, ans in turns:
                if history + msg + ans > max_model_len:
                    break
                history += msg + ans
                cut += 1
            turns = turns[:cut]
        if turns:
            kept.append(turns)
            total += len(turns)
    starts = arrivals.sample(len(kept), int(rng.integers(1 << 63))).tolist()
    specs: list[RequestSpec] = []
    for c, (turns, t0) in enumerate(zip(kept, starts, strict=True)):
        history = 0
        prev: str | None = None
        for k, (msg, ans) in enumerate(turns):
            prompt = history + msg
            rid = f"{name}-{c}-{k}"
            think = float(rng.exponential(think_time)) if prev is not None and think_time > 0 else 0.0
            specs.append(
                RequestSpec(
                    request_id=rid,
                    arrival_time=float(t0),
                    num_prompt_tokens=prompt,
                    num_output_tokens=ans,
                    tenant_id=f"{name}-{c}",
                    block_hashes=_stream_hashes(c + 1, 0, (prompt + ans) // _BLOCK),
                    hashed_tokens=(prompt + ans) // _BLOCK * _BLOCK,  # whole blocks, the last maybe the answer's
                    after=prev,
                    think_time=think,
                )
            )
            prev = rid
            history = prompt + ans
    meta: dict[str, object] = {
        "format": "sessions",
        "conversations": len(kept),
        "think_time": think_time,
        **arrivals_meta(arrivals),
    }
    return Workload.from_specs(name, specs, meta)


def with_system_prompts(workload: Workload, num_prompts: int, tokens: int, seed: Seed = 0) -> Workload:
    """Each request's prompt gets one of ``num_prompts`` shared ``tokens``-token prefixes (drawn
    uniformly, seeded); their blocks are shared, the rest of each prompt is its own."""
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an int >= 1, got {num_prompts!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"system prompt tokens must be an int >= 1, got {tokens!r}")
    if any(s.block_hashes for s in workload):
        raise ValueError(f"workload {workload.name!r} already has block hashes; system prompts need plain requests")
    picks = np.random.default_rng(make_rng(seed).integers(1 << 63)).integers(num_prompts, size=len(workload))
    full = tokens // _BLOCK
    specs = []
    for i, (spec, g) in enumerate(zip(workload, picks.tolist(), strict=True)):
        prompt = tokens + spec.num_prompt_tokens
        own = _stream_hashes(num_prompts + 2 + i, full, prompt // _BLOCK)
        # the prefix's partial last block holds request tokens too: it is the request's own
        specs.append(
            dataclasses.replace(
                spec,
                num_prompt_tokens=prompt,
                block_hashes=_stream_hashes(1 + g, 0, full) + own,
                hash_block_size=_BLOCK,
            )
        )
    meta = {**workload.meta, "system_prompts": num_prompts, "system_prompt_tokens": tokens}
    return Workload.from_specs(workload.name, specs, meta)
