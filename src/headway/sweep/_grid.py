"""A sweep grid: policies x workloads x rates x seeds x presets, read from TOML or JSON."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headway.sim import CacheConfig, SchedulerConfig

__all__ = ["LIMIT_METRICS", "Grid", "Task", "load_grid"]


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
    system_prompts: int | None = None
    """Put one of this many shared system prompts in front of each request (``headway simulate
    --system-prompts``): a workload whose prefixes the prefix cache and a prefix router can use."""
    system_prompt_tokens: int | None = None
    """Their length in tokens (``--system-prompt-tokens``; needs ``system_prompts``)."""
    think_time: float | None = None
    """``sharegpt-sessions``: mean seconds between an answer and the next turn (``--think-time``)."""
    router: str = "least-outstanding"
    """How a fleet entry of ``presets`` (``"llama3-8b-h100:4"``) spreads requests (``headway routers``)."""
    async_scheduling: bool = False
    """vLLM's ``--async-scheduling`` (``headway simulate --async-scheduling``)."""
    enable_prefix_caching: bool = True
    """vLLM's automatic prefix caching (``headway simulate --no-enable-prefix-caching`` turns it off)."""
    limits: Mapping[str, float] = field(default_factory=dict)
    """What a rate must meet to count as sustained, e.g. ``{"ttft_p99": 2.0, "e2e_mean": 10.0}``: upper
    bounds on the aggregate table's latency columns, in its units (seconds; ``norm_*`` seconds a
    token), and ``slo_attainment`` a lower bound (a share, 0-1; needs ``slo``). With limits the sweep
    reports, per preset, workload and policy, the highest rate of ``rates`` at which they hold, every
    lower rate holding too (:func:`headway.sweep.max_rates`)."""

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
        for name in ("async_scheduling", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"grid: {name} must be true or false, got {getattr(self, name)!r}")
        if not _is_number(self.scorer_tau) or not -1 <= self.scorer_tau <= 1:
            raise ValueError(f"grid: scorer_tau must be a number in [-1, 1], got {self.scorer_tau!r}")
        self._check_limits()
        self._check_workload_options()
        unknown = sorted(set(self.policy_args) - set(self.policies))
        if unknown:
            raise ValueError(f"grid: policy_args for policies not in the grid: {', '.join(unknown)}")
        self._check_names()

    def _check_limits(self) -> None:
        if not isinstance(self.limits, Mapping):
            raise ValueError(f"grid: limits must be a table of metric = bound, got {self.limits!r}")
        for name, bound in self.limits.items():
            if name not in LIMIT_METRICS:
                raise ValueError(f"grid: limits: unknown metric {name!r}; valid: {', '.join(LIMIT_METRICS)}")
            if not _is_number(bound) or not math.isfinite(bound) or not bound > 0:
                raise ValueError(f"grid: limits: {name} must be a number > 0, got {bound!r}")
        if "slo_attainment" in self.limits:
            if (share := self.limits["slo_attainment"]) > 1:
                raise ValueError(f"grid: limits: slo_attainment is a share (0-1], got {share!r}")
            if self.slo is None:
                raise ValueError("grid: limits: slo_attainment needs an slo (e.g. slo = 'ttft:2000')")
        if self.limits and all(rate is None for rate in self.rates):
            raise ValueError("grid: limits need rates: the highest rate meeting them is read from the rates swept")

    def workload_options(self) -> dict[str, Any]:
        """The workload options every task loads its workload with (beside its seed and rate)."""
        names = ("num_requests", "system_prompts", "system_prompt_tokens", "think_time")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def _check_workload_options(self) -> None:
        from headway.workload import check_workload_options

        try:
            for workload in self.workloads:
                check_workload_options(workload, **self.workload_options())
        except (TypeError, ValueError) as exc:
            raise ValueError(f"grid: {exc}") from None

    def _check_names(self) -> None:
        """Policies, presets, workloads and the SLO that would fail every task fail here, up front."""
        from headway.core import get_policy_class
        from headway.metrics import SLO
        from headway.routers import get_router_class
        from headway.sim import load_preset
        from headway.sim._fleet import fleet_presets
        from headway.workload import available_workloads

        for policy in self.policies:
            get_policy_class(policy)  # lists the valid names
        if not isinstance(self.router, str):
            raise ValueError(f"grid: router must be a router's name (headway routers), got {self.router!r}")
        get_router_class(self.router)  # lists the valid names
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
            async_scheduling=self.async_scheduling,
        )

    def cache(self) -> CacheConfig:
        """The KV-cache settings every task runs with."""
        from headway.sim import CacheConfig

        return CacheConfig(enable_prefix_caching=self.enable_prefix_caching)

    def settings(self) -> dict[str, Any]:
        """Every field as JSON data (lists for tuples), as a report records the grid it ran."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def tasks(self) -> list[Task]:
        """Every combination, in a fixed order (the order results are reported in)."""
        combos = itertools.product(self.presets, self.workloads, self.policies, self.rates, self.seeds)
        return [Task(i, pol, wl, rate, seed, preset) for i, (preset, wl, pol, rate, seed) in enumerate(combos)]


def _plain(v: Any) -> Any:
    """``v`` with its tuples as lists and its mappings as dicts, as JSON reads it back."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


LIMIT_METRICS = ("e2e_mean", "e2e_p99", "ttft_mean", "ttft_p99", "norm_mean", "norm_p99", "slo_attainment")
"""The aggregate columns a grid's ``limits`` may bound (``slo_attainment`` from below, the rest from above)."""

_LIST_KEYS = ("policies", "workloads", "rates", "seeds", "presets")
_SCALAR_KEYS = (
    "num_requests",
    "slo",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "scorer_tau",
    "system_prompts",
    "system_prompt_tokens",
    "think_time",
    "router",
    "async_scheduling",
    "enable_prefix_caching",
)
_TABLE_KEYS = ("policy_args", "limits")


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
    unknown = sorted(set(raw) - set(_LIST_KEYS) - set(_SCALAR_KEYS) - set(_TABLE_KEYS))
    if unknown:
        raise ValueError(f"{p}: unknown grid keys {unknown}; valid: {[*_LIST_KEYS, *_SCALAR_KEYS, *_TABLE_KEYS]}")
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
    if "limits" in raw:
        if not isinstance(raw["limits"], dict):
            raise ValueError(f"{p}: limits must be a table of metric = bound, e.g. {{ttft_p99 = 2.0}}")
        kwargs["limits"] = raw["limits"]
    try:
        return Grid(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None
