"""Log output of ``headway serve``: text lines, or one JSON object per line (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

__all__ = ["JsonFormatter", "LimitedWarnings", "setup_logging"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)


class LimitedWarnings:
    """Warnings to ``logger`` at most once per ``every_s`` per kind, each with the count of those
    left out since the last one (a failing scorer or Redis must not flood the log)."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self._log = logger
        self._every_s = every_s
        self._marks: dict[str, tuple[float, int]] = {}

    def __call__(self, what: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last, skipped = self._marks.get(what, (-1e9, 0))
        if now - last < self._every_s:
            self._marks[what] = (last, skipped + 1)
            return
        self._marks[what] = (now, 0)
        self._log.warning(msg + (f" ({skipped} more like it not logged)" if skipped else ""), *args)
