"""Sarathi-Serve: FCFS with chunked prefill and stall-free batching (Agrawal et al., OSDI'24)."""

from __future__ import annotations

from typing import ClassVar

from headway.core import Policy, PolicyKey, Request, register_policy

__all__ = ["SarathiPolicy"]


@register_policy("sarathi")
class SarathiPolicy(Policy):
    """FCFS order; the batching half of Sarathi lives in the engine.

    Stall-free batching means: every step first schedules one token for each running
    decode, then fills the remaining token budget with prefill *chunks*, so a long
    prompt never stalls ongoing decodes. headway's engines (the simulator, vLLM V1)
    already build steps this way when chunked prefill is on, so the policy only
    supplies the order and states the engine settings it assumes:
    ``enable_chunked_prefill=True`` and a token budget of ``token_budget`` (default: the
    Sarathi-Serve paper's chunk size for 7-8B models on A100, 512 tokens; larger
    budgets trade decode latency for prefill throughput). The simulator and the vLLM
    plugin cap their step's token budget at it; without chunked prefill they refuse
    the policy.
    """

    requires_chunked_prefill: ClassVar[bool] = True

    def __init__(self, token_budget: int = 512) -> None:
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise ValueError(f"sarathi: token_budget must be a positive integer, got {token_budget!r}")
        self.token_budget = token_budget

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.arrival_time,)
