"""Readers for public LLM request traces and prompt datasets.

Each reader returns a :class:`~headway.workload.Workload`. Files ending in ``.gz`` (or
starting with the gzip magic bytes) are decompressed transparently. A malformed line or
value raises :class:`~headway.workload.WorkloadFormatError` whose message names the
file, the 1-based line and the field; a missing file raises ``FileNotFoundError`` naming
the path.

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
- ShareGPT: the JSON list of ``{"id", "conversations": [{"from", "value"}, ...]}``
  (first ``human`` turn is the prompt, the ``gpt`` turn right after it the response),
  or JSONL with one such record, or one ``{"id", "prompt", "response"}`` record, per
  line (``sharegpt_first_turn.jsonl.gz``).
- alpaca_eval: ``instructions.jsonl`` (idx, dataset, instruction) plus
  ``output_lengths_long.csv.gz`` (model, idx, chars, words, cl100k_tokens); one model's
  ``cl100k_tokens`` are the output lengths.
- alpaca_eval model outputs, as the alpaca_eval leaderboard publishes them
  (``results/<model>/model_outputs.json``): a JSON list (or JSONL) of
  ``{"instruction", "output", "generator", "dataset"}``; the output's token count is the
  output length.

Text datasets have no token counts of their own model; lengths come from a
``count_tokens`` callable. The default, :func:`approx_token_count`, is an
*approximation* (``ceil(len(text) / 4)``, about 4 characters per token for English
BPE vocabularies), not a tokenizer. When ``count_tokens`` is left as ``None`` and a
record carries recorded counts (``prompt_tokens``/``response_tokens`` in the shared
ShareGPT first-turn file, ``instruction_cl100k_tokens`` in alpaca_eval; cl100k_base
counts), those are used instead.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any

from headway.workload._arrivals import ArrivalProcess, BurstArrivals, Seed
from headway.workload._errors import WorkloadFormatError
from headway.workload._spec import RequestSpec, Workload

__all__ = [
    "TokenCounter",
    "approx_token_count",
    "open_text",
    "read_alpaca_eval",
    "read_alpaca_eval_outputs",
    "read_azure_trace",
    "read_mooncake_trace",
    "read_sharegpt",
    "read_vidur_trace",
]

TokenCounter = Callable[[str], int]
"""Maps a text to its number of tokens."""

PathLike = str | Path

MAX_TOKEN_COUNT = 2**31 - 1
"""Largest prompt or output token count a trace may give (as the gateway's ``max_tokens``): a larger
one is a corrupt row, not a request, and would make a simulation run for ever."""

MAX_TRACE_SPAN_S = 10 * 366 * 86_400.0
"""Longest span of arrival times a timed trace may have (about ten years): a longer one holds a
corrupt timestamp, and would put a request ages after the others."""

_GZIP_MAGIC = b"\x1f\x8b"


def approx_token_count(text: str) -> int:
    """Approximate token count: ``ceil(len(text) / 4)``.

    An approximation (about 4 characters per token for English text with GPT/Llama
    BPE vocabularies), not a tokenizer; pass a real tokenizer's ``len(encode(text))``
    as ``count_tokens`` when exact counts matter.
    """
    return math.ceil(len(text) / 4)


# --------------------------------------------------------------------------- files
def _existing(path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "workload file not found", str(p))
    if p.is_dir():
        raise IsADirectoryError(21, "expected a workload file, got a directory", str(p))
    return p


def open_text(path: PathLike) -> IO[str]:
    """Open a UTF-8 text file for reading, gunzipping it when it is gzip-compressed."""
    p = _existing(path)
    with p.open("rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(p, "rt", encoding="utf-8", newline="")
    return p.open("r", encoding="utf-8", newline="")


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[IO[str]]:
    """Open ``path`` and turn decoding failures into :class:`WorkloadFormatError`."""
    f = open_text(path)
    try:
        yield f
    except UnicodeDecodeError as exc:
        raise WorkloadFormatError(path, None, f"not UTF-8 text ({exc.reason})", show_value=False) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise WorkloadFormatError(path, None, f"corrupt gzip data ({exc})", show_value=False) from None
    finally:
        f.close()


def _stem(path: Path) -> str:
    name = path.name
    if name.endswith(".gz"):
        name = name[:-3]
    return name.rsplit(".", 1)[0] if "." in name else name


# -------------------------------------------------------------------------- values
def _int_value(path: Path, line: int, field: str, raw: object) -> int:
    """A positive integer token count from a CSV cell or JSON value."""
    value: int | None = None
    if isinstance(raw, bool):
        value = None
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        value = int(raw) if raw.is_integer() else None
    elif isinstance(raw, str):
        s = raw.strip()
        try:
            value = int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                f = math.nan
            value = int(f) if f.is_integer() else None
    if value is None:
        raise WorkloadFormatError(path, line, "expected an integer token count", field=field, value=raw)
    if value <= 0:
        raise WorkloadFormatError(path, line, "token count must be > 0", field=field, value=value)
    if value > MAX_TOKEN_COUNT:
        raise WorkloadFormatError(
            path, line, f"token count must be at most {MAX_TOKEN_COUNT:,} (no real request)", field=field, value=value
        )
    return value


def _time_value(path: Path, line: int, field: str, raw: object) -> float:
    """A finite, non-negative time from a CSV cell or JSON value."""
    t: float
    if isinstance(raw, bool):
        t = math.nan
        ok = False
    elif isinstance(raw, int | float):
        t, ok = float(raw), True
    elif isinstance(raw, str):
        try:
            t, ok = float(raw.strip()), True
        except ValueError:
            t, ok = math.nan, False
    else:
        t, ok = math.nan, False
    if not ok:
        raise WorkloadFormatError(path, line, "expected a number", field=field, value=raw)
    if not math.isfinite(t):
        raise WorkloadFormatError(path, line, "time must be finite", field=field, value=raw)
    if t < 0.0:
        raise WorkloadFormatError(path, line, "time must be >= 0", field=field, value=raw)
    return t


def _check_span(path: Path, rows: list[_Row], field: str) -> None:
    """Refuse a trace whose arrival times span more than :data:`MAX_TRACE_SPAN_S`,
    naming the latest row's line and the earliest row's."""
    if not rows:
        return
    first = min(rows, key=lambda r: r.arrival_time)
    last = max(rows, key=lambda r: r.arrival_time)
    span = last.arrival_time - first.arrival_time
    if span > MAX_TRACE_SPAN_S:
        raise WorkloadFormatError(
            path,
            last.line,
            f"{span:.3g} s after the earliest request (line {first.line}), more than "
            f"{MAX_TRACE_SPAN_S / 86_400:,.0f} days: not a trace's timestamp",
            field=field,
            show_value=False,
        )


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")


# ----------------------------------------------------------------------------- CSV
def _csv_rows(
    path: Path, required: Sequence[str], optional: Sequence[str] = ()
) -> Iterator[tuple[int, dict[str, str], list[str]]]:
    """Yield ``(line, {column: cell}, header)`` for each non-blank data row."""
    with _reading(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                raise WorkloadFormatError(
                    path,
                    1,
                    f"empty file; expected a header with columns {', '.join(required)}",
                    show_value=False,
                )
            header = [h.strip().lstrip("\ufeff") for h in header]
            missing = [c for c in required if c not in header]
            if missing:
                raise WorkloadFormatError(
                    path, 1, f"missing column(s) {', '.join(missing)}", field="header", value=",".join(header)
                )
            index = {c: header.index(c) for c in (*required, *optional) if c in header}
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise WorkloadFormatError(
                        path,
                        line,
                        f"expected {len(header)} fields, got {len(row)}",
                        field="row",
                        value=",".join(row),
                    )
                yield line, {c: row[i] for c, i in index.items()}, header
        except csv.Error as exc:
            raise WorkloadFormatError(path, reader.line_num, f"malformed CSV ({exc})", show_value=False) from None


# ---------------------------------------------------------------------------- JSON
def _jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line, object)`` for each non-blank line of a JSONL file."""
    with _reading(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise WorkloadFormatError(
                    path, line, f"invalid JSON ({exc.msg}; column {exc.colno})", show_value=False
                ) from None
            if not isinstance(obj, dict):
                raise WorkloadFormatError(path, line, "expected a JSON object", field="record", value=obj)
            yield line, obj


_WS = re.compile(r"\s*")


def _json_array_records(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, element)`` for each element of a top-level JSON array."""
    decoder = json.JSONDecoder()
    line, counted = 1, 0

    def line_at(pos: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, pos)
        counted = pos
        return line

    def fail(pos: int, reason: str) -> WorkloadFormatError:
        return WorkloadFormatError(path, line_at(pos), reason, show_value=False)

    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", pos):
        raise fail(pos, "expected a JSON array ('[')")
    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
    if text.startswith("]", pos):
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise WorkloadFormatError(
                path, exc.lineno, f"invalid JSON ({exc.msg}; column {exc.colno})", show_value=False
            ) from None
        yield line_at(pos), obj
        pos = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", pos):
            if text[pos + 1 :].strip():
                raise fail(pos + 1, "unexpected data after the JSON array")
            return
        else:
            raise fail(pos, "expected ',' or ']' between array elements (truncated file?)")


# ----------------------------------------------------------------------- assembly
@dataclass(slots=True)
class _Row:
    line: int
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    arrival_time: float = 0.0
    prompt: str | None = None
    category: str | None = None
    block_hashes: tuple[int, ...] = ()
    hash_block_size: int = 16


def _assemble(
    name: str,
    rows: list[_Row],
    meta: dict[str, object],
    *,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
) -> Workload:
    """Build the workload; ``arrivals`` (when given) replaces the rows' times in file order."""
    if arrivals is not None:
        times = arrivals.sample(len(rows), seed)
        for row, t in zip(rows, times, strict=True):
            row.arrival_time = float(t)
        meta["arrivals"] = repr(arrivals)
    specs = [
        RequestSpec(
            request_id=r.request_id,
            arrival_time=r.arrival_time,
            num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=r.num_output_tokens,
            prompt=r.prompt,
            category=r.category,
            block_hashes=r.block_hashes,
            hash_block_size=r.hash_block_size,
        )
        for r in rows
    ]
    return Workload.from_specs(name, specs, meta)


def _count(count_tokens: TokenCounter, text: str) -> int:
    n = count_tokens(text)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"count_tokens must return a non-negative int, got {n!r}")
    return n


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
    _check_limit(limit)
    p = _existing(path)
    stem = _stem(p)
    raw: list[tuple[_Row, int, float]] = []
    for line, cells, _ in _csv_rows(p, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        if limit is not None and len(raw) >= limit:
            break
        whole, frac = _azure_timestamp(p, line, cells["TIMESTAMP"])
        row = _Row(
            line=line,
            request_id=f"{stem}-{len(raw)}",
            num_prompt_tokens=_int_value(p, line, "ContextTokens", cells["ContextTokens"]),
            num_output_tokens=_int_value(p, line, "GeneratedTokens", cells["GeneratedTokens"]),
        )
        raw.append((row, whole, frac))
    if raw:
        w0, f0 = min((w, f) for _, w, f in raw)
        for row, w, f in raw:
            row.arrival_time = max(0.0, (w - w0) + (f - f0))
    rows = [r for r, _, _ in raw]
    _check_span(p, rows, "TIMESTAMP")
    meta: dict[str, object] = {"source": str(p), "format": "azure", "timed": True}
    return _assemble(name or stem, rows, meta)


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
    _check_limit(limit)
    p = _existing(path)
    stem = _stem(p)
    rows: list[_Row] = []
    timed = False
    for line, cells, header in _csv_rows(p, ("num_prefill_tokens", "num_decode_tokens"), ("arrived_at",)):
        if limit is not None and len(rows) >= limit:
            break
        timed = "arrived_at" in header
        t = _time_value(p, line, "arrived_at", cells["arrived_at"]) if timed and arrivals is None else 0.0
        rows.append(
            _Row(
                line=line,
                request_id=f"{stem}-{len(rows)}",
                arrival_time=t,
                num_prompt_tokens=_int_value(p, line, "num_prefill_tokens", cells["num_prefill_tokens"]),
                num_output_tokens=_int_value(p, line, "num_decode_tokens", cells["num_decode_tokens"]),
            )
        )
    if not timed and arrivals is None:
        arrivals = BurstArrivals()
    if arrivals is None:
        _check_span(p, rows, "arrived_at")
    meta: dict[str, object] = {"source": str(p), "format": "vidur", "timed": timed and arrivals is None}
    return _assemble(name or stem, rows, meta, arrivals=arrivals, seed=seed)


# ----------------------------------------------------------------------- Mooncake
def _field(path: Path, line: int, record: dict[str, Any], key: str, where: str = "") -> Any:
    if key not in record:
        raise WorkloadFormatError(path, line, "missing field", field=f"{where}{key}", value=sorted(record))
    return record[key]


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
    _check_limit(limit)
    p = _existing(path)
    stem = _stem(p)
    rows: list[_Row] = []
    for line, rec in _jsonl_records(p):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(
            _Row(
                line=line,
                request_id=f"{stem}-{len(rows)}",
                arrival_time=_time_value(p, line, "timestamp", _field(p, line, rec, "timestamp")),
                num_prompt_tokens=_int_value(p, line, "input_length", _field(p, line, rec, "input_length")),
                num_output_tokens=_int_value(p, line, "output_length", _field(p, line, rec, "output_length")),
                block_hashes=_hash_ids(p, line, rec.get("hash_ids")),
                hash_block_size=MOONCAKE_BLOCK_SIZE,
            )
        )
    if rows:  # milliseconds -> seconds since the earliest request
        t0 = min(r.arrival_time for r in rows)
        for r in rows:
            r.arrival_time = (r.arrival_time - t0) / 1000.0
    _check_span(p, rows, "timestamp")
    meta: dict[str, object] = {"source": str(p), "format": "mooncake", "timed": True}
    return _assemble(name or stem, rows, meta)


# ----------------------------------------------------------------------- ShareGPT
_PROMPT_ROLES = frozenset({"human", "user"})
_RESPONSE_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing"})


def _text(path: Path, line: int, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise WorkloadFormatError(path, line, "expected a string", field=field, value=value)
    return value


def _first_turn(path: Path, line: int, rec: Any) -> tuple[str, str, int | None, int | None] | None:
    """``(prompt, response, recorded prompt tokens, recorded response tokens)`` or None."""
    if not isinstance(rec, dict):
        raise WorkloadFormatError(path, line, "expected a JSON object", field="record", value=rec)
    if "conversations" in rec:
        turns = rec["conversations"]
        if not isinstance(turns, list):
            raise WorkloadFormatError(path, line, "expected a list of turns", field="conversations", value=turns)
        roles: list[str] = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise WorkloadFormatError(path, line, "expected an object", field=f"conversations[{k}]", value=turn)
            where = f"conversations[{k}]."
            roles.append(_text(path, line, f"{where}from", _field(path, line, turn, "from", where)))
            _text(path, line, f"{where}value", _field(path, line, turn, "value", where))
        for k, role in enumerate(roles):
            if role in _PROMPT_ROLES:
                if k + 1 < len(turns) and roles[k + 1] in _RESPONSE_ROLES:
                    return turns[k]["value"], turns[k + 1]["value"], None, None
                return None
        return None
    prompt = _text(path, line, "prompt", _field(path, line, rec, "prompt"))
    response = _text(path, line, "response", _field(path, line, rec, "response"))
    recorded: list[int | None] = []
    for key in ("prompt_tokens", "response_tokens"):
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise WorkloadFormatError(path, line, "expected a non-negative integer", field=key, value=v)
        recorded.append(v)
    return prompt, response, recorded[0], recorded[1]


def _json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` of a JSON list or of a JSONL file, whichever ``path`` holds."""
    with _reading(path) as f:
        head = f.read(4096)
        first = head.lstrip()[:1]
        if first == "[":
            yield from _json_array_records(path, head + f.read())
            return
    yield from _jsonl_records(path)


def read_sharegpt(
    path: PathLike,
    *,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """Read ShareGPT conversations (JSON list or JSONL) or first-turn records (JSONL).

    Each record gives one request: its first ``human`` turn is the prompt and the
    ``gpt`` turn right after it the response, whose token count is the output length.
    Records with no such pair, or whose prompt or response counts 0 tokens, are skipped
    (``meta["skipped"]``). Token counts come from ``count_tokens`` (see the module doc
    for the default). ShareGPT has no times: ``arrivals`` assigns them in file order,
    default a burst at t = 0. Request ids are the records' ``id`` (``@<line>`` appended
    to a repeated id).
    """
    _check_limit(limit)
    p = _existing(path)
    counter = count_tokens or approx_token_count
    rows: list[_Row] = []
    seen: set[str] = set()
    skipped = 0
    for line, rec in _json_records(p):
        if limit is not None and len(rows) >= limit:
            break
        pair = _first_turn(p, line, rec)
        if pair is None:
            skipped += 1
            continue
        prompt, response, rec_p, rec_o = pair
        n_prompt = rec_p if count_tokens is None and rec_p is not None else _count(counter, prompt)
        n_output = rec_o if count_tokens is None and rec_o is not None else _count(counter, response)
        if n_prompt <= 0 or n_output <= 0:
            skipped += 1
            continue
        rid = str(rec.get("id", f"sharegpt-{len(rows)}"))
        if rid in seen:
            rid = f"{rid}@{line}"
        seen.add(rid)
        rows.append(_Row(line, rid, n_prompt, n_output, prompt=prompt))
    meta: dict[str, object] = {"source": str(p), "format": "sharegpt", "timed": False, "skipped": skipped}
    return _assemble(name or _stem(p), rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)


# --------------------------------------------------------------------- alpaca_eval
def _alpaca_lengths(path: Path, model: str) -> dict[int, tuple[int, int]]:
    """``{idx: (cl100k_tokens, line)}`` for ``model``; error listing close names if absent."""
    lengths: dict[int, tuple[int, int]] = {}
    models: set[str] = set()
    for line, cells, _ in _csv_rows(path, ("model", "idx", "cl100k_tokens")):
        m = cells["model"]
        if m != model:
            models.add(m)
            continue
        idx_raw = cells["idx"].strip()
        if not idx_raw.isdigit():
            raise WorkloadFormatError(path, line, "expected a non-negative integer", field="idx", value=idx_raw)
        idx = int(idx_raw)
        if idx in lengths:
            raise WorkloadFormatError(
                path,
                line,
                f"duplicate row for model {model!r} (first on line {lengths[idx][1]})",
                field="idx",
                value=idx,
            )
        lengths[idx] = (_int_value(path, line, "cl100k_tokens", cells["cl100k_tokens"]), line)
    if not lengths:
        import difflib

        by_lower = {m.lower(): m for m in sorted(models)}
        matches = difflib.get_close_matches(model.lower(), list(by_lower), n=8, cutoff=0.4)
        close = [by_lower[m] for m in matches]
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ValueError(f"{path}: no rows for model {model!r} ({len(models)} models in the file{hint})")
    return lengths


def read_alpaca_eval(
    instructions: PathLike,
    lengths: PathLike,
    model: str,
    *,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """alpaca_eval instructions answered by ``model``: prompt text plus that model's output length.

    ``instructions`` is ``instructions.jsonl`` (idx, dataset, instruction);
    ``lengths`` is ``output_lengths_long.csv[.gz]`` (model, idx, chars, words,
    cl100k_tokens): the output length is the model's ``cl100k_tokens``. Prompt tokens
    come from ``count_tokens`` (default: ``instruction_cl100k_tokens`` when present,
    else :func:`approx_token_count`). ``category`` is the instruction's dataset.
    Instructions the model has no length for are skipped (``meta["skipped"]``). No
    times: ``arrivals`` assigns them in file order, default a burst at t = 0.
    """
    _check_limit(limit)
    ip, lp = _existing(instructions), _existing(lengths)
    by_idx = _alpaca_lengths(lp, model)
    counter = count_tokens or approx_token_count
    rows: list[_Row] = []
    seen: dict[int, int] = {}
    skipped = 0
    for line, rec in _jsonl_records(ip):
        if limit is not None and len(rows) >= limit:
            break
        idx = _field(ip, line, rec, "idx")
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise WorkloadFormatError(ip, line, "expected a non-negative integer", field="idx", value=idx)
        if idx in seen:
            raise WorkloadFormatError(ip, line, f"duplicate idx (first on line {seen[idx]})", field="idx", value=idx)
        seen[idx] = line
        text = _text(ip, line, "instruction", _field(ip, line, rec, "instruction"))
        dataset = rec.get("dataset")
        recorded = rec.get("instruction_cl100k_tokens")
        if count_tokens is None and isinstance(recorded, int) and not isinstance(recorded, bool):
            n_prompt = recorded
        else:
            n_prompt = _count(counter, text)
        if idx not in by_idx or n_prompt <= 0:
            skipped += 1
            continue
        rows.append(
            _Row(
                line=line,
                request_id=f"alpaca-{idx}",
                num_prompt_tokens=n_prompt,
                num_output_tokens=by_idx[idx][0],
                prompt=text,
                category=str(dataset) if dataset is not None else None,
            )
        )
    meta: dict[str, object] = {
        "source": str(ip),
        "lengths": str(lp),
        "format": "alpaca-eval",
        "timed": False,
        "model": model,
        "skipped": skipped,
    }
    return _assemble(name or f"alpaca-eval:{model}", rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)


def _generator_error(path: Path, model: str | None, generators: set[str]) -> ValueError:
    import difflib

    names = sorted(generators)
    if model is None:
        return ValueError(
            f"{path}: outputs of {len(names)} generators ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''});"
            " pick one with model= (--model)"
        )
    close = difflib.get_close_matches(model, names, n=8, cutoff=0.4)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return ValueError(f"{path}: no outputs of generator {model!r} ({len(names)} generators in the file{hint})")


def read_alpaca_eval_outputs(
    path: PathLike,
    *,
    model: str | None = None,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """alpaca_eval model outputs as the leaderboard publishes them (``model_outputs.json``).

    A JSON list, or JSONL, of ``{"instruction", "output", "generator", "dataset"}``: the
    instruction is the prompt and the output's token count (``count_tokens``, default
    :func:`approx_token_count`) the output length; ``category`` is the dataset. ``model``
    keeps one generator's outputs; without it the file must hold a single generator.
    Records whose instruction or output counts 0 tokens are skipped (``meta["skipped"]``).
    No times: ``arrivals`` assigns them in file order, default a burst at t = 0.
    """
    _check_limit(limit)
    p = _existing(path)
    counter = count_tokens or approx_token_count
    rows: list[_Row] = []
    generators: set[str] = set()
    skipped = 0
    for line, rec in _json_records(p):
        if limit is not None and len(rows) >= limit:
            break
        if not isinstance(rec, dict):
            raise WorkloadFormatError(p, line, "expected a JSON object", field="record", value=rec)
        gen = rec.get("generator")
        if gen is not None:
            gen = _text(p, line, "generator", gen)
            generators.add(gen)
        if model is not None and gen != model:
            continue
        prompt = _text(p, line, "instruction", _field(p, line, rec, "instruction"))
        output = _text(p, line, "output", _field(p, line, rec, "output"))
        n_prompt, n_output = _count(counter, prompt), _count(counter, output)
        if n_prompt <= 0 or n_output <= 0:
            skipped += 1
            continue
        dataset = rec.get("dataset")
        rows.append(
            _Row(
                line,
                f"{_stem(p)}-{len(rows)}",
                n_prompt,
                n_output,
                prompt=prompt,
                category=str(dataset) if dataset is not None else None,
            )
        )
    if (model is not None and not rows and not skipped) or (model is None and len(generators) > 1):
        raise _generator_error(p, model, generators)
    meta: dict[str, object] = {
        "source": str(p),
        "format": "alpaca-eval-outputs",
        "timed": False,
        "model": model if model is not None else next(iter(generators), None),
        "skipped": skipped,
    }
    return _assemble(name or _stem(p), rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)
