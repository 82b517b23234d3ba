"""Shortest remaining processing time with the true output length, preemptive."""

from __future__ import annotations

from headway.core import Policy, PolicyKey, Request, register_policy


@register_policy("srpt-oracle")
class SRPTOraclePolicy(Policy):
    """Key = true remaining output tokens; a shorter arrival displaces a longer runner.

    A running request's remaining work only shrinks, so its key only improves between
    engine events: no rekey hint is needed (``rekey_after_tokens`` stays None).
    """

    oracle = True
    preemptive = True
    displacement = "pause"
    displacement_source = (
        "TRAIL (Shahout et al., ICLR'25), whose SRPT-style preemption keeps a preempted request's KV "
        "cache in GPU memory; this is TRAIL with perfect lengths and no preemption limit"
    )

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.true_output_tokens(request) - request.num_output_tokens,)
