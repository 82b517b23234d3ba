"""Fleets of simulated replicas: presets per replica, replica speeds, per-replica results.

A fleet run is one :func:`~headway.sim.simulate` call with ``num_replicas=N`` and a
``router`` (see :mod:`headway.routers`); :func:`split_by_replica` and
:func:`fleet_summaries` turn its :class:`~headway.sim.SimResult` into the per-replica
and fleet views that reports show.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import TYPE_CHECKING

from headway.core import Request
from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import CostModel

if TYPE_CHECKING:
    from headway.metrics import SLO, RunSummary
    from headway.sim._simulator import SimResult

__all__ = [
    "FLEET",
    "describe_fleet",
    "fleet_presets",
    "fleet_summaries",
    "relative_speeds",
    "replica_speed",
    "split_by_replica",
]

FLEET = "fleet"
"""Key of the whole-fleet summary in :func:`fleet_summaries`."""

_REF_CONTEXT = 1024  # tokens of context per sequence when comparing replica speeds


def fleet_presets(spec: str | Sequence[str], num_replicas: int | None = None) -> list[str]:
    """Presets per replica from a CLI-style spec.

    ``"llama3-8b-h100"`` -> that preset on every replica (``num_replicas`` of them,
    default 1); ``"llama3-8b-h100:2,llama3-8b-l4:2"`` -> 2 + 2 replicas in that order;
    ``"a,b,c"`` -> one each. A list is taken as one preset per replica. When the spec
    names several presets, ``num_replicas`` (if given) must equal their total count.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    parts = [p.strip() for item in items for p in item.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty preset spec")
    out: list[str] = []
    for part in parts:
        name, sep, count = part.rpartition(":")
        if sep and count.lstrip("-").isdigit() and name:
            if int(count) < 1:
                raise ValueError(f"replica count must be >= 1 in {part!r}")
            out += [name] * int(count)
        else:
            out.append(part)
    if len(parts) == 1 and len(out) == 1:
        n = 1 if num_replicas is None else num_replicas
        if n < 1:
            raise ValueError(f"num_replicas must be >= 1, got {n}")
        return out * n
    if num_replicas is not None and num_replicas != len(out):
        raise ValueError(f"preset spec {spec!r} describes {len(out)} replicas, not {num_replicas}")
    return out


def describe_fleet(presets: Sequence[str]) -> str:
    """The presets of a fleet's replicas, in order, as runs of one preset: ``"4 x llama3-8b-a100"``,
    ``"2 x llama3-8b-h100, 2 x llama3-8b-l4"``; one replica is its preset's name alone.

    The runs keep the replicas' order (replica ``i`` is the ``i``-th named), as a fleet spec does."""
    if not presets:
        raise ValueError("a fleet has at least one replica")
    if len(presets) == 1:
        return presets[0]
    return ", ".join(f"{sum(1 for _ in run)} x {name}" for name, run in groupby(presets))


def replica_speed(cost: CostModel, scheduler: SchedulerConfig, num_blocks: int, block_size: int) -> float:
    """Decode throughput (tokens/s) of a replica at a reference load, for weighting routers.

    The reference batch is as many 1,024-token sequences as its KV cache holds, at most
    ``max_num_seqs`` (``max_num_active_seqs`` when set); the throughput is ``batch / step_time``. Routers use speeds
    relative to the fastest replica (the simulator normalizes).
    """
    batch = max(1, min(scheduler.active_seqs, num_blocks * block_size // _REF_CONTEXT))
    return batch / cost.step_time(batch, batch, batch * _REF_CONTEXT)


def relative_speeds(
    costs: Sequence[CostModel], scheduler: SchedulerConfig, cache: CacheConfig, num_blocks: Sequence[int]
) -> list[float]:
    """:func:`replica_speed` of each replica over the fastest one (1.0 when all are alike)."""
    raw = [replica_speed(c, scheduler, n, cache.block_size) for c, n in zip(costs, num_blocks, strict=True)]
    if all(r == raw[0] for r in raw):
        return [1.0] * len(raw)
    top = max(raw)
    return [r / top for r in raw]


def split_by_replica(result: SimResult) -> list[tuple[Request, ...]]:
    """The requests each replica served (via ``result.assignment``), in workload order."""
    groups: list[list[Request]] = [[] for _ in result.replicas]
    if len(result.assignment) != len(result.requests):
        raise ValueError("result has no assignment for its requests")
    for req, k in zip(result.requests, result.assignment, strict=True):
        groups[k].append(req)
    return [tuple(g) for g in groups]


def fleet_summaries(
    result: SimResult, *, slo: SLO | str | None = None, name: str | None = None
) -> dict[str, RunSummary]:
    """``{"fleet": summary of all requests, "<replica name>": summary of its requests, ...}``.

    Summaries come from :func:`headway.metrics.summarize` (goodput in ``vllm bench
    serve --goodput`` semantics when ``slo`` is given). Note that each replica's rates
    divide by *its own* makespan (first arrival to last finish there). A replica that
    received no request is left out.
    """
    from headway.metrics import summarize

    base = name if name is not None else result.policy
    out = {FLEET: summarize(result.requests, slo=slo, name=base)}
    for stats, reqs in zip(result.replicas, split_by_replica(result), strict=True):
        if reqs:
            out[stats.name] = summarize(reqs, slo=slo, name=f"{base}@{stats.name}")
    return out
