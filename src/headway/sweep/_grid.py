"""A sweep grid: policies x workloads x rates x seeds x presets, read from TOML or JSON."""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    def __post_init__(self) -> None:
        for name in ("policies", "workloads", "rates", "seeds", "presets"):
            if not getattr(self, name):
                raise ValueError(f"grid: {name} must not be empty")
        for rate in self.rates:
            if rate is not None and not rate > 0:
                raise ValueError(f"grid: rates must be > 0, got {rate}")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"grid: num_requests must be >= 1, got {self.num_requests}")
        unknown = sorted(set(self.policy_args) - set(self.policies))
        if unknown:
            raise ValueError(f"grid: policy_args for policies not in the grid: {', '.join(unknown)}")

    def tasks(self) -> list[Task]:
        """Every combination, in a fixed order (the order results are reported in)."""
        combos = itertools.product(self.presets, self.workloads, self.policies, self.rates, self.seeds)
        return [Task(i, pol, wl, rate, seed, preset) for i, (preset, wl, pol, rate, seed) in enumerate(combos)]


_LIST_KEYS = ("policies", "workloads", "rates", "seeds", "presets")
_SCALAR_KEYS = ("num_requests", "slo", "max_num_seqs", "max_num_batched_tokens")


def load_grid(path: str | Path) -> Grid:
    """Read a grid from a ``.toml`` or ``.json`` file; errors name the file and key."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"grid file {p} does not exist")
    try:
        raw: dict[str, Any] = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
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
