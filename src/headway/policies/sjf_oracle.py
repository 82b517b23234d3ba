"""Shortest job first with the true output length (an upper bound for predictors)."""

from __future__ import annotations

from headway.core import Policy, PolicyKey, Request, register_policy


@register_policy("sjf-oracle")
class SJFOraclePolicy(Policy):
    """Waiting queue ordered by true output length; non-preemptive."""

    oracle = True

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.true_output_tokens(request),)
