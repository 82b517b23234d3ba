"""First come, first served: vLLM's default order."""

from __future__ import annotations

from headway.core import Policy, PolicyKey, Request, register_policy


@register_policy("fcfs")
class FCFSPolicy(Policy):
    """Order by arrival time; never preempts to reorder (memory pressure evicts the latest)."""

    arrival_deque = True

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.arrival_time,)
