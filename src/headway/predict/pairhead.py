"""A linear ranking head fitted on pairs (RankNet's logistic loss) over frozen prompt features.

Where :func:`~headway.predict.head.fit_ridge` regresses rank-normal targets, :func:`fit_pairwise` only
asks that, inside one group (one model's answers on one source), the longer answer of a pair score
higher, and only for pairs whose lengths differ by at least a relative ``delta`` (PARS's pair filter,
:func:`~headway.predict.data.make_pairs`). Pairs never cross groups: lengths of different models or
sources are not compared. The objective is convex (the weighted mean of ``log(1 + exp(-(s_a - s_b)))``
over pairs with ``a`` the longer, plus ``alpha / n`` times the squared weights on standardized
features, ``n`` the training prompts, as in ridge); L-BFGS from zero weights solves it the same way
on every run. The result is a :class:`~headway.predict.head.RidgeHead` (a linear head; its bias is 0,
irrelevant to a ranking), so it scores, saves and packs like the ridge heads. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from headway.predict.data import DEFAULT_DELTA, make_pairs
from headway.predict.head import RidgeHead

__all__ = ["PairGroup", "fit_pairwise", "pairwise_objective"]

_F64 = npt.NDArray[np.float64]
PairGroup = tuple[_F64, _F64, float]
"""One group's ``(features (n, d), lengths (n,), weight)``; the group's pairs share ``weight``."""


def pairwise_objective(
    w: _F64, z: _F64, longer: npt.NDArray[np.int64], shorter: npt.NDArray[np.int64], pair_w: _F64, l2: float
) -> tuple[float, _F64]:
    """``(value, gradient)`` of ``sum_p pair_w[p] * log(1 + exp(-(z[longer[p]] - z[shorter[p]]) @ w)) + l2 * |w|^2``."""
    from scipy.special import expit

    s = z @ w
    margin = s[longer] - s[shorter]
    value = float(pair_w @ np.logaddexp(0.0, -margin) + l2 * (w @ w))
    g = -pair_w * expit(-margin)
    grad_s = np.bincount(longer, weights=g, minlength=len(z)) - np.bincount(shorter, weights=g, minlength=len(z))
    grad: _F64 = z.T @ grad_s + 2.0 * l2 * w
    return value, grad


def fit_pairwise(
    groups: Sequence[PairGroup],
    *,
    kind: str,
    alpha: float = 10.0,
    delta: float = DEFAULT_DELTA,
    partners: int = 16,
    seed: int = 0,
    max_iter: int = 500,
) -> RidgeHead:
    """Fit on each group's pairs (up to ``partners`` per prompt, drawn with ``seed``; gap >= ``delta``).

    Inside a group every pair weighs the same; a group's pairs weigh its ``weight`` in all. Features
    are standardized by their prompt-weighted mean and spread (a prompt weighing its group's weight
    over the group's size). ValueError when no group yields a pair, or on a bad ``alpha`` or weight."""
    from scipy.optimize import minimize

    if not alpha > 0:
        raise ValueError(f"fit_pairwise: alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    xs: list[_F64] = []
    longer: list[npt.NDArray[np.int64]] = []
    shorter: list[npt.NDArray[np.int64]] = []
    pair_w: list[_F64] = []
    row_w: list[_F64] = []
    offset = 0
    for x, lengths, weight in groups:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(lengths, dtype=np.float64)
        if x.ndim != 2 or len(x) != len(y):
            raise ValueError(f"fit_pairwise: need (n, d) features and n lengths, got {x.shape} and {y.shape}")
        if not weight >= 0:
            raise ValueError(f"fit_pairwise: group weights must be >= 0, got {weight}")
        pairs = make_pairs(y, partners=partners, delta=delta, seed=rng)
        xs.append(x)
        row_w.append(np.full(len(y), weight / max(len(y), 1)))
        if len(pairs) and weight > 0:
            a_longer = pairs[:, 2] == 1
            longer.append(np.where(a_longer, pairs[:, 0], pairs[:, 1]) + offset)
            shorter.append(np.where(a_longer, pairs[:, 1], pairs[:, 0]) + offset)
            pair_w.append(np.full(len(pairs), weight / len(pairs)))
        offset += len(y)
    if not pair_w:
        raise ValueError("fit_pairwise: no pair of answers differs enough to train on")
    x_all, w_rows = np.vstack(xs), np.concatenate(row_w)
    if not w_rows.sum() > 0:
        w_rows = np.ones(len(x_all))
    mean = (w_rows @ x_all) / w_rows.sum()
    scale = np.sqrt((w_rows @ (x_all - mean) ** 2) / w_rows.sum())
    scale[scale < 1e-12] = 1.0
    z = (x_all - mean) / scale
    a, b, pw = np.concatenate(longer), np.concatenate(shorter), np.concatenate(pair_w)
    pw = pw / pw.sum()
    l2 = float(alpha) / len(x_all)
    res = minimize(
        pairwise_objective,
        np.zeros(z.shape[1]),
        args=(z, a, b, pw, l2),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter},
    )
    return RidgeHead(kind, mean, scale, np.asarray(res.x, dtype=np.float64), 0.0, float(alpha), len(x_all))
