"""Prometheus metrics of one gateway app (its own CollectorRegistry)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["GatewayMetrics"]

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _LiveCollector(Collector):
    """Gauges read from the dispatcher at scrape time (no bookkeeping on the hot path)."""

    def __init__(
        self,
        queue_lengths: Callable[[], Iterable[tuple[str, str, int]]],
        in_flight: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        self._queue_lengths = queue_lengths
        self._in_flight = in_flight

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


class GatewayMetrics:
    """Counters and histograms the gateway updates, plus live gauges."""

    def __init__(
        self,
        queue_lengths: Callable[[], Iterable[tuple[str, str, int]]],
        in_flight: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LiveCollector(queue_lengths, in_flight))
        self.wait_time = Histogram(
            "headway_queue_wait_seconds",
            "Time from arrival to dispatch",
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
        self.dispatches = Counter(
            "headway_dispatches", "Requests dispatched to a backend", ["backend"], registry=self.registry
        )
        self.rejections = Counter(
            "headway_rejections",
            "Requests refused or ended by the gateway",
            ["reason"],
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
