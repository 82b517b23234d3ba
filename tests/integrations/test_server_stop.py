"""A command interrupted while it runs a local vLLM leaves no process behind.

vLLM's API server spawns an EngineCore process, which ignores SIGTERM while it is being built (vLLM
0.32, ``v1/engine/core.py``, ``run_engine_core``: "only log a message will make engine core process
alive"). A stand-in server does the same without a model: ``start_vllm_server`` runs it as its
``python``; it serves ``/health`` and spawns a grandchild ("engine core"). A parent script, as a
benchmark is, runs it under ``run_interruptible``; the tests interrupt the parent and look for
leftovers of the server's process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headway._proc import group_members
from headway.integrations._server import headway_src_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups read from /proc")

_FAKE_SERVER = r'''
import http.server, os, signal, subprocess, sys, time
mode = os.environ["FAKE_MODE"]
port = int(sys.argv[sys.argv.index("--port") + 1])
engine = subprocess.Popen([sys.executable, "-c",
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an EngineCore being built\n"
    "time.sleep(600)\n"])
if mode == "stubborn-server":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "forwarding":  # as vLLM's API server does once up: it ends its engine core, then itself
    def stop(*_):
        engine.kill()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
with open(os.environ["FAKE_PIDS"], "w") as fh:
    fh.write(f"{os.getpid()} {engine.pid}\n")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''

_PARENT = r'''
import sys, time
from pathlib import Path
from headway._proc import run_interruptible
from headway.integrations._server import start_vllm_server

def main():
    with start_vllm_server(Path(sys.argv[1]), Path(sys.argv[2]), cpus="all", startup_timeout_s=60,
                           stop_grace_s=float(sys.argv[3])):
        print("ready", flush=True)
        time.sleep(600)
    return 0

sys.exit(run_interruptible(main, "fakebench"))
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


class _Run:
    """The parent script, started with a stand-in vLLM of the given mode."""

    def __init__(self, tmp: Path, mode: str, grace_s: float) -> None:
        (tmp / "fake_vllm.py").write_text(_FAKE_SERVER)
        python = tmp / "python"  # what start_vllm_server runs as "python -m vllm.entrypoints..."
        python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp / "fake_vllm.py"} "$@"\n')
        python.chmod(0o755)
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text("{}")
        (tmp / "parent.py").write_text(_PARENT)
        self.pids_file = tmp / "pids"
        env = {**os.environ, "PYTHONPATH": str(headway_src_dir()), "FAKE_MODE": mode, "FAKE_PIDS": str(self.pids_file)}
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp / "parent.py"), str(python), str(tmp / "model"), str(grace_s)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line == "ready\n", (line, self.proc.communicate(timeout=30))
        self.server, self.engine = map(int, self.pids_file.read_text().split())
        assert _alive(self.server) and _alive(self.engine)

    def wait(self, timeout: float) -> tuple[int, str]:
        _, stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, stderr

    def leftovers(self, within_s: float = 5.0) -> list[int]:
        deadline = time.monotonic() + within_s
        while (left := [p for p in (self.server, self.engine) if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pid in (getattr(self, "server", None), getattr(self, "engine", None)):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    runs: list[_Run] = []

    def start(mode: str, grace_s: float = 2.0) -> _Run:
        runs.append(_Run(tmp_path, mode, grace_s))
        return runs[-1]

    yield start
    for r in runs:
        r.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_parent_leaves_neither_the_server_nor_its_engine_core(run, sig: int) -> None:  # type: ignore[no-untyped-def]
    r = run("stubborn-engine", grace_s=2.0)
    r.proc.send_signal(sig)
    rc, stderr = r.wait(timeout=30)
    assert r.leftovers() == [], f"left running after {sig!r}: {r.leftovers()}"
    assert group_members(r.server) == []
    if sig == signal.SIGINT:
        assert rc == 130 and stderr.strip().splitlines() == ["fakebench: interrupted"], (rc, stderr)
    else:  # ended by the signal, as a supervisor expects, after saying so
        assert rc == -signal.SIGTERM and stderr.strip().splitlines() == ["fakebench: terminated"], (rc, stderr)


def test_a_second_ctrl_c_kills_a_server_that_ignores_sigterm_at_once(run) -> None:  # type: ignore[no-untyped-def]
    r = run("stubborn-server", grace_s=60.0)
    start = time.monotonic()
    r.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # in the grace period: the server ignored SIGTERM
    assert r.proc.poll() is None and _alive(r.server)
    r.proc.send_signal(signal.SIGINT)  # the impatient user's second Ctrl-C
    rc, stderr = r.wait(timeout=30)
    assert time.monotonic() - start < 15, "the second Ctrl-C did not cut the grace period short"
    assert r.leftovers() == [], "the second Ctrl-C left the server's processes running"
    assert rc == 130 and "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "fakebench: interrupted"


def test_a_parent_killed_outright_takes_the_server_with_it(run) -> None:  # type: ignore[no-untyped-def]
    r = run("forwarding", grace_s=2.0)
    r.proc.kill()  # SIGKILL (or the OOM killer): no cleanup runs in the parent
    r.proc.communicate(timeout=30)
    assert r.leftovers(within_s=10) == [], "the server outlived the parent that started it"
