"""PARS: prompt-aware ranking with starvation prevention (Tao et al., 2025)."""

from __future__ import annotations

from typing import Any

from headway.core import PolicyKey, Request, register_policy
from headway.policies._base import ScoredPolicy, check_positive

__all__ = ["PARSPolicy"]


@register_policy("pars")
class PARSPolicy(ScoredPolicy):
    """Waiting queue by ascending predicted score, with starvation prevention.

    Key: ``(1, score)`` normally; once a request has waited ``starvation_threshold``
    seconds (default 120 s, the PARS default) since arrival it is *promoted* to
    ``(0, arrival_time)``: ahead of every unpromoted request, FCFS among promoted ones.
    Non-preemptive (as PARS in vLLM: it reorders the waiting queue only).

    The promotion time is fixed at arrival, so the key is time-invariant except at
    that instant, which :meth:`rekey_at_time` announces to the engine.
    Scores: see :class:`~headway.policies._base.ScoredPolicy` (``scorer``, ``tau``...).
    """

    def __init__(
        self,
        *,
        starvation_threshold: float = 120.0,
        **scoring: Any,
    ) -> None:
        super().__init__(**scoring)  # scorer and the noisy oracle's settings (see ScoredPolicy)
        self.starvation_threshold = check_positive("starvation_threshold", starvation_threshold, "pars")

    def key(self, request: Request, now: float) -> PolicyKey:
        if now >= request.arrival_time + self.starvation_threshold:
            return (0, request.arrival_time)
        return (1, self.score_of(request))

    def rekey_at_time(self, request: Request) -> float | None:
        return request.arrival_time + self.starvation_threshold
