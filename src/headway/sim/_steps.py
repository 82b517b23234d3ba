"""A record of each engine step's decisions, for comparing the simulator with vLLM step by step."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepRecord"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one planned step (``num_steps`` decode steps in a fast-forward stretch) decided.

    Read it in step-by-step mode (``SchedulerConfig.max_steps_per_event = 1``), where every
    record is one ``schedule()`` call of vLLM's scheduler.
    """

    time: float
    """When the step started."""
    scheduled: tuple[tuple[str, int], ...]
    """(request id, tokens scheduled) of every request in the step: decoders (1 token each)
    first, in the order they started decoding, then the prefilling ones in admission order."""
    preempted: tuple[str, ...]
    """Requests taken out of the batch while the step was planned (evicted or paused), in order."""
    cached_tokens: tuple[tuple[str, int], ...]
    """(request id, tokens found in the prefix cache) of the requests that looked it up and were
    admitted in this step (hits of 0 included)."""
    num_steps: int = 1
    """Engine steps this record covers (1 in step-by-step mode)."""
