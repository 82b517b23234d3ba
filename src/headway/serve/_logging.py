"""Log output of ``headway serve``: text lines, or one JSON object per line (``--log-format json``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from datetime import UTC, datetime

__all__ = ["FailureLog", "JsonFormatter", "LimitedWarnings", "TextFormatter", "setup_logging"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that would end a text log line or rewrite a terminal (a tab is left as it is)."""
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


class TextFormatter(logging.Formatter):
    """The text format, each record's message on its one line: a newline, carriage return or escape
    sequence in it (a client's text quoted by an error message: a prompt in a scorer's exception) is
    written escaped (``\\n``, ``\\x1b``), so that no client can forge a log line, as the JSON format's
    quoting ensures. A traceback still follows on its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        if not _CONTROL.search(message):
            return super().formatMessage(record)
        record.message = _CONTROL.sub(_escaped, message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"}`` (and ``"exception"`` with a traceback), one per line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


_CHATTY = ("httpx", "httpcore")
"""Client libraries that log every request at INFO: the backends' /metrics polls, twice a second a
backend by default. Their warnings and errors still show; ``debug`` shows everything."""


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger: ``fmt`` ``"text"`` or ``"json"``."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)


class LimitedWarnings:
    """Warnings to ``logger`` at most once per ``every_s`` per kind, each with the count of those
    left out since the last one (a failing scorer or Redis must not flood the log). A kind's warnings
    left out are not lost when no more of that kind come: in an event loop, ``every_s`` after the last
    one logged, the latest of them is written with the count of the others; without one, at the next
    warning of the kind; :meth:`flush` (at shutdown) writes what is left."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self._log = logger
        self._every_s = every_s
        self._marks: dict[str, tuple[float, int]] = {}
        """kind -> (time of its latest warning logged, warnings left out since)."""
        self._held: dict[str, tuple[str, tuple[object, ...]]] = {}
        """kind -> its latest warning left out (written by its timer or :meth:`flush`)."""
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def __call__(self, what: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last, skipped = self._marks.get(what, (-math.inf, 0))
        if now - last < self._every_s:
            self._marks[what] = (last, skipped + 1)
            self._held[what] = (msg, args)
            if what not in self._timers:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # (no loop: at the next warning of the kind, or flush)
                self._timers[what] = loop.call_later(last + self._every_s - now, self._write_held, what)
            return
        self._held.pop(what, None)  # counted in this one's line
        if (timer := self._timers.pop(what, None)) is not None:
            timer.cancel()
        self._marks[what] = (now, 0)
        self._log.warning(msg + (f" ({skipped} more like it not logged)" if skipped else ""), *args)

    def _write_held(self, what: str) -> None:
        """Write the latest warning of ``what`` left out, with the count of the others."""
        if (timer := self._timers.pop(what, None)) is not None:
            timer.cancel()
        held = self._held.pop(what, None)
        if held is None:
            return
        msg, args = held
        skipped = self._marks[what][1] - 1
        self._marks[what] = (time.monotonic(), 0)
        self._log.warning(msg + (f" ({skipped} more like it not logged)" if skipped else ""), *args)

    def flush(self) -> None:
        """Write every kind's latest warning left out (with the count of the others), if any."""
        for what in list(self._held):
            self._write_held(what)


class FailureLog:
    """Per-request failures (or other events: ``what`` they are, logged at ``level``) in the log
    without flooding it: the first failure of each kind is logged in full; more of that kind are
    counted, and one summary line, at most every ``every_s`` seconds, says how many of each kind
    were not logged one by one. A kind quiet for ``every_s`` is logged in full again at its next
    failure (a new outage). The log is all this limits: the Prometheus counters count every failure.
    In an event loop the summary is written ``every_s`` after the last one even when no failure
    follows; without one, at the next failure; :meth:`flush` (at shutdown) writes what is left."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = 5.0,
        level: int = logging.WARNING,
        what: tuple[str, str] = ("request failure", "request failures"),
    ) -> None:
        self._log = logger
        self._every_s = every_s
        self._level = level
        self._what = what
        """What a summary line counts: singular, plural."""
        self._last: dict[str, float] = {}
        """kind -> time of its latest failure (of one logged in full, or counted)."""
        self._left: dict[str, int] = {}
        """kind -> failures counted, not logged, since the last summary."""
        self._summary_at = -math.inf
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        self._last[kind] = now
        if last is None or now - last >= self._every_s:
            self._log.log(self._level, msg, *args)
            if not self._left:  # nothing owed: the next summary covers from here
                self._summary_at = max(self._summary_at, now)
            return
        self._left[kind] = self._left.get(kind, 0) + 1
        due = self._summary_at + self._every_s
        if now >= due:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # (no loop: at the next failure, or flush)
            self._timer = loop.call_later(due - now, self.flush)

    def flush(self) -> None:
        """Write the summary of the failures not logged one by one, if any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._left:
            return
        now = time.monotonic()
        since = now - self._summary_at
        counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(self._left.items()))
        total = sum(self._left.values())
        self._log.log(
            self._level, "%d more %s in the last %.0f s, not logged one by one (%s)",
            total, self._what[total != 1], since, counts,
        )  # fmt: skip
        self._left.clear()
        self._summary_at = now
