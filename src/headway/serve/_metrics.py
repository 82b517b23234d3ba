"""Prometheus metrics of one gateway app (its own CollectorRegistry)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headway.core import Request
from headway.serve._tenants import Identity

__all__ = ["GatewayMetrics"]

_R = TypeVar("_R")

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# vLLM's own buckets for vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
MAX_LABEL_VALUES = 64
"""Distinct ``model``/``priority`` label values kept per metric; later ones are counted as
``"other"`` (both come from clients: an unbounded label would grow the registry without end)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate (JSON ``"\\ud800"`` in a request's ``model``): no UTF-8 text holds one, and a
label holding one made every later ``/metrics`` a 500 (its text could not be encoded)."""


class _Bounded:
    """Label values seen so far, at most ``limit`` of them; beyond that, ``"other"``."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._seen: set[str] = set()
        self._limit = limit

    def __call__(self, value: str) -> str:
        value = _SURROGATE.sub("\ufffd", value[:128])  # as a UTF-8 decoder replaces an invalid sequence
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return "other"
        self._seen.add(value)
        return value


class _LiveCollector(Collector):
    """Gauges read from the dispatcher at scrape time (no bookkeeping on the hot path)."""

    def __init__(
        self,
        queue_lengths: Callable[[], Iterable[tuple[str, str, int]]],
        in_flight: Callable[[], Iterable[tuple[str, int]]],
        backend_up: Callable[[], Iterable[tuple[str, int]]],
        drift_bias: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._queue_lengths = queue_lengths
        self._in_flight = in_flight
        self._backend_up = backend_up
        self._drift_bias = drift_bias

    def collect(self) -> Iterable[Metric]:
        q = GaugeMetricFamily(
            "headway_queue_length", "Requests waiting in the gateway queue", labels=["tenant", "tier"]
        )
        for tenant, tier, n in self._queue_lengths():
            q.add_metric([tenant, tier], n)
        yield q
        f = GaugeMetricFamily("headway_backend_in_flight", "Requests in flight per backend", labels=["backend"])
        for url, n in self._in_flight():
            f.add_metric([url], n)
        yield f
        up = GaugeMetricFamily(
            "headway_backend_up",
            "1 while a backend can be sent requests (its last connection succeeded and, polled, its /metrics "
            "tell its load), else 0",
            labels=["backend"],
        )
        for url, n in self._backend_up():
            up.add_metric([url], n)
        yield up
        bias = self._drift_bias() if self._drift_bias is not None else {}
        if bias:  # a DriftSched (tenant-*) policy: its learned B_runtime, this replica's
            b = GaugeMetricFamily(
                "headway_driftsched_runtime_bias",
                "DriftSched's learned drift correction B_runtime per prompt category (this replica's)",
                labels=["category"],
            )
            for category, value in bias.items():
                b.add_metric([category], value)
            yield b


class GatewayMetrics:
    """Counters and histograms the gateway updates, plus live gauges."""

    def __init__(
        self,
        queue_lengths: Callable[[], Iterable[tuple[str, str, int]]],
        in_flight: Callable[[], Iterable[tuple[str, int]]],
        backend_up: Callable[[], Iterable[tuple[str, int]]] = tuple,
        drift_bias: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LiveCollector(queue_lengths, in_flight, backend_up, drift_bias))
        self.wait_time = Histogram(
            "headway_queue_wait_seconds",
            "Time from arrival to the first dispatch, or to the end of a request that left the queue undispatched",
            ["tenant", "tier"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.score_wait = Histogram(
            "headway_score_wait_seconds",
            "Time from arrival until the prompt's length score is there (with a scorer)",
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.score_fallbacks = Counter(
            "headway_score_fallbacks",
            "Requests given the fallback score (with a scorer): the scorer failed or gave no finite score "
            "(scorer_error), or the prompt has no text to score (no_text)",
            ["reason"],
            registry=self.registry,
        )
        self.unscored_dispatches = Counter(
            "headway_unscored_dispatches",
            "Requests dispatched at once, scored in the background: nothing competed with them (scorer_fast_path)",
            registry=self.registry,
        )
        self.dispatches = Counter(
            "headway_dispatches",
            "Requests sent to a backend, each attempt once (not one whose connection failed: see headway_retries)",
            ["backend"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "headway_rejections",
            "Requests refused or ended by the gateway (tenant and tier empty before the caller is known)",
            ["reason", "tenant", "tier"],
            registry=self.registry,
        )
        self.finished = Counter(
            "headway_requests_finished",
            "Requests completed successfully",
            ["tenant", "tier"],
            registry=self.registry,
        )
        self.retries = Counter(
            "headway_retries", "Requests retried on another backend", ["backend"], registry=self.registry
        )
        self.ttft = Histogram(
            "headway_time_to_first_token_seconds",
            "Time from arrival at the gateway to the first streamed token (queueing included)",
            ["model", "priority", "tenant", "tier"],
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "headway_e2e_request_latency_seconds",
            "Time from arrival at the gateway to the end of the answer (queueing included)",
            ["model", "priority", "tenant", "tier"],
            buckets=_E2E_BUCKETS,
            registry=self.registry,
        )
        self._models = _Bounded()
        self._priorities = _Bounded()

    def reject(self, reason: str, response: _R, req: Request | Identity | None = None) -> _R:
        """Count a request ended by the gateway (``headway_rejections{reason,tenant,tier}``, the tenant
        and tier of ``req``, a request or its caller's identity; empty when not known yet); returns
        ``response``."""
        self.rejected(reason, req)
        return response

    def rejected(self, reason: str, req: Request | Identity | None = None) -> None:
        """:meth:`reject` without a response to return."""
        if req is None:
            self.rejections.labels(reason, "", "").inc()
        elif isinstance(req, Request):
            self.rejections.labels(reason, req.tenant_id, req.tier.name.lower()).inc()
        else:
            self.rejections.labels(reason, req.tenant, req.tier.name.lower()).inc()

    def observe_latency(
        self, model: str, priority: int, e2e: float, ttft: float | None, tenant: str = "", tier: str = ""
    ) -> None:
        """A finished request: its E2E latency, and its TTFT when it was streamed, by model, priority,
        tenant and tier (tenants and tiers come from the gateway's configuration, not from clients)."""
        labels = (self._models(model), self._priorities(str(priority)), tenant, tier)
        self.e2e.labels(*labels).observe(e2e)
        if ttft is not None:
            self.ttft.labels(*labels).observe(ttft)

    def render(self, tenant: str | None = None) -> bytes:
        """Prometheus text; with ``tenant``, only the series labelled with that tenant."""
        if tenant is None:
            return generate_latest(self.registry)
        return generate_latest(_TenantView(self.registry, tenant))


class _TenantView:
    """A registry-like view of one tenant's series (what a tenant's API key may read)."""

    def __init__(self, registry: CollectorRegistry, tenant: str) -> None:
        self._registry = registry
        self._tenant = tenant

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.labels.get("tenant") == self._tenant]
            if samples:
                out = Metric(family.name, family.documentation, family.type, family.unit)
                out.samples = samples
                yield out
