"""Engine configuration for the simulator: one frozen dataclass per concern."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from headway.sim._cost import CostModel

__all__ = ["CacheConfig", "SchedulerConfig"]


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_flag(value: object) -> bool:
    return isinstance(value, bool)


def _check_types(
    config: SchedulerConfig | CacheConfig, ints: tuple[str, ...], flags: tuple[str, ...], reals: tuple[str, ...]
) -> None:
    """A TypeError naming the field for a value of the wrong type (``max_num_seqs=2.5``, ``"256"``,
    ``enable_chunked_prefill="no"``), before a range check compares it or a run uses it; ``None``
    passes where the field may be None (its "unset"), an integer passes where a float is expected."""
    kind = type(config).__name__
    optional = {f.name for f in dataclasses.fields(config) if "None" in str(f.type)}
    checks: tuple[tuple[tuple[str, ...], str, Callable[[object], bool]], ...] = (
        (ints, "an int", _is_int),
        (flags, "a bool", _is_flag),
        (reals, "a number", _is_real),
    )
    for names, want, ok in checks:
        for name in names:
            value = getattr(config, name)
            if not (value is None and name in optional) and not ok(value):
                raise TypeError(f"{kind}.{name} must be {want}, got {type(value).__name__} {value!r}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Iteration-level batching limits, as vLLM V1's ``SchedulerConfig``."""

    max_num_batched_tokens: int = 8192
    """Token budget of one engine step (prefill chunks + one token per decode)."""
    max_num_seqs: int = 256
    """Most requests running at once."""
    max_model_len: int | None = None
    """vLLM's ``--max-model-len``, the model's context length: a prompt of this many tokens or more
    is refused before it reaches the engine (vLLM's API server answers 400, "This model's maximum
    context length is ..."), and an output stops where prompt and output reach it. None: as many
    tokens as the KV cache holds (and, with chunked prefill off, as the token budget), as before;
    a length the KV cache cannot hold fails as vLLM fails to start."""
    max_num_active_seqs: int | None = None
    """vLLM's option of this name: most requests admitted into the running set, when lower than
    ``max_num_seqs`` (which then only sizes the model runner); None: ``max_num_seqs``."""
    enable_chunked_prefill: bool = True
    """Split prompts across steps to fit the budget (else a prompt must fit whole)."""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    """How an evicted request keeps its KV: dropped and recomputed, or swapped to host."""
    scheduler_reserve_full_isl: bool = True
    """Admit a waiting request only if the free KV blocks hold its whole sequence so far (prompt,
    and the outputs of a resumed one, less its prefix-cache hit), not only its first chunk's, as
    vLLM's option of this name (on by default since vLLM 0.32)."""
    watermark: float = 0.0
    """vLLM's option of this name: the fraction of the KV cache's blocks (vLLM's null block counted)
    a waiting or preempted request must leave free to be admitted while another request runs
    (0: none, vLLM's default). Running requests' blocks are not held to it."""
    max_num_queued_reqs: int | None = None
    """vLLM's option of this name (its API server's): a request that arrives while this many are
    unfinished (waiting or running) is rejected (HTTP 503) and never reaches the engine (None: no
    limit, vLLM's default)."""
    max_num_queued_tokens: int | None = None
    """vLLM's option of this name (its API server's): a request that arrives while the requests
    without a first token yet hold this many prompt tokens or more is rejected (HTTP 503), counted
    whole whatever is computed or cached, as vLLM's server counts them (None: no limit)."""
    long_prefill_token_threshold: int = 0
    """vLLM's option of this name: with chunked prefill, no request gets more than this many prompt
    tokens in a step while another request is running or waiting (0: no cap, vLLM's default)."""
    long_prefill_token_threshold_adaptive: bool = False
    """vLLM's option of this name: the cap is at least the token budget divided by the requests
    running and waiting as the step is planned."""
    async_scheduling: bool = False
    """vLLM's ``--async-scheduling`` (its default on GPUs since 0.32; off here, the synchronous
    ``Scheduler``'s decisions): each step is planned while the one before it runs, so the plan
    cannot see what that step's output changes: a request finishing in it still holds its slot
    and KV blocks (a KV shortage may pick it as its victim; it gets no token, or one more if it
    stopped on its own, not at ``max_tokens``) and a request arriving while it runs waits for the
    plan after. A plan that schedules nothing costs no time: the engine waits for the step in
    flight and plans again."""
    max_steps_per_event: int = 1 << 30
    """Cap on decode steps advanced in closed form at once; 1 = exact step-by-step mode."""

    @property
    def active_seqs(self) -> int:
        """The admission limit of the running set: ``max_num_active_seqs``, else ``max_num_seqs``."""
        return self.max_num_seqs if self.max_num_active_seqs is None else self.max_num_active_seqs

    def __post_init__(self) -> None:
        _check_types(
            self,
            ints=("max_num_batched_tokens", "max_num_seqs", "max_model_len", "max_num_active_seqs",
                  "max_num_queued_reqs", "max_num_queued_tokens", "long_prefill_token_threshold",
                  "max_steps_per_event"),
            flags=("enable_chunked_prefill", "scheduler_reserve_full_isl", "long_prefill_token_threshold_adaptive",
                   "async_scheduling"),
            reals=("watermark",),
        )  # fmt: skip
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}) so every running decode fits a step"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        limit = self.max_model_len
        if limit is not None and not self.enable_chunked_prefill and self.max_num_batched_tokens < limit:
            raise ValueError(  # vLLM's own check
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_model_len ({limit}): "
                "without chunked prefill a prompt must fit one step; increase max_num_batched_tokens or decrease "
                "max_model_len"
            )
        if self.max_num_active_seqs is not None and not 1 <= self.max_num_active_seqs <= self.max_num_seqs:
            raise ValueError(
                f"max_num_active_seqs must be between 1 and max_num_seqs ({self.max_num_seqs}), "
                f"got {self.max_num_active_seqs}"
            )
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            limit = getattr(self, name)
            if limit is not None and limit < 0:
                raise ValueError(f"{name} must be >= 0, got {limit}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ValueError("long_prefill_token_threshold caps prefill chunks: it needs chunked prefill")
        if self.max_steps_per_event < 1:
            raise ValueError(f"max_steps_per_event must be >= 1, got {self.max_steps_per_event}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Paged KV cache geometry."""

    block_size: int = 16
    """Tokens per KV block."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the engine may use (weights + activations + KV)."""
    num_gpu_blocks: int | None = None
    """Override the capacity computed from the cost model's memory figures."""
    enable_prefix_caching: bool = True
    """vLLM V1's automatic prefix caching (on by default there too): full blocks are keyed by
    the requests' chained block hashes, a new request reuses the computed blocks of its longest
    cached prefix, and freed blocks stay cached until an allocation reuses them (LRU)."""

    def __post_init__(self) -> None:
        _check_types(
            self,
            ints=("block_size", "num_gpu_blocks"),
            flags=("enable_prefix_caching",),
            reals=("gpu_memory_utilization",),
        )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")

    def blocks(self, cost: CostModel) -> int:
        """The KV blocks of an engine on ``cost``'s hardware: ``num_gpu_blocks``, else what its memory holds."""
        return self.num_gpu_blocks or cost.num_gpu_blocks(self.gpu_memory_utilization, self.block_size)

    def check_model_len(self, scheduler: SchedulerConfig, cost: CostModel) -> None:
        """vLLM refuses to start when its KV cache cannot hold one sequence of ``max_model_len``: so does this."""
        limit = scheduler.max_model_len
        blocks = self.blocks(cost)
        if limit is not None and limit > blocks * self.block_size:
            raise ValueError(
                f"max_model_len {limit:,} does not fit the KV cache on {cost.name}: {blocks:,} blocks of "
                f"{self.block_size} tokens hold {blocks * self.block_size:,} (vLLM would not start: lower "
                "max_model_len, or give the cache more blocks)"
            )
