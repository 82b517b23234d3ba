"""Reading workload files: opening them (gzip or not), iterating their CSV or JSON records,
checking each value, and assembling the rows into a :class:`~headway.workload.Workload`; shared by
the trace readers (:mod:`headway.workload._traces`), the text-dataset readers
(:mod:`headway.workload._datasets`) and the JSONL format.

Files ending in ``.gz`` (or starting with the gzip magic bytes) are decompressed transparently. A
malformed line or value raises :class:`~headway.workload.WorkloadFormatError` whose message names
the file, the 1-based line and the field; a missing file raises ``FileNotFoundError`` naming the
path.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from headway.workload._arrivals import MAX_TRACE_SPAN_S, ArrivalProcess, Seed, arrivals_meta
from headway.workload._errors import WorkloadFormatError
from headway.workload._spec import RequestSpec, Workload

__all__ = [
    "MAX_TOKEN_COUNT",
    "PathLike",
    "Row",
    "assemble",
    "check_limit",
    "check_span",
    "csv_rows",
    "existing_file",
    "file_stem",
    "int_value",
    "json_records",
    "jsonl_records",
    "open_text",
    "reading",
    "required_field",
    "text_value",
    "time_value",
]

PathLike = str | Path

MAX_TOKEN_COUNT = 2**31 - 1
"""Largest prompt or output token count a trace may give (as the gateway's ``max_tokens``): a larger
one is a corrupt row, not a request, and would make a simulation run for ever."""

_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------- files
def existing_file(path: PathLike) -> Path:
    """``path``, checked to be a file that exists (else ``FileNotFoundError`` or ``IsADirectoryError`` naming it)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "workload file not found", str(p))
    if p.is_dir():
        raise IsADirectoryError(21, "expected a workload file, got a directory", str(p))
    return p


def open_text(path: PathLike) -> IO[str]:
    """Open a UTF-8 text file for reading, gunzipping it when it is gzip-compressed; a leading byte
    order mark (as Windows tools write UTF-8) is dropped, so a JSON file starts at its ``{`` or ``[``."""
    p = existing_file(path)
    with p.open("rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(p, "rt", encoding="utf-8-sig", newline="")
    return p.open("r", encoding="utf-8-sig", newline="")


@contextlib.contextmanager
def reading(path: Path) -> Iterator[IO[str]]:
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


def file_stem(path: Path) -> str:
    """The file's name without ``.gz`` and its extension: a reader's default workload name and request-id prefix."""
    name = path.name
    if name.endswith(".gz"):
        name = name[:-3]
    return name.rsplit(".", 1)[0] if "." in name else name


# -------------------------------------------------------------------------- values
def int_value(path: Path, line: int, field: str, raw: object) -> int:
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


def time_value(path: Path, line: int, field: str, raw: object) -> float:
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


def check_span(path: Path, times: Iterable[tuple[int, float]], field: str) -> None:
    """Refuse a trace whose arrival times (``(line, time)`` pairs) span more than
    :data:`MAX_TRACE_SPAN_S`, naming the latest row's line and the earliest row's."""
    pairs = list(times)
    if not pairs:
        return
    first_line, first = min(pairs, key=lambda lt: lt[1])
    last_line, last = max(pairs, key=lambda lt: lt[1])
    span = last - first
    if span > MAX_TRACE_SPAN_S:
        raise WorkloadFormatError(
            path,
            last_line,
            f"{span:.3g} s after the earliest request (line {first_line}), more than "
            f"{MAX_TRACE_SPAN_S / 86_400:,.0f} days: not a trace's timestamp",
            field=field,
            show_value=False,
        )


def check_limit(limit: int | None) -> None:
    """Refuse a reader's ``limit`` unless it is None or an integer >= 0."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")


# ----------------------------------------------------------------------------- CSV
def csv_rows(
    path: Path, required: Sequence[str], optional: Sequence[str] = ()
) -> Iterator[tuple[int, dict[str, str], list[str]]]:
    """Yield ``(line, {column: cell}, header)`` for each non-blank data row."""
    with reading(path) as f:
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
def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line, object)`` for each non-blank line of a JSONL file."""
    with reading(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:  # without its line break: a line cut short is an error at its end, not at column 1 of the next
                obj = json.loads(text.rstrip("\r\n"))
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


def required_field(path: Path, line: int, record: dict[str, Any], key: str, where: str = "") -> Any:
    """``record[key]``; a missing key raises :class:`WorkloadFormatError` naming ``<where><key>``."""
    if key not in record:
        raise WorkloadFormatError(path, line, "missing field", field=f"{where}{key}", value=sorted(record))
    return record[key]


def text_value(path: Path, line: int, field: str, value: object) -> str:
    """``value`` if it is a string; otherwise :class:`WorkloadFormatError` naming ``field``."""
    if not isinstance(value, str):
        raise WorkloadFormatError(path, line, "expected a string", field=field, value=value)
    return value


def json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` of a JSON list or of a JSONL file, whichever ``path`` holds."""
    with reading(path) as f:
        head = f.read(4096)
        first = head.lstrip()[:1]
        if first == "[":
            yield from _json_array_records(path, head + f.read())
            return
    yield from jsonl_records(path)


# ----------------------------------------------------------------------- assembly
@dataclass(slots=True)
class Row:
    """One request as a reader parsed it (``line``: where it stands in the file, for errors)."""

    line: int
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    arrival_time: float = 0.0
    prompt: str | None = None
    category: str | None = None
    block_hashes: tuple[int, ...] = ()
    hash_block_size: int = 16
    model: str | None = None


def assemble(
    name: str,
    rows: list[Row],
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
        meta.update(arrivals_meta(arrivals))
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
            model=r.model,
        )
        for r in rows
    ]
    return Workload.from_specs(name, specs, meta)
