"""The ridge ranking head: rank targets, the closed-form fit, saving and loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from headway.predict.head import (
    PROMPT_CUES,
    RidgeHead,
    cue_features,
    extra_features,
    feature_matrix,
    fit_ridge,
    rank_targets,
)


@given(st.lists(st.integers(1, 50), min_size=2, max_size=60))
@settings(max_examples=60, deadline=None)
def test_rank_targets_keep_order_and_ties(lengths: list[int]) -> None:
    y = np.array(lengths, dtype=float)
    t = rank_targets(y)
    for i in range(len(y)):
        for j in range(len(y)):
            if y[i] < y[j]:
                assert t[i] < t[j]
            elif y[i] == y[j]:
                assert t[i] == t[j]


def test_rank_targets_put_groups_on_one_scale() -> None:
    t = rank_targets([1, 2, 3, 100, 200, 300], groups=["a", "a", "a", "b", "b", "b"])
    assert np.allclose(t[:3], t[3:])


def test_fit_ridge_ranks_a_linear_signal() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    y = np.exp(x[:, 2] - 0.5 * x[:, 4])
    head = fit_ridge(x, rank_targets(y), kind="text", alpha=1.0)
    x_new = rng.normal(size=(200, 5))
    tau = stats.kendalltau(head.score(x_new), np.exp(x_new[:, 2] - 0.5 * x_new[:, 4])).statistic
    assert tau > 0.9


def test_fit_ridge_weights_select_examples() -> None:
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    up, down = np.array([0.0, 1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0, 0.0])
    xs, ys = np.vstack([x, x]), np.concatenate([up, down])
    keep_up = fit_ridge(xs, ys, kind="text", alpha=0.01, sample_weight=np.r_[np.ones(4), np.zeros(4)])
    keep_down = fit_ridge(xs, ys, kind="text", alpha=0.01, sample_weight=np.r_[np.zeros(4), np.ones(4)])
    assert keep_up.weights[0] > 0 > keep_down.weights[0]


def test_column_alpha_shrinks_only_its_columns() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 3))
    y = x @ np.array([1.0, 1.0, 1.0])
    same = fit_ridge(x, y, kind="text", alpha=500.0)
    light = fit_ridge(x, y, kind="text", alpha=500.0, column_alpha=[1e-6, 500.0, 500.0])
    assert same.weights[0] < 1.3 * min(same.weights[1:])  # one penalty: all three shrunk alike
    assert light.weights[0] > 2.5 * max(light.weights[1:])  # the unpenalized column keeps its full weight
    assert abs(light.weights[0] - 1.0) < 0.1
    uniform = fit_ridge(x, y, kind="text", alpha=3.0, column_alpha=[3.0] * 3)
    assert np.allclose(uniform.weights, fit_ridge(x, y, kind="text", alpha=3.0).weights)


def test_isotropic_scaling_keeps_a_near_constant_feature_small() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 3))
    x[:, 2] = 1e-4 * rng.normal(size=400)  # a near-constant feature with a little signal
    y = x[:, 0] + x[:, 1] + 0.3 * x[:, 2] / 1e-4 + rng.normal(scale=0.1, size=400)
    per = fit_ridge(x, y, kind="text", alpha=50.0)
    iso = fit_ridge(x, y, kind="text", alpha=50.0, isotropic=True)
    assert len(set(iso.scale.tolist())) == 1 and len(set(per.scale.tolist())) == 3
    raw_per, raw_iso = per.weights / per.scale, iso.weights / iso.scale
    assert abs(raw_per[2]) > 1e3  # standardized, the tiny column gets a huge raw weight
    assert abs(raw_iso[2]) < 0.1 * abs(raw_per[2])  # one penalty for every direction shrinks it
    # the isotropic head is the weighted ridge solution on features divided by one spread
    z = (x - iso.mean) / iso.scale[0]
    coef = np.linalg.solve(z.T @ z + 50.0 * np.eye(3), z.T @ (y - y.mean()))
    assert np.allclose(iso.weights, coef) and np.isclose(iso.bias, y.mean())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, "alpha must be > 0, got 0.0"),
        ({"sample_weight": -np.ones(3)}, "non-negative"),
        ({"column_alpha": [1.0, 1.0]}, "column_alpha must hold 3 positive penalties"),
        ({"column_alpha": [1.0, 0.0, 1.0]}, "column_alpha must hold 3 positive penalties"),
    ],
)
def test_fit_ridge_names_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_ridge(np.eye(3), np.arange(3.0), kind="text", **kwargs)  # type: ignore[arg-type]


def test_head_round_trips_through_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 4))
    head = fit_ridge(x, x[:, 0], kind="text", alpha=2.0)
    path = head.save(tmp_path / "head.npz", {"recipe": "test"})
    loaded, meta = RidgeHead.load(path)
    assert meta == {"recipe": "test"}
    assert (loaded.features, loaded.alpha, loaded.n_train) == ("text", 2.0, 50)
    assert np.allclose(loaded.score(x), head.score(x), atol=1e-4)
    with pytest.raises(ValueError, match="not a ranking head"):
        RidgeHead.from_bytes(b"garbage", "somewhere")


def test_feature_sets() -> None:
    prompts = ["one", "two words\nand lines"]
    emb = np.ones((2, 3))
    assert feature_matrix("text", prompts, emb).shape == (2, 3)
    assert feature_matrix("text+length", prompts, emb).shape == (2, 6)
    assert np.array_equal(feature_matrix("length", prompts, None), extra_features(prompts))
    assert extra_features(prompts)[1, 2] == pytest.approx(np.log1p(2))
    with pytest.raises(ValueError, match="unknown feature set 'bogus'"):
        feature_matrix("bogus", prompts, emb)
    with pytest.raises(ValueError, match="one embedding row per prompt"):
        feature_matrix("text", prompts, None)
    both = feature_matrix("text+cues", prompts, emb)
    assert both.shape == (2, 3 + len(PROMPT_CUES) + 1)
    assert np.array_equal(both[:, 3:], cue_features(prompts))


@pytest.mark.parametrize(
    ("prompt", "cues"),
    [
        ("Write a Python function that reverses a list.", {"code"}),
        ("Explain step by step how to bake bread:\n1. flour\n2. water", {"detail", "list"}),
        ("Solve the equation 3x + 2 = 11.", {"math"}),
        ("Write a short poem about autumn.", {"long_form", "short"}),
        ("Is Paris the capital of France?", {"question_end", "wh_start"}),
        ("Classify the sentiment of this tweet: I love it", {"classify"}),
        ("Translate into German: good morning", {"rewrite"}),
        ("Tell me about the weather in June", set()),
    ],
)
def test_cue_features_flag_each_cue(prompt: str, cues: set[str]) -> None:
    row = cue_features([prompt])[0]
    assert {name for name, on in zip(PROMPT_CUES, row[:-1], strict=True) if on} == cues
    assert row[-1] == pytest.approx(np.log1p(len(prompt.split())))


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=600))
@settings(max_examples=40, deadline=None)
def test_rank_targets_are_the_normal_quantiles_of_the_ranks(lengths: list[int]) -> None:
    from scipy import special

    y = np.array(lengths, dtype=float)
    ranks = stats.rankdata(y)  # average ranks, as rank_targets takes them
    assert np.allclose(rank_targets(y), special.ndtri((ranks - 0.5) / len(y)), rtol=0, atol=1e-12)


def test_online_learning_imports_no_scipy() -> None:
    import subprocess
    import sys

    code = "import sys, headway.predict.online, headway.predict.shipped; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"  # the score extra (no scipy) is enough to learn online
