"""Factories shared by the test suite: requests, workloads, cost models, and the repository's scripts as
modules."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from headway.core import Request
from headway.sim import CostModel
from headway.workload import RequestSpec, Workload, find_data_dir


def have_shared_data() -> bool:
    """Whether the shared data folder is found (``find_data_dir``), for a ``skipif`` at import time."""
    try:
        find_data_dir()
    except FileNotFoundError:
        return False
    return True


def make_request(request_id: str = "r0", *, arrival: float = 0.0, prompt: int = 8, max_tokens: int = 64,
                 seq: int = 0, **kw: object) -> Request:
    req = Request(request_id, arrival, prompt, max_tokens, **kw)  # type: ignore[arg-type]
    req.seq = seq
    return req


def make_workload(rows: Sequence[tuple[float, int, int]], name: str = "test") -> Workload:
    """Rows of (arrival_time, prompt_tokens, output_tokens)."""
    specs = [RequestSpec(f"r{i}", t, p, o) for i, (t, p, o) in enumerate(rows)]
    return Workload.from_specs(name, specs)


def unit_cost(step: float = 1.0, per_token: float = 0.0, per_kv_token: float = 0.0) -> CostModel:
    """A cost model with round numbers for hand-computed scenarios (memory figures unused)."""
    return CostModel(
        name="unit", step_overhead=step, per_token=per_token, per_seq=0.0, per_kv_token=per_kv_token,
        gpu_memory_bytes=1e12, weight_bytes=0.0, kv_bytes_per_token=1.0,
    )


ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """A script of the repository (``benchmarks/...``, ``scripts/...``; not in the package) imported as a
    module named after its file, registered in ``sys.modules`` (a script's dataclasses look their module up)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
