"""Per-request metrics and the run summary computed from finished requests."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from headway.core import Request, RequestState
from headway.metrics._slo import SLO
from headway.metrics._stats import LatencyStats, _nan_to_none, _none_to_nan, jain_index, latency_stats

__all__ = [
    "ERROR_MESSAGE_KEY",
    "ITL_KEY",
    "REQUEST_COLUMNS",
    "GroupSummary",
    "RunSummary",
    "request_rows",
    "summarize",
]

# Columns of the per-request CSV, in order. Times are seconds on the engine clock.
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "tenant_id",
    "tier",
    "state",
    "abort_reason",
    "abort_message",
    "arrival_time",
    "num_prompt_tokens",
    "num_output_tokens",
    "max_tokens",
    "first_scheduled_time",
    "first_token_time",
    "last_token_time",
    "finish_time",
    "queueing_delay",
    "ttft",
    "tpot",
    "e2e_latency",
    "normalized_latency",
    "num_preemptions",
    "num_recomputed_tokens",
    "num_cached_tokens",
    "slo_met",
)

Cell = str | int | float | bool | None

ERROR_MESSAGE_KEY = "error_message"
"""``Request.extra`` key of the message a backend gave with a request it failed (``headway bench
serve`` records the error body it got): the CSV's ``abort_message``, beside the short
``abort_reason``."""

ITL_KEY = "itl"
"""``Request.extra`` key of a streamed request's inter-token latencies: the gaps in seconds between
consecutive content chunks as the client received them (``headway bench serve`` records them; the
simulator, which has no chunks, does not)."""


@dataclass(frozen=True, slots=True)
class _Metrics:
    """Derived metrics of one request; latency fields are ``None`` unless it finished."""

    request: Request
    completed: bool
    queueing_delay: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    normalized: float | None
    slo_met: bool | None


def _abort_reason(req: Request) -> str:
    reason = req.extra.get("abort_reason")
    return "unknown" if reason is None else str(reason)


def _abort_message(req: Request) -> str | None:
    message = req.extra.get(ERROR_MESSAGE_KEY) if req.state is RequestState.ABORTED else None
    return None if message is None else str(message)


def _measure(req: Request, slo: SLO | None) -> _Metrics:
    completed = req.state is RequestState.FINISHED
    if not completed:
        return _Metrics(req, False, None, None, None, None, None, False if slo is not None else None)
    e2e = req.e2e_latency
    if e2e is None:
        raise ValueError(f"request {req.request_id!r} is FINISHED but has no finish_time")
    normalized = e2e / req.num_output_tokens if req.num_output_tokens > 0 else None
    ttft, tpot = req.ttft, req.tpot
    met = slo.is_met(ttft, tpot, e2e) if slo is not None else None
    return _Metrics(req, True, req.queueing_delay, ttft, tpot, e2e, normalized, met)


def _row(m: _Metrics) -> dict[str, Cell]:
    r = m.request
    return {
        "request_id": r.request_id,
        "tenant_id": r.tenant_id,
        "tier": r.tier.name.lower(),
        "state": r.state.value,
        "abort_reason": _abort_reason(r) if r.state is RequestState.ABORTED else None,
        "abort_message": _abort_message(r),
        "arrival_time": r.arrival_time,
        "num_prompt_tokens": r.num_prompt_tokens,
        "num_output_tokens": r.num_output_tokens,
        "max_tokens": r.max_tokens,
        "first_scheduled_time": r.first_scheduled_time,
        "first_token_time": r.first_token_time,
        "last_token_time": r.last_token_time,
        "finish_time": r.finish_time,
        "queueing_delay": m.queueing_delay,
        "ttft": m.ttft,
        "tpot": m.tpot,
        "e2e_latency": m.e2e,
        "normalized_latency": m.normalized,
        "num_preemptions": r.num_preemptions,
        "num_recomputed_tokens": r.num_recomputed_tokens,
        "num_cached_tokens": r.num_cached_tokens,
        "slo_met": m.slo_met,
    }


def _coerce_slo(slo: SLO | str | None) -> SLO | None:
    return SLO.parse(slo) if isinstance(slo, str) else slo


def request_rows(requests: Iterable[Request], *, slo: SLO | str | None = None) -> list[dict[str, Cell]]:
    """One dict per request with the :data:`REQUEST_COLUMNS`, in input order.

    Derived latencies (``queueing_delay``, ``ttft``, ``tpot``, ``e2e_latency``,
    ``normalized_latency``) are ``None`` for requests that did not finish;
    ``slo_met`` is ``None`` without an SLO. ``num_cached_tokens`` (prompt tokens the prefix
    cache held when the request was first scheduled) is ``None`` where the engine did not say,
    so the run's ``prefix_cache_hit_rate`` is the sum of this column over the sum of
    ``num_prompt_tokens`` of the rows that have it.
    """
    slo_ = _coerce_slo(slo)
    return [_row(_measure(r, slo_)) for r in requests]


# ----------------------------------------------------------------- summaries
def _get_int(data: Mapping[str, object], key: str) -> int:
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key} must be an int, got {value!r}")
    return value


def _get_opt_int(data: Mapping[str, object], key: str) -> int | None:
    return None if data.get(key) is None else _get_int(data, key)


def _get_float(data: Mapping[str, object], key: str) -> float:
    return _none_to_nan(data.get(key))


def _get_opt_float(data: Mapping[str, object], key: str) -> float | None:
    value = data.get(key)
    return None if value is None else _none_to_nan(value)


def _get_map(data: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = data[key]
    if not isinstance(value, Mapping):
        raise TypeError(f"{key} must be a mapping, got {value!r}")
    return value


def _get_stats(data: Mapping[str, object], key: str) -> LatencyStats:
    return LatencyStats.from_dict(_get_map(data, key))


_STAT_FIELDS: tuple[str, ...] = ("ttft", "tpot", "e2e", "normalized_latency", "queueing_delay")


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """Metrics of the requests of one tenant or one tier.

    ``output_throughput`` and ``goodput`` divide by the whole run's makespan, so the
    groups' values add up to the run's.
    """

    name: str
    num_requests: int
    num_completed: int
    num_aborted: int
    total_output_tokens: int
    output_throughput: float
    ttft: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    normalized_latency: LatencyStats
    queueing_delay: LatencyStats
    num_preemptions: int
    num_slo_met: int | None
    slo_attainment: float | None
    goodput: float | None = None
    """``num_slo_met / makespan`` of the run (requests/s); ``None`` without an SLO."""

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "num_completed": self.num_completed,
            "num_aborted": self.num_aborted,
            "total_output_tokens": self.total_output_tokens,
            "output_throughput": _nan_to_none(self.output_throughput),
            **{k: getattr(self, k).to_dict() for k in _STAT_FIELDS},
            "num_preemptions": self.num_preemptions,
            "num_slo_met": self.num_slo_met,
            "slo_attainment": self.slo_attainment,
            "goodput": None if self.goodput is None else _nan_to_none(self.goodput),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> GroupSummary:
        met = _get_opt_int(data, "num_slo_met")
        return cls(
            name=str(data["name"]),
            num_requests=_get_int(data, "num_requests"),
            num_completed=_get_int(data, "num_completed"),
            num_aborted=_get_int(data, "num_aborted"),
            total_output_tokens=_get_int(data, "total_output_tokens"),
            output_throughput=_get_float(data, "output_throughput"),
            ttft=_get_stats(data, "ttft"),
            tpot=_get_stats(data, "tpot"),
            e2e=_get_stats(data, "e2e"),
            normalized_latency=_get_stats(data, "normalized_latency"),
            queueing_delay=_get_stats(data, "queueing_delay"),
            num_preemptions=_get_int(data, "num_preemptions"),
            num_slo_met=met,
            slo_attainment=_get_opt_float(data, "slo_attainment"),
            # None without an SLO; NaN (stored as None) for a zero makespan
            goodput=None if met is None else _none_to_nan(data.get("goodput")),
        )


@dataclass(frozen=True, slots=True)
class RunSummary:
    """Everything :func:`summarize` computes for one run (one policy on one workload).

    Units: seconds, seconds per output token (``normalized_latency``), requests or
    tokens per second (throughputs, ``goodput``). Undefined floats are NaN here and
    ``None`` in :meth:`to_dict`; fields that need an SLO are ``None`` without one.
    Equality compares field by field, so two summaries with NaN fields compare
    unequal; compare :meth:`to_dict` results instead.
    """

    name: str
    num_requests: int
    """All requests given, whatever their state."""
    num_completed: int
    """Requests in state FINISHED."""
    num_aborted: int
    """Requests in state ABORTED."""
    num_unfinished: int
    """Requests in any other state (still waiting/running when the run stopped)."""
    aborted_by_reason: Mapping[str, int]
    """ABORTED requests by ``extra["abort_reason"]`` (``"unknown"`` when absent)."""
    start_time: float
    """First arrival."""
    end_time: float
    """The latest ``finish_time`` or arrival of any request (a request that arrived after the
    last finish, or never finished, extends the run to its arrival)."""
    makespan: float
    """``end_time - start_time``; the denominator of every rate."""
    total_prompt_tokens: int
    """Prompt tokens of completed requests."""
    total_output_tokens: int
    """Output tokens of completed requests."""
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    """(prompt + output tokens of completed requests) / makespan, as ``vllm bench serve``."""
    ttft: LatencyStats
    tpot: LatencyStats
    """Over per-request TPOTs (requests with >= 2 output tokens)."""
    e2e: LatencyStats
    normalized_latency: LatencyStats
    """Over per-request ``e2e / num_output_tokens`` (requests with >= 1 output token)."""
    queueing_delay: LatencyStats
    num_preemptions: int
    """Total over all requests, aborted ones included."""
    num_recomputed_tokens: int
    """Total over all requests, aborted ones included."""
    slo: SLO | None
    num_slo_met: int | None
    slo_attainment: float | None
    """``num_slo_met / num_requests``: aborted and unfinished requests are misses."""
    goodput: float | None
    """``num_slo_met / makespan`` in requests per second (``vllm bench serve --goodput``)."""
    jain_fairness: float
    """Jain's index over tenants of ``1 / mean normalized latency`` (see :func:`summarize`)."""
    tenants: Mapping[str, GroupSummary] = field(default_factory=dict)
    tiers: Mapping[str, GroupSummary] = field(default_factory=dict)
    itl: LatencyStats = field(default_factory=LatencyStats.empty)
    """Inter-token latency (ITL) as ``vllm bench serve``: over every gap between consecutive
    content chunks of every completed request that has them (``extra[ITL_KEY]``, recorded by
    ``headway bench serve`` for streamed requests). Empty (NaN) for the simulator, which has no chunks."""
    prefix_cache_hit_rate: float | None = None
    """Prompt tokens found in the prefix cache over prompt tokens, over the requests whose
    ``num_cached_tokens`` the engine reported (vLLM's prefix-cache hit rate); None if none did."""

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe nested dict (no NaN: undefined values are ``None``)."""
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "num_completed": self.num_completed,
            "num_aborted": self.num_aborted,
            "num_unfinished": self.num_unfinished,
            "aborted_by_reason": dict(self.aborted_by_reason),
            "start_time": self.start_time,
            "end_time": self.end_time,
            "makespan": self.makespan,
            "total_prompt_tokens": self.total_prompt_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": _nan_to_none(self.request_throughput),
            "output_throughput": _nan_to_none(self.output_throughput),
            "total_token_throughput": _nan_to_none(self.total_token_throughput),
            **{k: getattr(self, k).to_dict() for k in _STAT_FIELDS},
            "num_preemptions": self.num_preemptions,
            "num_recomputed_tokens": self.num_recomputed_tokens,
            "slo": None if self.slo is None else self.slo.to_dict(),
            "num_slo_met": self.num_slo_met,
            "slo_attainment": self.slo_attainment,
            "goodput": None if self.goodput is None else _nan_to_none(self.goodput),
            "jain_fairness": _nan_to_none(self.jain_fairness),
            "tenants": {k: v.to_dict() for k, v in self.tenants.items()},
            "tiers": {k: v.to_dict() for k, v in self.tiers.items()},
            "itl": self.itl.to_dict(),
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunSummary:
        """Inverse of :meth:`to_dict` (e.g. after ``json.load``)."""
        reasons = _get_map(data, "aborted_by_reason")
        slo = data.get("slo")
        goodput = data.get("goodput")
        slo_attainment = _get_opt_float(data, "slo_attainment")
        return cls(
            name=str(data["name"]),
            num_requests=_get_int(data, "num_requests"),
            num_completed=_get_int(data, "num_completed"),
            num_aborted=_get_int(data, "num_aborted"),
            num_unfinished=_get_int(data, "num_unfinished"),
            aborted_by_reason={str(k): _get_int(reasons, k) for k in reasons},
            start_time=_get_float(data, "start_time"),
            end_time=_get_float(data, "end_time"),
            makespan=_get_float(data, "makespan"),
            total_prompt_tokens=_get_int(data, "total_prompt_tokens"),
            total_output_tokens=_get_int(data, "total_output_tokens"),
            request_throughput=_get_float(data, "request_throughput"),
            output_throughput=_get_float(data, "output_throughput"),
            total_token_throughput=_get_float(data, "total_token_throughput"),
            ttft=_get_stats(data, "ttft"),
            tpot=_get_stats(data, "tpot"),
            e2e=_get_stats(data, "e2e"),
            normalized_latency=_get_stats(data, "normalized_latency"),
            queueing_delay=_get_stats(data, "queueing_delay"),
            num_preemptions=_get_int(data, "num_preemptions"),
            num_recomputed_tokens=_get_int(data, "num_recomputed_tokens"),
            slo=None if slo is None else SLO.from_dict(_get_map(data, "slo")),
            num_slo_met=_get_opt_int(data, "num_slo_met"),
            slo_attainment=slo_attainment,
            # goodput is None without an SLO, NaN (stored as None) for a zero makespan
            goodput=None if slo is None else _none_to_nan(goodput),
            jain_fairness=_get_float(data, "jain_fairness"),
            tenants={
                k: GroupSummary.from_dict(_get_map(_get_map(data, "tenants"), k)) for k in _get_map(data, "tenants")
            },
            tiers={k: GroupSummary.from_dict(_get_map(_get_map(data, "tiers"), k)) for k in _get_map(data, "tiers")},
            # files written before ITL was recorded have none
            itl=_get_stats(data, "itl") if data.get("itl") is not None else LatencyStats.empty(),
            prefix_cache_hit_rate=_get_opt_float(data, "prefix_cache_hit_rate"),
        )


def _rate(count: float, makespan: float) -> float:
    return count / makespan if makespan > 0.0 else math.nan


def _speed(group: GroupSummary) -> float | None:
    """Tenant's x_i for Jain's index: 1 / mean normalized latency, 0 if it completed no request,
    ``None`` (left out) when its completed requests give no finite positive mean (only 0-token
    outputs, or a mean of 0)."""
    if group.num_completed == 0:
        return 0.0
    mean = group.normalized_latency.mean
    if group.normalized_latency.count == 0 or not (mean > 0.0 and math.isfinite(mean)):
        return None
    speed = 1.0 / mean
    return speed if math.isfinite(speed) else None


def _jain(groups: Iterable[GroupSummary]) -> float:
    """Jain's index of the tenants' speeds (see :func:`summarize`)."""
    gs = list(groups)
    if not any(g.num_completed for g in gs):
        return math.nan
    xs = [x for g in gs if (x := _speed(g)) is not None]
    if len(gs) == 1 or (len(xs) < 2 and all(x > 0.0 for x in xs)):
        return 1.0
    top = max(xs)
    # scaled to the fastest (the index does not change) so that squares of huge speeds do not overflow;
    # NaN only when every tenant left in starved
    return jain_index([x / top for x in xs] if top > 0.0 else xs)


def _itl_stats(ms: list[_Metrics]) -> LatencyStats:
    """ITL over all gaps of the completed requests that recorded them."""
    parts = [np.asarray(g, dtype=np.float64) for m in ms if (g := m.request.extra.get(ITL_KEY)) is not None]
    if not parts:
        return LatencyStats.empty()
    return latency_stats(np.concatenate(parts))


def _stats_of(ms: list[_Metrics], attr: str) -> LatencyStats:
    return latency_stats(v for m in ms if (v := getattr(m, attr)) is not None)


def _group(name: str, ms: list[_Metrics], slo: SLO | None, makespan: float) -> GroupSummary:
    done = [m for m in ms if m.completed]
    out_tokens = sum(m.request.num_output_tokens for m in done)
    met = sum(1 for m in ms if m.slo_met) if slo is not None else None
    return GroupSummary(
        name=name,
        num_requests=len(ms),
        num_completed=len(done),
        num_aborted=sum(1 for m in ms if m.request.state is RequestState.ABORTED),
        total_output_tokens=out_tokens,
        output_throughput=_rate(out_tokens, makespan),
        ttft=_stats_of(done, "ttft"),
        tpot=_stats_of(done, "tpot"),
        e2e=_stats_of(done, "e2e"),
        normalized_latency=_stats_of(done, "normalized"),
        queueing_delay=_stats_of(done, "queueing_delay"),
        num_preemptions=sum(m.request.num_preemptions for m in ms),
        num_slo_met=met,
        slo_attainment=None if met is None else met / len(ms),
        goodput=None if met is None else _rate(met, makespan),
    )


def summarize(requests: Iterable[Request], *, slo: SLO | str | None = None, name: str = "") -> RunSummary:
    """Summarize one run from its requests (pure and deterministic).

    * Requests in state FINISHED are *completed*; ABORTED requests are counted by
      ``extra["abort_reason"]``; requests in any other state count as unfinished.
      Only completed requests enter latency statistics and token throughputs.
    * Latency statistics: TTFT, TPOT, end-to-end latency (TTLT), normalized latency
      (``e2e / num_output_tokens``, the PARS paper's per-token latency) and queueing
      delay, each with mean, min, p50/p90/p95/p99 (linear interpolation) and max.
      TPOT is each request's *mean* inter-token time
      ``(last_token_time - first_token_time) / (num_output_tokens - 1)``.
    * ITL (inter-token latency, as ``vllm bench serve``): the distribution of every gap
      between consecutive content chunks, over all completed requests that recorded
      their gaps in ``extra[ITL_KEY]`` (``headway bench serve`` does for streamed
      requests). The simulator has no chunks: its ITL is empty (NaN), not derived.
    * Rates divide by the makespan, from the first arrival to the latest finish or
      arrival (a request arriving after the last finish extends it).
    * ``slo`` (an :class:`SLO` or a ``--goodput`` string such as
      ``"ttft:500 tpot:50 e2el:2000"`` in milliseconds) adds SLO attainment (share of
      *all* requests meeting every target; aborted ones miss) and goodput
      (requests/s meeting every target), per run, tenant and tier.
    * ``jain_fairness`` is Jain's index over tenants of ``x_i = 1 / m_i`` where
      ``m_i`` is tenant ``i``'s mean normalized latency (its token "speed"); a tenant
      with no completed request gets ``x_i = 0``; a tenant whose completed requests
      give no finite positive ``m_i`` (only 0-token outputs, or a mean of 0) is left
      out. It is 1.0 with one tenant, and when fewer than two tenants are left in and
      none of them starved; NaN if no tenant completed a request, or if every tenant
      left in starved.

    The result does not depend on the order of ``requests``. Raises ``ValueError``
    for no requests (a summary of nothing has no makespan) and for a FINISHED request
    without ``finish_time``.
    """
    reqs = list(requests)
    if not reqs:
        raise ValueError("summarize() needs at least one request; got none")
    slo_ = _coerce_slo(slo)
    ms = [_measure(r, slo_) for r in reqs]

    start = min(r.arrival_time for r in reqs)
    # the latest finish or arrival: an unfinished request, or one arriving after the last
    # finish, still belongs to the run
    end = max(r.arrival_time if r.finish_time is None else max(r.arrival_time, r.finish_time) for r in reqs)
    makespan = max(end - start, 0.0)

    done = [m for m in ms if m.completed]
    prompt_tokens = sum(m.request.num_prompt_tokens for m in done)
    output_tokens = sum(m.request.num_output_tokens for m in done)
    aborted = [r for r in reqs if r.state is RequestState.ABORTED]
    reasons: dict[str, int] = {}
    for r in aborted:
        key = _abort_reason(r)
        reasons[key] = reasons.get(key, 0) + 1

    by_tenant: dict[str, list[_Metrics]] = {}
    by_tier: dict[str, list[_Metrics]] = {}
    for m in ms:
        by_tenant.setdefault(m.request.tenant_id, []).append(m)
        by_tier.setdefault(m.request.tier.name.lower(), []).append(m)
    tenants = {k: _group(k, by_tenant[k], slo_, makespan) for k in sorted(by_tenant)}
    tier_order = sorted(by_tier, key=lambda t: (min(m.request.tier for m in by_tier[t]), t))
    tiers = {k: _group(k, by_tier[k], slo_, makespan) for k in tier_order}

    met = sum(1 for m in ms if m.slo_met) if slo_ is not None else None
    return RunSummary(
        name=name,
        num_requests=len(reqs),
        num_completed=len(done),
        num_aborted=len(aborted),
        num_unfinished=len(reqs) - len(done) - len(aborted),
        aborted_by_reason=dict(sorted(reasons.items())),
        start_time=start,
        end_time=end,
        makespan=makespan,
        total_prompt_tokens=prompt_tokens,
        total_output_tokens=output_tokens,
        request_throughput=_rate(len(done), makespan),
        output_throughput=_rate(output_tokens, makespan),
        total_token_throughput=_rate(prompt_tokens + output_tokens, makespan),
        ttft=_stats_of(done, "ttft"),
        tpot=_stats_of(done, "tpot"),
        e2e=_stats_of(done, "e2e"),
        normalized_latency=_stats_of(done, "normalized"),
        queueing_delay=_stats_of(done, "queueing_delay"),
        num_preemptions=sum(r.num_preemptions for r in reqs),
        num_recomputed_tokens=sum(r.num_recomputed_tokens for r in reqs),
        slo=slo_,
        num_slo_met=met,
        slo_attainment=None if met is None else met / len(reqs),
        goodput=None if met is None else _rate(met, makespan),
        jain_fairness=_jain(tenants.values()),
        tenants=tenants,
        tiers=tiers,
        itl=_itl_stats(done),
        prefix_cache_hit_rate=_hit_rate(reqs),
    )


def _hit_rate(reqs: Sequence[Request]) -> float | None:
    known = [r for r in reqs if r.num_cached_tokens is not None]
    queries = sum(r.num_prompt_tokens for r in known)
    return sum(r.num_cached_tokens or 0 for r in known) / queries if queries else None
