"""Workloads: request specs, arrival processes, trace readers and the built-in default.

The front door is :func:`load_workload` (``headway simulate --workload X``): a short
name (:func:`available_workloads`) or a trace/dataset file.
"""

from headway.workload._arrivals import (
    ArrivalProcess,
    BurstArrivals,
    GammaArrivals,
    PoissonArrivals,
    Seed,
    TraceArrivals,
    burst_arrivals,
    gamma_arrivals,
    make_rng,
    poisson_arrivals,
    replay_arrivals,
)
from headway.workload._datasets import (
    TokenCounter,
    approx_token_count,
    read_alpaca_eval,
    read_alpaca_eval_outputs,
    read_sharegpt,
)
from headway.workload._default import (
    DEFAULT_BURSTINESS,
    DEFAULT_NUM_REQUESTS,
    DEFAULT_RATE,
    default_workload,
    sample_output_lengths,
    sample_prompt_lengths,
)
from headway.workload._errors import UnknownWorkloadError, WorkloadFormatError
from headway.workload._formats import available_formats
from headway.workload._resample import RESAMPLING_CV, resample_output_lengths
from headway.workload._sessions import DEFAULT_THINK_TIME, read_turn_lengths, session_workload, with_system_prompts
from headway.workload._sources import (
    DATA_DIR_ENV,
    LoadOptions,
    available_workloads,
    check_workload_options,
    find_data_dir,
    load_workload,
    workload_data_path,
    workload_description,
)
from headway.workload._spec import RequestSpec, Workload
from headway.workload._tenants import DEFAULT_TENANT_MIX, Tenant, TenantMix, assign_tenants
from headway.workload._traces import read_azure_trace, read_burstgpt_trace, read_mooncake_trace, read_vidur_trace

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_BURSTINESS",
    "DEFAULT_NUM_REQUESTS",
    "DEFAULT_RATE",
    "DEFAULT_TENANT_MIX",
    "DEFAULT_THINK_TIME",
    "RESAMPLING_CV",
    "ArrivalProcess",
    "BurstArrivals",
    "GammaArrivals",
    "LoadOptions",
    "PoissonArrivals",
    "RequestSpec",
    "Seed",
    "Tenant",
    "TenantMix",
    "TokenCounter",
    "TraceArrivals",
    "UnknownWorkloadError",
    "Workload",
    "WorkloadFormatError",
    "approx_token_count",
    "assign_tenants",
    "available_formats",
    "available_workloads",
    "burst_arrivals",
    "check_workload_options",
    "default_workload",
    "find_data_dir",
    "gamma_arrivals",
    "load_workload",
    "make_rng",
    "poisson_arrivals",
    "read_alpaca_eval",
    "read_alpaca_eval_outputs",
    "read_azure_trace",
    "read_burstgpt_trace",
    "read_mooncake_trace",
    "read_sharegpt",
    "read_turn_lengths",
    "read_vidur_trace",
    "replay_arrivals",
    "resample_output_lengths",
    "sample_output_lengths",
    "sample_prompt_lengths",
    "session_workload",
    "with_system_prompts",
    "workload_data_path",
    "workload_description",
]
