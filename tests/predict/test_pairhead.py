"""The pairwise (RankNet) linear head: its objective's gradient, what it learns, which pairs it uses."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import check_grad

from headway.predict.pairhead import fit_pairwise, fit_pairwise_mlp, pairwise_objective


def _group(seed: int, n: int = 300, signal: int = 0, d: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.exp(x[:, signal] + 0.3 * rng.normal(size=n)) * 100


def test_objective_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(30, 4))
    longer, shorter = rng.integers(0, 30, size=50), rng.integers(0, 30, size=50)
    pw = rng.random(50)
    for l2 in (0.0, 0.3):
        err = check_grad(
            lambda w, l2=l2: pairwise_objective(w, z, longer, shorter, pw, l2)[0],
            lambda w, l2=l2: pairwise_objective(w, z, longer, shorter, pw, l2)[1],
            rng.normal(size=4),
        )
        assert err < 1e-5


def test_learns_the_direction_that_orders_lengths() -> None:
    x, y = _group(1, signal=2)
    head = fit_pairwise([(x, y, 1.0)], kind="text", alpha=1.0)
    w = head.weights / head.scale
    assert np.argmax(np.abs(w)) == 2 and w[2] > 0
    assert abs(w[2]) > 5 * np.max(np.abs(np.delete(w, 2)))
    x2, y2 = _group(2, signal=2)
    assert stats.kendalltau(head.score(x2), y2).statistic > 0.7
    assert head.bias == 0.0 and head.n_train == len(y)


def test_pairs_never_cross_groups() -> None:
    """Group b's answers are all 100x longer than group a's and sit at +3 on dimension 1: pairs across the
    groups would teach dimension 1; inside each group only dimension 0 orders the lengths."""
    xa, ya = _group(3, signal=0)
    xb, yb = _group(4, signal=0)
    xb[:, 1] += 3.0
    head = fit_pairwise([(xa, ya, 1.0), (xb, yb * 100, 1.0)], kind="text", alpha=1.0)
    w = head.weights / head.scale
    assert abs(w[1]) < 0.1 * w[0]


def test_near_ties_give_no_pairs_and_weights_split_by_group() -> None:
    """A group whose lengths differ by < 20 % (all near-ties) adds nothing; with one more group ordered
    by the opposite direction, the group weights decide which wins."""
    xa, ya = _group(5, signal=0)
    xt, _ = _group(6, signal=0)
    ties = 100.0 + 10.0 * (xt[:, 0] > 0)  # 100 vs 110: a 9 % gap, never a pair; would teach +dim 0
    base = fit_pairwise([(xa, ya, 1.0)], kind="text", alpha=1.0)
    xb, yb = _group(7, signal=0)
    with_ties = fit_pairwise([(xa, ya, 1.0), (xt, 1.0 / ties * 1e4, 1.0)], kind="text", alpha=1.0)
    # with the near-ties as pairs (delta 0) the weight on dimension 0 turns negative
    raw = [h.weights[0] / h.scale[0] for h in (base, with_ties)]
    assert raw[0] > 0 and raw[1] == pytest.approx(raw[0], rel=0.3)
    flipped = 1.0 / yb
    a_wins = fit_pairwise([(xa, ya, 3.0), (xb, flipped, 1.0)], kind="text", alpha=1.0)
    b_wins = fit_pairwise([(xa, ya, 1.0), (xb, flipped, 3.0)], kind="text", alpha=1.0)
    assert a_wins.weights[0] > 0 > b_wins.weights[0]


def test_penalty_shrinks_and_fits_repeat_exactly() -> None:
    x, y = _group(8)
    loose = fit_pairwise([(x, y, 1.0)], kind="text", alpha=1.0)
    tight = fit_pairwise([(x, y, 1.0)], kind="text", alpha=1e4)
    assert np.linalg.norm(tight.weights) < 0.5 * np.linalg.norm(loose.weights)
    again = fit_pairwise([(x, y, 1.0)], kind="text", alpha=1.0)
    assert np.array_equal(loose.weights, again.weights)


@pytest.mark.parametrize(
    ("groups", "kwargs", "message"),
    [
        ([(np.zeros((3, 2)), np.array([5.0, 5.2, 5.1]), 1.0)], {}, "no pair of answers differs enough"),
        ([(np.zeros((3, 2)), np.array([1.0, 2.0, 3.0]), 1.0)], {"alpha": 0.0}, "alpha must be > 0, got 0.0"),
        ([(np.zeros((3, 2)), np.array([1.0, 2.0]), 1.0)], {}, r"need \(n, d\) features and n lengths"),
        ([(np.zeros((3, 2)), np.array([1.0, 2.0, 3.0]), -1.0)], {}, "group weights must be >= 0, got -1.0"),
    ],
)
def test_bad_input_is_named(groups: list, kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        fit_pairwise(groups, kind="text", **kwargs)


def test_mlp_learns_an_order_no_linear_head_can() -> None:
    """Lengths grow with |x0|: a linear score ranks them at about 0, one hidden layer of ReLUs does not."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(400, 3))
    y = np.exp(np.abs(x[:, 0]) * 2) * 10
    x2 = rng.normal(size=(300, 3))
    y2 = np.exp(np.abs(x2[:, 0]) * 2) * 10
    mlp = fit_pairwise_mlp([(x, y, 1.0)], kind="text", decay=1e-4, epochs=300)
    linear = fit_pairwise([(x, y, 1.0)], kind="text", alpha=1.0)
    assert stats.kendalltau(mlp.score(x2), y2).statistic > 0.6
    assert abs(stats.kendalltau(linear.score(x2), y2).statistic) < 0.15
    again = fit_pairwise_mlp([(x, y, 1.0)], kind="text", decay=1e-4, epochs=300)
    assert np.array_equal(mlp.score(x2), again.score(x2))  # seeded: the same head on every run
    assert (mlp.w1.shape, mlp.n_train) == ((3, 64), 400)
    with pytest.raises(ValueError, match=r"expected \(n, 3\) features"):
        mlp.score(x2[:, :2])


def test_mlp_names_bad_values() -> None:
    x, y = _group(10, n=20)
    with pytest.raises(ValueError, match=r"decay must be > 0, got 0\.0"):
        fit_pairwise_mlp([(x, y, 1.0)], kind="text", decay=0.0)
    with pytest.raises(ValueError, match="hidden and epochs must be >= 1, got 0 and 300"):
        fit_pairwise_mlp([(x, y, 1.0)], kind="text", hidden=0)
