"""Readers for public LLM request traces: token counts and (but for some Vidur files) arrival times, no text.

Formats:

- Azure LLM inference trace (Splitwise 2023, DynamoLLM 2024): CSV
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
  ``2023-11-16 18:15:46.6805900`` (any number of fractional digits, optional UTC
  offset). Arrival times are seconds since the earliest row (the first row of the
  published, sorted files).
- Vidur processed traces: CSV with ``num_prefill_tokens,num_decode_tokens`` and, when
  timed, ``arrived_at`` seconds; other columns are ignored. Files without
  ``arrived_at`` (the arXiv summarization lengths) take their times from an
  :class:`~headway.workload.ArrivalProcess`.
- Mooncake: JSONL, one ``{"timestamp": ms, "input_length": n, "output_length": n,
  "hash_ids": [...]}`` per line.
- BurstGPT (Azure OpenAI GPT usage, Wang et al. 2024): CSV ``Timestamp,Model,Request
  tokens,Response tokens,Total tokens,Log Type``, ``Timestamp`` in seconds from the trace's start.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from headway.workload._arrivals import ArrivalProcess, BurstArrivals, Seed
from headway.workload._errors import WorkloadFormatError
from headway.workload._records import (
    PathLike,
    Row,
    assemble,
    check_limit,
    check_span,
    csv_rows,
    existing_file,
    file_stem,
    int_value,
    jsonl_records,
    required_field,
    time_value,
)
from headway.workload._spec import Workload

__all__ = ["MOONCAKE_BLOCK_SIZE", "read_azure_trace", "read_burstgpt_trace", "read_mooncake_trace", "read_vidur_trace"]


# -------------------------------------------------------------------------- Azure
_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?$")


def _azure_timestamp(path: Path, line: int, raw: str) -> tuple[int, float]:
    """Whole seconds since the epoch (offset applied, naive = UTC) and the fraction."""
    m = _AZURE_TS.match(raw.strip())
    if m is None:
        raise WorkloadFormatError(
            path, line, "expected a time like 2023-11-16 18:15:46.6805900", field="TIMESTAMP", value=raw
        )
    date, clock, frac, offset = m.groups()
    try:
        dt = datetime.fromisoformat(f"{date} {clock}")
    except ValueError:
        raise WorkloadFormatError(path, line, "not a valid date/time", field="TIMESTAMP", value=raw) from None
    tz = UTC
    if offset and offset != "Z":
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    whole = int(dt.replace(tzinfo=tz).timestamp())
    fraction = int(frac) / 10 ** len(frac) if frac else 0.0
    return whole, fraction


def read_azure_trace(path: PathLike, *, limit: int | None = None, name: str | None = None) -> Workload:
    """Read an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrival times are seconds since the earliest timestamp; ``limit`` keeps the first
    rows of the file. Request ids are ``<file stem>-<row>`` (row counted from 0).
    """
    check_limit(limit)
    p = existing_file(path)
    stem = file_stem(p)
    raw: list[tuple[Row, int, float]] = []
    for line, cells, _ in csv_rows(p, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        if limit is not None and len(raw) >= limit:
            break
        whole, frac = _azure_timestamp(p, line, cells["TIMESTAMP"])
        row = Row(
            line=line,
            request_id=f"{stem}-{len(raw)}",
            num_prompt_tokens=int_value(p, line, "ContextTokens", cells["ContextTokens"]),
            num_output_tokens=int_value(p, line, "GeneratedTokens", cells["GeneratedTokens"]),
        )
        raw.append((row, whole, frac))
    if raw:
        w0, f0 = min((w, f) for _, w, f in raw)
        for row, w, f in raw:
            row.arrival_time = max(0.0, (w - w0) + (f - f0))
    rows = [r for r, _, _ in raw]
    check_span(p, ((r.line, r.arrival_time) for r in rows), "TIMESTAMP")
    meta: dict[str, object] = {"source": str(p), "format": "azure", "timed": True}
    return assemble(name or stem, rows, meta)


# -------------------------------------------------------------------------- Vidur
def read_vidur_trace(
    path: PathLike,
    *,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """Read a Vidur processed trace CSV (``[arrived_at,]num_prefill_tokens,num_decode_tokens``).

    Times come from ``arrived_at`` (seconds, >= 0) unless ``arrivals`` is given, which
    then assigns times in file order; a file without ``arrived_at`` and no ``arrivals``
    is a burst at t = 0. Other columns are ignored.
    """
    check_limit(limit)
    p = existing_file(path)
    stem = file_stem(p)
    rows: list[Row] = []
    timed = False
    for line, cells, header in csv_rows(p, ("num_prefill_tokens", "num_decode_tokens"), ("arrived_at",)):
        if limit is not None and len(rows) >= limit:
            break
        timed = "arrived_at" in header
        t = time_value(p, line, "arrived_at", cells["arrived_at"]) if timed and arrivals is None else 0.0
        rows.append(
            Row(
                line=line,
                request_id=f"{stem}-{len(rows)}",
                arrival_time=t,
                num_prompt_tokens=int_value(p, line, "num_prefill_tokens", cells["num_prefill_tokens"]),
                num_output_tokens=int_value(p, line, "num_decode_tokens", cells["num_decode_tokens"]),
            )
        )
    if not timed and arrivals is None:
        arrivals = BurstArrivals()
    if arrivals is None:
        check_span(p, ((r.line, r.arrival_time) for r in rows), "arrived_at")
    meta: dict[str, object] = {"source": str(p), "format": "vidur", "timed": timed and arrivals is None}
    return assemble(name or stem, rows, meta, arrivals=arrivals, seed=seed)


# ----------------------------------------------------------------------- Mooncake
MOONCAKE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` entry in Mooncake traces."""


