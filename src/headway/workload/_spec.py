"""What a workload is: requests with arrival times and their (hidden) true output lengths."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from headway.core import Request, Tier

__all__ = ["RequestSpec", "Workload"]

DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` a request carries when the workload does not say (a client-side cap)."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, including the output length the engine will produce.

    ``num_output_tokens`` is ground truth: engines hand it only to oracle policies.
    """

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int | None = None
    tenant_id: str = "default"
    tier: Tier = Tier.STANDARD
    priority: int = 0
    prompt: str | None = None
    category: str | None = None
    score: float | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: num_prompt_tokens must be > 0, got {self.num_prompt_tokens}"
            )
        if self.num_output_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: num_output_tokens must be > 0, got {self.num_output_tokens}"
            )
        if not (self.arrival_time >= 0.0 and math.isfinite(self.arrival_time)):
            raise ValueError(
                f"request {self.request_id!r}: arrival_time must be finite and >= 0, got {self.arrival_time}"
            )
        if self.max_tokens is not None and self.max_tokens < self.num_output_tokens:
            raise ValueError(
                f"request {self.request_id!r}: max_tokens {self.max_tokens} < output length {self.num_output_tokens}"
            )

    def to_request(self) -> Request:
        """A fresh :class:`Request` without the true output length."""
        max_tokens = self.max_tokens
        if max_tokens is None:
            max_tokens = max(DEFAULT_MAX_TOKENS, self.num_output_tokens)
        return Request(
            request_id=self.request_id,
            arrival_time=self.arrival_time,
            num_prompt_tokens=self.num_prompt_tokens,
            max_tokens=max_tokens,
            tenant_id=self.tenant_id,
            tier=self.tier,
            priority=self.priority,
            prompt=self.prompt,
            category=self.category,
            score=self.score,
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """An ordered collection of :class:`RequestSpec` (sorted by arrival, ties by position)."""

    name: str
    requests: tuple[RequestSpec, ...]
    meta: dict[str, object] = field(default_factory=dict, compare=False)

    @classmethod
    def from_specs(cls, name: str, specs: Sequence[RequestSpec], meta: dict[str, object] | None = None) -> Workload:
        ids = set()
        for spec in specs:
            if spec.request_id in ids:
                raise ValueError(f"workload {name!r}: duplicate request_id {spec.request_id!r}")
            ids.add(spec.request_id)
        ordered = sorted(enumerate(specs), key=lambda p: (p[1].arrival_time, p[0]))
        return cls(name, tuple(s for _, s in ordered), dict(meta or {}))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    @property
    def duration(self) -> float:
        """Span of arrival times (0 for a burst)."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_time - self.requests[0].arrival_time
