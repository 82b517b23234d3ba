"""Result files written whole or not at all.

A file is written under a temporary name beside it and renamed over its path once complete
(``os.replace``, atomic on one file system). A run interrupted while writing (Ctrl-C, SIGTERM, an
error) leaves the file as it was before, an earlier good result included, never cut off mid-row;
the temporary file is removed. A figure (:func:`save_figure`) is rendered in memory, then written so.
A report of several files (:func:`staged_dir`) is written into a temporary folder and moved into
place file by file only once all of them are written, with Ctrl-C and SIGTERM held back meanwhile,
so an interrupted run leaves the earlier report whole, not a mix.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["replacing", "save_figure", "staged_dir", "write_atomic"]


@contextlib.contextmanager
def replacing(path: str | Path, mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` for writing a whole file: the data goes to ``.NAME.PID.tmp`` in the same
    folder, renamed to ``path`` when the block ends without an exception and removed when it does
    not (KeyboardInterrupt included). ``mode``: ``"w"`` or ``"wb"``. The folder must exist. The data
    reaches the disk (``fsync``) before the rename, and the rename before this returns (the folder
    synced where the file system can), so a machine that loses power keeps the old file or the new
    one, not an empty one."""
    if mode not in ("w", "wb"):
        raise ValueError(f"replacing() writes whole files: mode 'w' or 'wb', not {mode!r}")
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **open_kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        _sync_folder(target.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX: fsync the folder; a file system or OS that cannot
    open or sync a folder is left to its own guarantees)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` (text or bytes) to ``path`` whole or not at all (:func:`replacing`)."""
    if isinstance(data, bytes):
        with replacing(path, "wb") as fh:
            fh.write(data)
    else:
        with replacing(path, "w", encoding=encoding) as fh:
            fh.write(data)
    return Path(path)


def save_figure(fig: Figure, path: str | Path, **savefig_kwargs: Any) -> Path:
    """``fig.savefig(path, **savefig_kwargs)`` whole or not at all: the figure is rendered in memory, in
    the format of ``path``'s suffix unless ``format`` is given, and written by :func:`write_atomic`, so
    an interrupt or an error while drawing leaves the earlier file as it was. The folder must exist."""
    target = Path(path)
    fmt = savefig_kwargs.pop("format", None) or target.suffix.removeprefix(".").lower()
    if not fmt:
        raise ValueError(f"{target}: no suffix to tell the figure's format (.png, .svg, .pdf): add one or pass format")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, **savefig_kwargs)
    return write_atomic(target, buf.getvalue())


@contextlib.contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """A temporary folder inside ``out`` (created) to write a report's files into. When the block ends
    without an exception they are moved into ``out``, each replacing its namesake there, with SIGINT
    and SIGTERM blocked for the moves (in the main thread: a signal then comes once all are in place);
    the temporary folder is removed either way. Only the folder's top-level files are moved."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stage = folder / f".staging.{os.getpid()}.tmp"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        files = sorted(p for p in stage.iterdir() if p.is_file())
        hold = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if hold else None
        try:
            for f in files:
                os.replace(f, folder / f.name)
        finally:
            if before is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
