"""vLLM's priority scheduling: lower integer priority first, then arrival time."""

from __future__ import annotations

from headway.core import Policy, PolicyKey, Request, register_policy


@register_policy("priority")
class PriorityPolicy(Policy):
    """``(priority, arrival_time)``, as ``--scheduling-policy priority`` in vLLM."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.priority, request.arrival_time)
