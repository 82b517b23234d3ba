"""Cross-source evaluation: training sets, held-out columns, recipe choice (on synthetic sources)."""

from __future__ import annotations

import math

import numpy as np

from headway.predict.crosssource import (
    PROMPT_LENGTH,
    SOURCES,
    Recipe,
    Source,
    cross_source_matrix,
    training_sets,
)


def _source(name: str, n: int, seed: int, signal: int, mirror: bool = True) -> tuple[Source, np.ndarray]:
    """Prompts whose embedding dimension ``signal`` (shared by all sources) carries the log length."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 4))
    lengths = np.exp(emb[:, signal] + 0.1 * rng.normal(size=n)).round(3) * 100 + 1
    prompts = tuple(f"{name} prompt {i}" for i in range(n))
    test = np.zeros(n, dtype=bool)
    test[: n // 5] = True
    evals = {"m": lengths, "m2": 1.0 / lengths} if mirror else {"m": lengths}
    return Source(name, prompts, {"m": lengths}, evals, test), emb


def test_training_sets_cover_each_source_alone_all_but_one_and_all() -> None:
    names = [n for n, _ in training_sets()]
    assert names == [*SOURCES, *(f"all but {s}" for s in SOURCES), "all"]


def test_matrix_marks_in_source_columns_and_ranks_recipes() -> None:
    pairs = [_source(name, 100, k, signal=1) for k, name in enumerate(SOURCES)]
    sources = [s for s, _ in pairs]
    emb = {s.name: e.astype(np.float32) for s, e in pairs}
    result = cross_source_matrix(sources, emb, [Recipe("text", 1.0), Recipe("length", 1.0)])
    key = ("all but sharegpt", "text, alpha 1")
    assert result.in_source[key] == {f"{s}:{m}" for s in SOURCES if s != "sharegpt" for m in ("m", "m2")}
    assert result.rows[key]["sharegpt:m"] > 0.9  # the shared signal transfers
    assert result.rows[key]["sharegpt:m2"] < -0.9
    both = [result.rows[key][f"sharegpt:{m}"] for m in ("m", "m2")]
    assert math.isclose(result.source_mean(key, "sharegpt"), float(np.mean(both)))
    assert math.isnan(result.source_mean(key, "alpaca_eval"))  # trained on: not a held-out source
    assert math.isnan(result.held_out_mean(("all", "text, alpha 1")))
    assert set(result.rows) >= {("-", PROMPT_LENGTH), ("all", "length, alpha 1")}
    text = result.to_markdown("text, alpha 1")
    assert "text, alpha 1 (chosen)" in text
    assert "*" in text  # in-source cells are italic


def test_best_recipe_is_chosen_on_held_out_sources_only() -> None:
    # the length carries no signal here (prompt sizes are arbitrary): the text recipe must win
    pairs = [_source(name, 120, 10 + k, signal=0, mirror=False) for k, name in enumerate(SOURCES)]
    emb = {s.name: e.astype(np.float32) for s, e in pairs}
    result = cross_source_matrix([s for s, _ in pairs], emb, [Recipe("text", 1.0), Recipe("length", 1.0)])
    assert result.best_recipe() == "text, alpha 1"
    assert result.recipe_score("text, alpha 1") > result.recipe_score("length, alpha 1")
