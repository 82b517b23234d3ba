"""A sweep grid: policies x workloads x rates x seeds x presets, read from TOML or JSON."""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headway.sim import SchedulerConfig

__all__ = ["Grid", "Task", "load_grid"]


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation of the grid."""

    index: int
    policy: str
    workload: str
    rate: float | None
    seed: int
    preset: str

    def params(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "workload": self.workload,
            "rate": self.rate,
            "seed": self.seed,
            "preset": self.preset,
        }


@dataclass(frozen=True, slots=True)
class Grid:
    """The cross product to simulate, and settings shared by every task."""

    policies: tuple[str, ...]
    workloads: tuple[str, ...] = ("default",)
    rates: tuple[float | None, ...] = (None,)
    """Arrival rates (requests/s); None keeps each workload's own arrivals."""
    seeds: tuple[int, ...] = (0,)
    presets: tuple[str, ...] = ("llama3-8b-a100",)
    num_requests: int | None = None
    slo: str | None = None
    """SLO targets in ms for attainment and goodput, e.g. ``"ttft:2000 e2el:60000"``."""
    policy_args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Keyword settings per policy name."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    """vLLM's ``--max-model-len`` (``headway simulate --max-model-len``); None: what the KV cache holds."""
    scorer_tau: float = 0.75
    """Score-based policies get a noisy-oracle length score with this Kendall tau when the workload
    carries no scores and their ``policy_args`` set no ``scorer`` (as ``headway simulate --scorer-tau``)."""

    def __post_init__(self) -> None:
        for name in ("policies", "workloads", "rates", "seeds", "presets"):
            if not getattr(self, name):
                raise ValueError(f"grid: {name} must not be empty")
        for name in ("policies", "workloads", "presets"):
            for v in getattr(self, name):
                if not isinstance(v, str) or not v:
                    raise ValueError(f"grid: {name} must be non-empty strings, got {v!r}")
            twice = sorted({v for v in getattr(self, name) if getattr(self, name).count(v) > 1})
            if twice:
                raise ValueError(f"grid: {name} lists {', '.join(twice)} more than once")
        for rate in self.rates:
            if rate is not None and (not _is_number(rate) or not math.isfinite(rate) or not rate > 0):
                raise ValueError(f"grid: rates must be numbers > 0, got {rate!r}")
        for seed in self.seeds:
            if not _is_int(seed) or seed < 0:
                raise ValueError(f"grid: seeds must be integers >= 0, got {seed!r}")
        for name in ("num_requests", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ValueError(f"grid: {name} must be an integer >= 1, got {v!r}")
        if not _is_number(self.scorer_tau) or not -1 <= self.scorer_tau <= 1:
            raise ValueError(f"grid: scorer_tau must be a number in [-1, 1], got {self.scorer_tau!r}")
        unknown = sorted(set(self.policy_args) - set(self.policies))
        if unknown:
            raise ValueError(f"grid: policy_args for policies not in the grid: {', '.join(unknown)}")
        self._check_names()

    def _check_names(self) -> None:
        """Policies, presets, workloads and the SLO that would fail every task fail here, up front."""
        from headway.core import get_policy_class
        from headway.metrics import SLO
        from headway.sim import load_preset
        from headway.sim._fleet import fleet_presets
        from headway.workload import available_workloads

        for policy in self.policies:
            get_policy_class(policy)  # lists the valid names
        from headway.sim import CacheConfig

        engine = self.scheduler()
        for spec in self.presets:
            for name in dict.fromkeys(fleet_presets(spec)):
                CacheConfig().check_model_len(engine, load_preset(name))  # load_preset lists the valid names
        known = set(available_workloads())
        for w in self.workloads:
            if w not in known and not Path(w).exists():
                names = ", ".join(sorted(known))
                raise ValueError(f"grid: workload {w!r} is neither a built-in name ({names}) nor a file")
        if self.slo is not None:
            if not isinstance(self.slo, str):
                raise ValueError(f"grid: slo must be a string such as 'ttft:2000 e2el:60000', got {self.slo!r}")
            SLO.parse(self.slo)

    def scheduler(self) -> SchedulerConfig:
        """The engine settings every task runs with."""
        from headway.sim import SchedulerConfig

        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )

    def tasks(self) -> list[Task]:
        """Every combination, in a fixed order (the order results are reported in)."""
        combos = itertools.product(self.presets, self.workloads, self.policies, self.rates, self.seeds)
        return [Task(i, pol, wl, rate, seed, preset) for i, (preset, wl, pol, rate, seed) in enumerate(combos)]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_LIST_KEYS = ("policies", "workloads", "rates", "seeds", "presets")
_SCALAR_KEYS = ("num_requests", "slo", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "scorer_tau")


def load_grid(path: str | Path) -> Grid:
    """Read a grid from a ``.toml`` or ``.json`` file; errors name the file and key."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"grid file {p} does not exist")
    try:
        raw: dict[str, Any] = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc.reason})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: the grid must be a table/object")
    unknown = sorted(set(raw) - set(_LIST_KEYS) - set(_SCALAR_KEYS) - {"policy_args"})
    if unknown:
        raise ValueError(f"{p}: unknown grid keys {unknown}; valid: {[*_LIST_KEYS, *_SCALAR_KEYS, 'policy_args']}")
    if "policies" not in raw:
        raise ValueError(f"{p}: the grid needs a 'policies' list")
    kwargs: dict[str, Any] = {}
    for key in _LIST_KEYS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, list):
                raise ValueError(f"{p}: {key} must be a list, got {value!r}")
            kwargs[key] = tuple(value)
    for key in _SCALAR_KEYS:
        if key in raw:
            kwargs[key] = raw[key]
    if "policy_args" in raw:
        if not isinstance(raw["policy_args"], dict):
            raise ValueError(f"{p}: policy_args must be a table of tables")
        kwargs["policy_args"] = raw["policy_args"]
    try:
        return Grid(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None
