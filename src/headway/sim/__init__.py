"""A discrete-event simulator of iteration-level continuous batching (vLLM V1 semantics)."""

from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import (
    PRESETS,
    CostModel,
    StepSample,
    available_presets,
    load_preset,
    roofline,
)
from headway.sim._events import EventLoop
from headway.sim._replica import Replica
from headway.sim._simulator import ReplicaStats, RouteFn, SimResult, simulate

__all__ = [
    "PRESETS",
    "CacheConfig",
    "CostModel",
    "EventLoop",
    "Replica",
    "ReplicaStats",
    "RouteFn",
    "SchedulerConfig",
    "SimResult",
    "StepSample",
    "available_presets",
    "load_preset",
    "roofline",
    "simulate",
]
