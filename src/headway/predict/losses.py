"""The three training objectives, on score tensors (higher score = longer output).

* pairwise: margin ranking loss (PARS), ``max(0, margin - y * (s_a - s_b))`` with ``y = +1`` when ``a``
  is longer;
* pointwise: mean squared error on standardized log length;
* listwise: ListMLE (vllm-ltr), the negative log-likelihood of the true longest-first order under a
  Plackett-Luce model of the scores, divided by the list length.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["LOSSES", "list_mle_loss", "margin_ranking_loss", "pointwise_loss"]

LOSSES: tuple[str, ...] = ("pairwise", "pointwise", "listwise")


def margin_ranking_loss(
    scores_a: torch.Tensor, scores_b: torch.Tensor, a_longer: torch.Tensor, margin: float = 1.0
) -> torch.Tensor:
    """Mean of ``max(0, margin - y (s_a - s_b))``; ``a_longer`` holds 1/0 (or +1/-1) per pair."""
    y = torch.where(a_longer > 0, 1.0, -1.0).to(scores_a.dtype)
    return F.margin_ranking_loss(scores_a, scores_b, y, margin=margin)


def pointwise_loss(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error between scores and (standardized log-length) targets."""
    return F.mse_loss(scores, targets.to(scores.dtype))


def list_mle_loss(
    scores: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """ListMLE: ``(1/n) * sum_i [logsumexp(s_{pi_i}, ..., s_{pi_n}) - s_{pi_i}]`` where ``pi`` sorts the
    true lengths longest first (ties in a random order drawn from ``generator``)."""
    if scores.ndim != 1 or scores.shape != lengths.shape:
        raise ValueError(f"list_mle_loss: scores {tuple(scores.shape)} and lengths {tuple(lengths.shape)}")
    n = scores.shape[0]
    if n == 0:
        return scores.sum()
    shuffle = torch.randperm(n, generator=generator, device=scores.device)
    order = shuffle[torch.argsort(lengths[shuffle], descending=True, stable=True)]
    s = scores[order]
    tail_lse = torch.logcumsumexp(s.flip(0), dim=0).flip(0)
    return (tail_lse - s).sum() / n
