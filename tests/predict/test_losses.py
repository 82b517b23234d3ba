"""The three losses on hand-computed tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from headway.predict.losses import list_mle_loss, margin_ranking_loss, pointwise_loss  # noqa: E402


def test_margin_ranking_loss_hand_values() -> None:
    s_a = torch.tensor([2.0, 0.0, 1.0, 3.0])
    s_b = torch.tensor([0.5, 0.2, 1.0, 1.0])
    a_longer = torch.tensor([1, 1, 0, 0])
    # y = +1, +1, -1, -1 -> max(0, 1 - y (a - b)) = 0, 1.2, 1, 3
    loss = margin_ranking_loss(s_a, s_b, a_longer, margin=1.0)
    assert loss.item() == pytest.approx((0.0 + 1.2 + 1.0 + 3.0) / 4)
    assert margin_ranking_loss(s_a, s_b, a_longer, margin=0.0).item() == pytest.approx((0 + 0.2 + 0 + 2.0) / 4)
    # +1/-1 labels mean the same as 1/0
    assert margin_ranking_loss(s_a, s_b, torch.tensor([1, 1, -1, -1]), 1.0).item() == pytest.approx(loss.item())


def test_margin_ranking_loss_gradient_pushes_longer_up() -> None:
    s = torch.tensor([0.0, 0.0], requires_grad=True)
    margin_ranking_loss(s[:1], s[1:], torch.tensor([1]), 1.0).backward()
    assert s.grad is not None
    assert s.grad[0] < 0 < s.grad[1]  # descent raises a's score, lowers b's


def _list_mle_by_hand(scores_in_true_order: list[float]) -> float:
    total = 0.0
    for i, s in enumerate(scores_in_true_order):
        total += math.log(sum(math.exp(x) for x in scores_in_true_order[i:])) - s
    return total / len(scores_in_true_order)


def test_list_mle_hand_values() -> None:
    scores = torch.tensor([0.3, 2.0, -1.0])
    lengths = torch.tensor([50.0, 10.0, 400.0])  # true order, longest first: idx 2, 0, 1
    expected = _list_mle_by_hand([-1.0, 0.3, 2.0])
    assert list_mle_loss(scores, lengths).item() == pytest.approx(expected, rel=1e-6)
    # two items: softplus(s_short - s_long) / 2
    two = list_mle_loss(torch.tensor([1.0, 0.0]), torch.tensor([9.0, 3.0]))
    assert two.item() == pytest.approx(math.log1p(math.exp(-1.0)) / 2, rel=1e-6)
    # the correct order has a lower loss than the reverse
    good = list_mle_loss(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([30.0, 20.0, 10.0]))
    bad = list_mle_loss(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([30.0, 20.0, 10.0]))
    assert good.item() < bad.item()


def test_list_mle_ties_take_one_of_the_orders() -> None:
    scores = torch.tensor([1.0, 0.0, 0.5])
    lengths = torch.tensor([10.0, 10.0, 5.0])
    options = {_list_mle_by_hand([1.0, 0.0, 0.5]), _list_mle_by_hand([0.0, 1.0, 0.5])}
    for seed in range(5):
        got = list_mle_loss(scores, lengths, torch.Generator().manual_seed(seed)).item()
        assert any(got == pytest.approx(o, rel=1e-6) for o in options)
    with pytest.raises(ValueError):
        list_mle_loss(torch.zeros(3), torch.zeros(2))


def test_pointwise_loss() -> None:
    assert pointwise_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])).item() == pytest.approx(2.5)
