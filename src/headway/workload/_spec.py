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
    block_hashes: tuple[int, ...] = ()
    """Chained block hashes of its tokens (see :attr:`headway.core.Request.block_hashes`)."""
    hash_block_size: int = 16
    """Tokens per entry of ``block_hashes``."""
    hashed_tokens: int | None = None
    """The tokens ``block_hashes`` cover (see :attr:`headway.core.Request.hashed_tokens`)."""
    after: str | None = None
    """Closed-loop arrival: the ``request_id`` of the request this one follows, such as the
    previous turn of a conversation (it must come earlier in the workload). Simulated, it arrives
    ``think_time`` seconds after that one finishes (or is aborted); ``arrival_time`` then only
    places it in the workload's order."""
    think_time: float = 0.0
    """Seconds between the end of ``after`` and this request's arrival."""
    timeout: float | None = None
    """Simulated, the client aborts the request this many seconds after it arrives if it has not
    finished by then (an HTTP client's timeout): it leaves the queue or the batch and is counted
    as aborted, not in the latencies."""
    model: str | None = None
    """The model the request was sent to, when its log says (a prompt log's ``model``):
    ``headway bench serve --workload-models`` sends it under that name."""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: num_prompt_tokens must be > 0, got {self.num_prompt_tokens}"
            )
        if self.num_output_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: num_output_tokens must be > 0, got {self.num_output_tokens}"
            )
        if self.timeout is not None and not (self.timeout >= 0.0 and math.isfinite(self.timeout)):
            raise ValueError(f"request {self.request_id!r}: timeout must be finite and >= 0, got {self.timeout}")
        if not (self.think_time >= 0.0 and math.isfinite(self.think_time)):
            raise ValueError(f"request {self.request_id!r}: think_time must be finite and >= 0, got {self.think_time}")
        if self.hash_block_size < 1:
            raise ValueError(f"request {self.request_id!r}: hash_block_size must be >= 1, got {self.hash_block_size}")
        if self.hashed_tokens is not None and self.hashed_tokens < 0:
            raise ValueError(f"request {self.request_id!r}: hashed_tokens must be >= 0, got {self.hashed_tokens}")
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
            block_hashes=self.block_hashes,
            hash_block_size=self.hash_block_size,
            hashed_tokens=self.hashed_tokens,
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
        seen: set[str] = set()
        for _, spec in ordered:
            if spec.after is not None and spec.after not in seen:
                raise ValueError(
                    f"workload {name!r}: request {spec.request_id!r} follows {spec.after!r}, which is not "
                    "an earlier request of the workload"
                )
            seen.add(spec.request_id)
        return cls(name, tuple(s for _, s in ordered), dict(meta or {}))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    @property
    def skipped_note(self) -> str | None:
        """How many records of the source gave no request, and why (a dataset reader's
        ``meta["skipped"]`` and ``meta["skipped_why"]``), or None when none was skipped."""
        skipped = self.meta.get("skipped")
        if not skipped:
            return None
        return f"{skipped} record{'s' if skipped != 1 else ''} of {self.name} skipped: {self.meta.get('skipped_why')}"

    @property
    def duration(self) -> float:
        """Span of arrival times (0 for a burst)."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_time - self.requests[0].arrival_time
