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

:func:`fit_pairwise_mlp` fits one hidden layer (ReLU) on the same pairs with torch (full-batch Adam,
seeded); the :class:`MlpHead` it returns scores with numpy. It is not convex, and it does not pack into
the shipped predictor (a linear head over the encoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headway.predict.data import DEFAULT_DELTA, make_pairs
from headway.predict.head import RidgeHead

__all__ = ["MLP_EPOCHS", "MLP_HIDDEN", "MlpHead", "PairGroup", "fit_pairwise", "fit_pairwise_mlp", "pairwise_objective"]

MLP_HIDDEN = 64
MLP_EPOCHS = 300
"""Full-batch Adam steps (learning rate 0.01) of :func:`fit_pairwise_mlp`."""

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


@dataclass(frozen=True)
class _Pairs:
    x: _F64
    mean: _F64
    scale: _F64
    longer: npt.NDArray[np.int64]
    shorter: npt.NDArray[np.int64]
    weights: _F64
    """Pair weights, summing to 1."""

    @property
    def z(self) -> _F64:
        out: _F64 = (self.x - self.mean) / self.scale
        return out


def _pairs(groups: Sequence[PairGroup], delta: float, partners: int, seed: int) -> _Pairs:
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
    pw = np.concatenate(pair_w)
    return _Pairs(x_all, mean, scale, np.concatenate(longer), np.concatenate(shorter), pw / pw.sum())


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
    p = _pairs(groups, delta, partners, seed)
    l2 = float(alpha) / len(p.x)
    res = minimize(
        pairwise_objective,
        np.zeros(p.x.shape[1]),
        args=(p.z, p.longer, p.shorter, p.weights, l2),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter},
    )
    return RidgeHead(kind, p.mean, p.scale, np.asarray(res.x, dtype=np.float64), 0.0, float(alpha), len(p.x))


@dataclass(frozen=True)
class MlpHead:
    """``score(X) = relu(((X - mean) / scale) @ w1 + b1) @ w2``; ``features`` names the feature set."""

    features: str
    mean: _F64
    scale: _F64
    w1: _F64
    b1: _F64
    w2: _F64
    decay: float
    n_train: int

    def score(self, features: _F64 | npt.NDArray[np.float32]) -> _F64:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.mean):
            raise ValueError(f"MlpHead.score: expected (n, {len(self.mean)}) features, got {x.shape}")
        out: _F64 = np.maximum(((x - self.mean) / self.scale) @ self.w1 + self.b1, 0.0) @ self.w2
        return out


def fit_pairwise_mlp(
    groups: Sequence[PairGroup],
    *,
    kind: str,
    decay: float = 0.01,
    hidden: int = MLP_HIDDEN,
    epochs: int = MLP_EPOCHS,
    delta: float = DEFAULT_DELTA,
    partners: int = 16,
    seed: int = 0,
) -> MlpHead:
    """One hidden layer on the pairs of :func:`fit_pairwise` (same groups, weights and filter): full-batch
    Adam on the weighted mean of ``log(1 + exp(-(s_a - s_b)))`` plus ``decay`` times the squared weights
    of both layers, from a start drawn with ``seed``."""
    import torch

    if not decay > 0:
        raise ValueError(f"fit_pairwise_mlp: decay must be > 0, got {decay}")
    if hidden < 1 or epochs < 1:
        raise ValueError(f"fit_pairwise_mlp: hidden and epochs must be >= 1, got {hidden} and {epochs}")
    p = _pairs(groups, delta, partners, seed)
    gen = torch.Generator().manual_seed(seed)
    d = p.x.shape[1]
    w1 = (torch.rand(d, hidden, generator=gen) * 2 - 1) / d**0.5
    b1 = (torch.rand(hidden, generator=gen) * 2 - 1) / d**0.5
    w2 = (torch.rand(hidden, generator=gen) * 2 - 1) / hidden**0.5
    params = [t.requires_grad_() for t in (w1, b1, w2)]
    z = torch.from_numpy(p.z.astype(np.float32))
    a, b = torch.from_numpy(p.longer), torch.from_numpy(p.shorter)
    pw = torch.from_numpy(p.weights.astype(np.float32))
    opt = torch.optim.Adam(params, lr=0.01)
    for _ in range(epochs):
        opt.zero_grad()
        s = torch.relu(z @ w1 + b1) @ w2
        loss = (pw * torch.nn.functional.softplus(-(s[a] - s[b]))).sum() + decay * ((w1**2).sum() + (w2**2).sum())
        loss.backward()
        opt.step()
    arrays = [t.detach().numpy().astype(np.float64) for t in (w1, b1, w2)]
    return MlpHead(kind, p.mean, p.scale, arrays[0], arrays[1], arrays[2], float(decay), len(p.x))
