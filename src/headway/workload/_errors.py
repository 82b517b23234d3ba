"""Errors raised while reading or building workloads."""

from __future__ import annotations

from pathlib import Path

__all__ = ["UnknownWorkloadError", "WorkloadFormatError"]


class WorkloadFormatError(ValueError):
    """A workload file has a malformed line, row or value.

    The message reads ``<path>:<line>: <field>: <reason> (got <value>)``; the parts are
    also kept as attributes so callers can report them their own way. ``line`` is
    1-based (the header of a CSV file is line 1) and ``None`` when the problem is not
    tied to one line (for example a required column missing from the header is line 1).
    """

    def __init__(
        self,
        path: str | Path,
        line: int | None,
        reason: str,
        *,
        field: str | None = None,
        value: object = None,
        show_value: bool = True,
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.value = value
        self.reason = reason
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"{field}: {reason}" if field else reason
        got = f" (got {value!r})" if show_value else ""
        super().__init__(f"{where}: {what}{got}")


class UnknownWorkloadError(ValueError):
    """:func:`headway.workload.load_workload` was given a name it does not know."""
