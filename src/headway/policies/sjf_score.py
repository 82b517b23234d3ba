"""SJF on a predicted score: the pointwise- and listwise-predictor baselines of PARS."""

from __future__ import annotations

from headway.core import PolicyKey, Request, register_policy
from headway.policies._base import ScoredPolicy

__all__ = ["SJFScorePolicy"]


@register_policy("sjf-score")
class SJFScorePolicy(ScoredPolicy):
    """Key ``(score,)``: shortest predicted job first, non-preemptive, no starvation guard.

    Which predictor (pointwise regression, listwise ranker, noisy oracle at some tau)
    is a matter of the scorer: see :class:`~headway.policies._base.ScoredPolicy`.
    """

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.score_of(request),)
