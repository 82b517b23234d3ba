"""The JSONL workload format: a prompt log with real output lengths, the predictor's data format too.

One JSON object a line::

    {"prompt": str, "output_tokens": int, "model": str?, "arrival_time": float?, "tenant": str?,
     "prompt_tokens": int?, "category": str?, "timeout": float?, "reasoning_tokens": int?,
     "id": str | int?}

``output_tokens`` is what the engine generates (for a reasoning model, answer plus thinking), or the
answer alone when ``reasoning_tokens`` (>= 0) gives the thinking: the request then generates both,
as the predictors' reader (:func:`headway.predict.data.load_jsonl`) counts its length;
``prompt_tokens`` defaults to a count of the prompt (``count_tokens``, default
:func:`~headway.workload.approx_token_count`); ``arrival_time`` is seconds from the start: when
every line has one the workload is timed (replayed as recorded), when none has arrivals are
generated (``--arrivals burst``, or ``--rate``), and a log that has it on some lines only is
refused, naming the first line without it, as is one whose times span more than about ten years.
``id`` is the request's id (``@<line>`` appended to a repeated one; a line without one is
``<file stem>-<k>``, k counted from 0). ``tenant`` sets the request's tenant; ``model`` is the
request's (:attr:`~headway.workload.RequestSpec.model`), counted in the workload's
``meta["models"]``. ``timeout``: seconds after its arrival at which the client gave up on the
request if unfinished (:attr:`~headway.workload.RequestSpec.timeout`; ``--client-timeout`` sets
every request's instead). The same files train and evaluate predictors (``headway predictor train
--data FILE.jsonl``). :func:`headway.workload.load_workload` reads it as the ``jsonl`` format (told by
its keys, or with ``format="jsonl"``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from headway.workload._datasets import TokenCounter, approx_token_count
from headway.workload._errors import WorkloadFormatError
from headway.workload._records import (
    MAX_TOKEN_COUNT,
    check_limit,
    check_span,
    existing_file,
    file_stem,
    int_value,
    jsonl_records,
    time_value,
)
from headway.workload._spec import RequestSpec, Workload

__all__ = ["JSONL_KEYS", "read_jsonl_workload"]

JSONL_KEYS = frozenset({"prompt", "output_tokens"})
"""Keys that tell a JSONL workload from the other JSON formats."""


def _text(path: Path, line: int, record: dict[str, object], key: str) -> str | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise WorkloadFormatError(path, line, "expected a string", field=key, value=value)
    return value


def _json_int(path: Path, line: int, field: str, raw: object) -> int:
    """A token count as a JSON number, as the predictors' reader takes it (a string such as ``"120"``,
    which a CSV cell may be, is refused here: one file must read the same in both)."""
    if isinstance(raw, str):
        raise WorkloadFormatError(path, line, "expected an integer token count (a JSON number)", field=field, value=raw)
    return int_value(path, line, field, raw)


def _request_id(path: Path, line: int, raw: object) -> str | None:
    """The line's ``id`` as a request id (None when it has none)."""
    if raw is None:
        return None
    if (isinstance(raw, str) and raw) or (isinstance(raw, int) and not isinstance(raw, bool)):
        return str(raw)
    raise WorkloadFormatError(path, line, "expected a string or an integer", field="id", value=raw)


def _reasoning_tokens(path: Path, line: int, raw: object) -> int:
    """``reasoning_tokens``: the thinking generated besides ``output_tokens`` (0 when absent)."""
    if raw is None:
        return 0
    if isinstance(raw, int | float) and not isinstance(raw, bool) and raw <= 0:
        if raw == 0:
            return 0
        raise WorkloadFormatError(path, line, "token count must be >= 0", field="reasoning_tokens", value=raw)
    return _json_int(path, line, "reasoning_tokens", raw)


def read_jsonl_workload(
    path: str | Path,
    *,
    limit: int | None = None,
    name: str | None = None,
    count_tokens: TokenCounter | None = None,
) -> Workload:
    """Read a JSONL workload (see the module docstring); errors name the file, line and field."""
    check_limit(limit)
    p = existing_file(path)
    stem = file_stem(p)
    counter = count_tokens or approx_token_count
    specs: list[RequestSpec] = []
    models: Counter[str] = Counter()
    times: list[float | None] = []
    lines: list[int] = []
    untimed_line: int | None = None  # the first line without an arrival_time
    ids: set[str] = set()
    for line, rec in jsonl_records(p):
        if limit is not None and len(specs) >= limit:
            break
        if not isinstance(rec, dict):
            raise WorkloadFormatError(p, line, "expected a JSON object", value=rec)
        prompt = _text(p, line, rec, "prompt")
        if not prompt or not prompt.strip():  # (as the predictors' reader: white space only is no prompt)
            raise WorkloadFormatError(p, line, "missing or empty prompt", field="prompt", value=rec.get("prompt"))
        output = _json_int(p, line, "output_tokens", rec.get("output_tokens"))
        output += _reasoning_tokens(p, line, rec.get("reasoning_tokens"))
        if output > MAX_TOKEN_COUNT:
            raise WorkloadFormatError(
                p, line, f"output_tokens + reasoning_tokens must be at most {MAX_TOKEN_COUNT:,}", value=output
            )
        raw_prompt_tokens = rec.get("prompt_tokens")
        n_prompt = (
            _json_int(p, line, "prompt_tokens", raw_prompt_tokens)
            if raw_prompt_tokens is not None
            else max(1, counter(prompt))
        )
        raw_time = rec.get("arrival_time")
        times.append(None if raw_time is None else time_value(p, line, "arrival_time", raw_time))
        lines.append(line)
        if raw_time is None and untimed_line is None:
            untimed_line = line
        raw_timeout = rec.get("timeout")
        timeout = None if raw_timeout is None else time_value(p, line, "timeout", raw_timeout)
        model = _text(p, line, rec, "model")
        if model:
            models[model] += 1
        rid = _request_id(p, line, rec.get("id")) or f"{stem}-{len(specs)}"
        if rid in ids:  # a repeated id, as read_sharegpt tells it apart
            rid = f"{rid}@{line}"
        ids.add(rid)
        specs.append(
            RequestSpec(
                request_id=rid,
                arrival_time=0.0,
                num_prompt_tokens=n_prompt,
                num_output_tokens=output,
                tenant_id=_text(p, line, rec, "tenant") or "default",
                prompt=prompt,
                category=_text(p, line, rec, "category"),
                timeout=timeout,
                model=model,
            )
        )
    if not specs:
        raise WorkloadFormatError(p, None, "no requests", show_value=False)
    timed = untimed_line is None
    num_timed = sum(t is not None for t in times)
    if not timed and num_timed:  # replaying some lines' times and not others' has no meaning
        raise WorkloadFormatError(
            p,
            untimed_line,
            f"missing, and {num_timed} of the {len(times)} lines read have one: give every line an "
            "arrival_time (a timed log) or none (generated arrivals)",
            field="arrival_time",
            show_value=False,
        )
    if timed:
        check_span(p, ((line, float(t or 0.0)) for line, t in zip(lines, times, strict=True)), "arrival_time")
        specs = [dataclasses.replace(s, arrival_time=float(t or 0.0)) for s, t in zip(specs, times, strict=True)]
    meta: dict[str, object] = {"source": str(p), "format": "jsonl", "timed": timed, "models": dict(models)}
    return Workload.from_specs(name or stem, specs, meta)
