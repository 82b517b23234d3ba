"""A discrete-event simulator of iteration-level continuous batching (vLLM V1 semantics)."""

from headway.sim._blocks import SimulationStalled
from headway.sim._calibrate import (
    CalibrationFit,
    StepLog,
    calibration_meta,
    capacity_cost_model,
    engine_configs,
    fit_from_step_log,
    fit_step_samples,
    preset_dir,
    read_step_log,
    save_preset,
    saved_presets,
    step_samples,
)
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
from headway.sim._prefix import ideal_prefix_hits
from headway.sim._replica import Replica
from headway.sim._simulator import ReplicaStats, RouteFn, SimResult, simulate
from headway.sim._steps import StepRecord
from headway.sim._timings import StepTimings, fit_timings, read_step_timings

__all__ = [
    "PRESETS",
    "CacheConfig",
    "CalibrationFit",
    "CostModel",
    "EventLoop",
    "Replica",
    "ReplicaStats",
    "RouteFn",
    "SchedulerConfig",
    "SimResult",
    "SimulationStalled",
    "StepLog",
    "StepRecord",
    "StepSample",
    "StepTimings",
    "available_presets",
    "calibration_meta",
    "capacity_cost_model",
    "engine_configs",
    "fit_from_step_log",
    "fit_step_samples",
    "fit_timings",
    "ideal_prefix_hits",
    "load_preset",
    "preset_dir",
    "read_step_log",
    "read_step_timings",
    "roofline",
    "save_preset",
    "saved_presets",
    "simulate",
    "step_samples",
]
