"""Real processes on loopback for scale and fault tests: redis-server, stub backends and
gateway replicas (``python -m headway.serve ...``), each killable and restartable.

Used by ``tests/scale`` and the gateway benchmarks; everything binds 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

from headway._proc import start_group, stop_group
from headway.serve._runner import free_port

__all__ = ["Cluster", "Proc", "RedisProc", "wait_for", "wait_port"]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition", step: float = 0.02) -> None:
    """Poll ``cond`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process on port {port} exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s") from None
            time.sleep(0.03)


class Proc:
    """A child process serving HTTP on ``port``; restartable with the same arguments."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path, health: str | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.log_path = log_path
        self.health = health
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: TextIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> Proc:
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # its own process group, ended as a whole by stop() (and SIGTERMed if this process dies first)
        self.proc = start_group(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        wait_port(self.port, timeout, self.proc)
        if self.health is not None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if httpx.get(self.url + self.health, timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} did not become healthy (log: {self.log_path})")
                time.sleep(0.05)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all (a crash)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                # no SIGCONT first, even if it was paused: SIGKILL ends a stopped process as it is,
                # where a SIGCONT would let it run for a moment (and, say, dispatch a grant it holds)
                self.proc.kill()
            self.proc.wait(timeout=10)
        self._close_log()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM to its process group (continued first, if paused), up to ``timeout`` seconds, then
        SIGKILL (at once on a second Ctrl-C: :func:`headway._proc.stop_group`); returns the exit status."""
        if self.proc is None:
            return None
        try:
            stop_group(self.proc, grace_s=timeout)
        finally:
            self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class RedisProc(Proc):
    """A private redis-server in ``directory`` (AOF on, fsync always, when ``appendonly``)."""

    def __init__(self, directory: Path, port: int, appendonly: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found (apt-get install -y redis-server)")
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
                "--appendonly", "yes" if appendonly else "no", "--appendfsync", "always",
                "--protected-mode", "yes"]  # fmt: skip
        super().__init__("redis", argv, port, directory / "redis.log")

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url)

    def restart(self, down_s: float = 0.0) -> None:
        """Kill -9 and start again on the same port and directory (AOF replayed)."""
        self.kill()
        if down_s:
            time.sleep(down_s)
        self.start()
        # AOF loading answers LOADING errors for a moment
        deadline = time.monotonic() + 15
        while True:
            try:
                self.client().ping()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class Cluster:
    """Processes started under ``directory``; :meth:`close` stops them all."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: list[Proc] = []

    def redis(self, appendonly: bool = True) -> RedisProc:
        d = self.dir / f"redis-{len(self.procs)}"
        d.mkdir(parents=True, exist_ok=True)
        p = RedisProc(d, free_port(), appendonly)
        self.procs.append(p)
        p.start()
        return p

    def stub(
        self,
        token_delay_s: float = 0.0,
        max_num_seqs: int = 0,
        port: int | None = None,
        first_token_delay_s: float = 0.0,
    ) -> Proc:
        port = port or free_port()
        argv = [sys.executable, "-m", "headway.serve", "stub", "--port", str(port),
                "--token-delay", str(token_delay_s), "--max-num-seqs", str(max_num_seqs),
                "--first-token-delay", str(first_token_delay_s)]  # fmt: skip
        p = Proc(f"stub-{port}", argv, port, self.dir / f"stub-{port}.log", health="/health")
        self.procs.append(p)
        return p.start()

    def gateway(
        self,
        backends: Sequence[str],
        *args: str,
        redis_url: str | None = None,
        port: int | None = None,
        config: dict[str, Any] | None = None,
        start: bool = True,
    ) -> Proc:
        """A gateway replica: ``python -m headway.serve serve --backend ... *args``."""
        port = port or free_port()
        argv = [sys.executable, "-m", "headway.serve", "serve", "--port", str(port), "--log-level", "warning"]
        for b in backends:
            argv += ["--backend", b]
        if redis_url:
            argv += ["--redis", redis_url]
        if config is not None:
            import json

            path = self.dir / f"gateway-{port}.json"
            path.write_text(json.dumps(config))
            argv += ["--config", str(path)]
        argv += list(args)
        p = Proc(f"gateway-{port}", argv, port, self.dir / f"gateway-{port}.log", health="/health")
        self.procs.append(p)
        return p.start() if start else p

    def close(self) -> None:
        """Stop every process, the last started first; a Ctrl-C meanwhile kills the one being stopped
        and the rest are still stopped before it is raised again."""
        interrupted: BaseException | None = None
        for p in reversed(self.procs):
            try:
                p.stop(timeout=5)
            except KeyboardInterrupt as exc:
                interrupted = interrupted or exc
            except Exception:  # best effort teardown: the others are still stopped
                continue
        if interrupted is not None:
            raise interrupted
