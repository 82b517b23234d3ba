"""Child processes that do not outlive the command that started them, and commands that end cleanly on
Ctrl-C or SIGTERM.

:func:`start_group` starts a child as the leader of its own process group (its own session), so that
the whole tree under it is signalled at once: vLLM's API server spawns an ``EngineCore`` process,
which spawns helpers of its own, and a signal to the API server alone can leave them running.
:func:`stop_group` ends that group: SIGTERM, a grace period for the tree to exit, then SIGKILL. A
second Ctrl-C (or SIGTERM) during the grace period kills the group at once and is raised again, so an
impatient user never leaves the group behind.

:func:`run_interruptible` runs a command's body so that SIGTERM unwinds it as Ctrl-C does (the
``finally`` blocks that stop children and keep finished work run), and ends it with one line and
the conventional status: 130 on Ctrl-C, death by SIGTERM on SIGTERM (what a supervisor expects).
``headway``, ``python -m headway.predict`` and the benchmarks that start servers run through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

__all__ = [
    "SigtermRaises",
    "Terminated",
    "die_of_sigterm",
    "group_members",
    "run_interruptible",
    "start_group",
    "stop_group",
]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (:class:`SigtermRaises`) so that a command cleans up and keeps
    what it finished as it does on Ctrl-C (``except KeyboardInterrupt`` catches both)."""


class SigtermRaises:
    """A context in which SIGTERM raises :class:`Terminated` in the main thread of this process (a forked
    child that inherited the handler dies of the signal, as by default); the handler before is put back
    on exit. ``received`` tells afterwards whether SIGTERM came: a library may turn the exception into a
    plain KeyboardInterrupt (Ray's waits do). Outside the main thread nothing changes (Python sets
    handlers there only)."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None
        self._installed = False
        self._pid = os.getpid()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        raise Terminated

    def __enter__(self) -> SigtermRaises:
        if threading.current_thread() is threading.main_thread():
            self._pid = os.getpid()
            self._previous = signal.signal(signal.SIGTERM, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def die_of_sigterm() -> None:
    """End this process by SIGTERM's default action, once the output is flushed (a process killed by a
    signal skips Python's own flush), so that its parent sees what it sent: a supervisor counts a
    process ended by SIGTERM as stopped, and an exit status of 143 as failed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def run_interruptible(body: Callable[[], int], prog: str = "headway") -> int:
    """``body()``'s exit status, with SIGTERM raising :class:`Terminated` meanwhile. On Ctrl-C: the
    line ``PROG: interrupted`` and 130; on SIGTERM: ``PROG: terminated``, then this process ends by
    the signal (its parent sees SIGTERM, a shell 143). No traceback either way: what the command
    kept or said before unwinding is its own to print."""
    sigterm = SigtermRaises()
    try:
        with sigterm:
            return int(body())
    except KeyboardInterrupt:
        if not sigterm.received:
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            return 128 + signal.SIGINT
        print(f"{prog}: terminated", file=sys.stderr, flush=True)
        die_of_sigterm()
        return 128 + signal.SIGTERM  # (where the signal did not end the process)


# ------------------------------------------------------------------ process groups
def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up before any fork: a child between fork and exec should not load libraries


def start_group(
    cmd: Sequence[str],
    *,
    cpus: set[int] | None = None,
    die_with_parent: bool = True,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **popen)`` as the leader of a new session (and process group), which
    :func:`stop_group` ends as a whole. ``cpus``: the CPUs it (and what it starts) may run on.
    ``die_with_parent`` (Linux): the child gets SIGTERM when this process dies without stopping it
    (SIGKILL, the OOM killer), so even then it does not run on unowned; only when started from the
    main thread (the kernel sends the signal when the starting *thread* ends)."""
    parent = os.getpid()
    pdeath = die_with_parent and _PRCTL is not None and threading.current_thread() is threading.main_thread()

    def preexec() -> None:  # in the child, between fork and exec
        if cpus:
            os.sched_setaffinity(0, cpus)
        if pdeath:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(1)

    return subprocess.Popen(
        list(cmd), start_new_session=True, preexec_fn=preexec if (cpus or pdeath) else None, **popen
    )


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``; without ``/proc``, ``[pgid]`` while
    any process of the group exists."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Reap the leader and wait until no process of its group is left; False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()
        if proc.returncode is not None and not group_members(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0, kill_wait_s: float = 10.0) -> int | None:
    """End the process group that ``proc`` leads (started by :func:`start_group`): SIGTERM to every
    process in it, up to ``grace_s`` for all of them to exit (not only the leader: vLLM's EngineCore
    can outlive its API server), then SIGKILL to what is left. A KeyboardInterrupt meanwhile (Ctrl-C
    again, or SIGTERM under :class:`SigtermRaises`) kills the group at once and is raised again once
    the group is gone. Returns the leader's exit status; RuntimeError naming the processes if any
    survives SIGKILL for ``kill_wait_s`` (uninterruptible sleep)."""
    pgid = proc.pid
    interrupted: BaseException | None = None
    try:
        if proc.poll() is None or group_members(pgid):
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
            _wait_group(proc, grace_s)
    except KeyboardInterrupt as exc:
        interrupted = exc
    gone = False
    deadline = time.monotonic() + kill_wait_s
    while not gone:  # not cut short by another interrupt: SIGKILL takes effect at once
        try:
            if group_members(pgid):
                _signal_group(pgid, signal.SIGKILL)
            gone = _wait_group(proc, max(0.0, deadline - time.monotonic()))
            if not gone:
                break
        except KeyboardInterrupt as exc:
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
    if not gone:
        raise RuntimeError(f"process group {pgid} still has {group_members(pgid)} after SIGKILL")
    return proc.returncode
