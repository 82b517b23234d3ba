"""Workloads: request specs, arrival processes, trace readers and the built-in default."""

from headway.workload._spec import RequestSpec, Workload

__all__ = ["RequestSpec", "Workload"]