def _hash_ids(path: Path, line: int, raw: object) -> tuple[int, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in raw):
        raise WorkloadFormatError(path, line, "must be a list of integers", field="hash_ids", value=raw)
    return tuple(raw)


def read_mooncake_trace(path: PathLike, *, limit: int | None = None, name: str | None = None) -> Workload:
    """Read a Mooncake JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``).

    Arrival times are seconds since the earliest timestamp. ``hash_ids`` (optional: chained
    ids of the prompt's 512-token blocks, the last one partial) become the requests'
    ``block_hashes`` with ``hash_block_size`` 512, for prefix caching.
    """
    check_limit(limit)
    p = existing_file(path)
    stem = file_stem(p)
    rows: list[Row] = []
    for line, rec in jsonl_records(p):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(
            Row(
                line=line,
                request_id=f"{stem}-{len(rows)}",
                arrival_time=time_value(p, line, "timestamp", required_field(p, line, rec, "timestamp")),
                num_prompt_tokens=int_value(p, line, "input_length", required_field(p, line, rec, "input_length")),
                num_output_tokens=int_value(p, line, "output_length", required_field(p, line, rec, "output_length")),
                block_hashes=_hash_ids(p, line, rec.get("hash_ids")),
                hash_block_size=MOONCAKE_BLOCK_SIZE,
            )
        )
    if rows:  # milliseconds -> seconds since the earliest request
        t0 = min(r.arrival_time for r in rows)
        for r in rows:
            r.arrival_time = (r.arrival_time - t0) / 1000.0
    check_span(p, ((r.line, r.arrival_time) for r in rows), "timestamp")
    meta: dict[str, object] = {"source": str(p), "format": "mooncake", "timed": True}
    return assemble(name or stem, rows, meta)


# ----------------------------------------------------------------------- BurstGPT
_BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
BURSTGPT_SKIPPED = "failed requests (0 request or response tokens)"
"""Why a BurstGPT row gives no request: its files with failures log them with 0 response tokens."""


def _zero(raw: str) -> bool:
    try:
        return float(raw.strip()) == 0.0
    except ValueError:
        return False  # (int_value names the cell)


def read_burstgpt_trace(path: PathLike, *, limit: int | None = None, name: str | None = None) -> Workload:
    """Read a BurstGPT trace CSV (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``).

    Arrival times are seconds since the earliest ``Timestamp`` (the trace's are seconds from its
    start); ``Model`` (``ChatGPT``, ``GPT-4``) is the request's model and ``Log Type``
    (``Conversation log``, ``API log``) its category. A row with 0 request or response tokens is a
    failed request (the files without ``_without_fails`` in their names keep them): skipped and
    counted (``meta["skipped"]``, why in ``meta["skipped_why"]``); ``limit`` keeps the first
    requests. Request ids are ``<file stem>-<k>`` (k counted over the requests kept, from 0).
    """
    check_limit(limit)
    p = existing_file(path)
    stem = file_stem(p)
    rows: list[Row] = []
    skipped = 0
    for line, cells, _ in csv_rows(p, _BURSTGPT_COLUMNS, ("Log Type",)):
        if limit is not None and len(rows) >= limit:
            break
        if _zero(cells["Request tokens"]) or _zero(cells["Response tokens"]):
            skipped += 1
            continue
        rows.append(
            Row(
                line=line,
                request_id=f"{stem}-{len(rows)}",
                arrival_time=time_value(p, line, "Timestamp", cells["Timestamp"]),
                num_prompt_tokens=int_value(p, line, "Request tokens", cells["Request tokens"]),
                num_output_tokens=int_value(p, line, "Response tokens", cells["Response tokens"]),
                model=cells["Model"].strip() or None,
                category=(cells.get("Log Type") or "").strip() or None,
            )
        )
    if rows:
        t0 = min(r.arrival_time for r in rows)
        for r in rows:
            r.arrival_time -= t0
    check_span(p, ((r.line, r.arrival_time) for r in rows), "Timestamp")
    models = Counter(r.model for r in rows if r.model)
    meta: dict[str, object] = {
        "source": str(p), "format": "burstgpt", "timed": True, "models": dict(models), "skipped": skipped,
        "skipped_why": BURSTGPT_SKIPPED,
    }  # fmt: skip
    return assemble(name or stem, rows, meta)
