"""A backend's own load, read from its Prometheus ``/metrics`` (vLLM and SGLang names).

The gateway admits requests to a backend while the backend itself says it has room: nothing
waiting in its own queue beyond ``max_waiting`` and its KV cache below ``max_kv_usage``
(:meth:`headway.serve._dispatch.Backend.has_room`). This module turns a ``/metrics`` page into
those two numbers, with prometheus_client's own text parser.

======================  ==============================  =====================
engine                  waiting requests                KV-cache usage (0..1)
======================  ==============================  =====================
vLLM (V1)               ``vllm:num_requests_waiting``   ``vllm:kv_cache_usage_perc``
vLLM (before 0.10)      ``vllm:num_requests_waiting``   ``vllm:gpu_cache_usage_perc``
SGLang                  ``sglang:num_queue_reqs``       ``sglang:token_usage``
======================  ==============================  =====================

Waiting counts are summed over series (one per model or data-parallel rank); KV usage is the
largest of them (the fullest rank decides whether more fits).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["KV_USAGE_METRICS", "WAITING_METRICS", "BackendLoad", "parse_backend_load"]

WAITING_METRICS: frozenset[str] = frozenset({"vllm:num_requests_waiting", "sglang:num_queue_reqs"})
"""Gauges of requests waiting in an engine's own queue (summed over series)."""
KV_USAGE_METRICS: frozenset[str] = frozenset(
    {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}
)
"""Gauges of an engine's KV-cache usage as a fraction 0..1 (the largest series counts)."""


class MetricsFormatError(ValueError):
    """The page is not Prometheus text, or has none of the known load gauges."""


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """What a backend's ``/metrics`` say about its load."""

    waiting: float
    """Requests waiting in the engine's own queue."""
    kv_usage: float
    """KV-cache usage, 0..1."""


def parse_backend_load(text: str) -> BackendLoad:
    """The waiting count and KV usage on a ``/metrics`` page (vLLM or SGLang).

    Raises :class:`MetricsFormatError` (a ValueError) when the page does not parse, or names
    neither a waiting nor a KV-usage gauge: a backend whose metrics say nothing is not taken to
    be idle."""
    waiting = kv = 0.0
    found = False
    try:
        for family in text_string_to_metric_families(text):
            if family.name in WAITING_METRICS:
                found = True
                waiting += sum(s.value for s in family.samples if s.name == family.name)
            elif family.name in KV_USAGE_METRICS:
                found = True
                kv = max([kv, *(s.value for s in family.samples if s.name == family.name)])
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsFormatError(f"not Prometheus text: {exc}") from None
    if not found:
        raise MetricsFormatError(
            f"no load gauge among the metrics (looked for {sorted(WAITING_METRICS | KV_USAGE_METRICS)})"
        )
    return BackendLoad(waiting, kv)
