"""The ``step_log`` setting's JSONL writer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["StepLog"]


class StepLog:
    """Buffered JSONL writer for the ``step_log`` setting."""

    def __init__(self, path: str) -> None:
        p = Path(path).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self._fh: IO[str] = p.open("a", encoding="utf-8")
        self._buf: list[str] = []

    def write(self, row: Mapping[str, Any], flush: bool = False) -> None:
        self._buf.append(json.dumps(row, separators=(",", ":")))
        if flush or len(self._buf) >= 256:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._fh.flush()
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        self._fh.close()
