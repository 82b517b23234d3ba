"""Cross-source evaluation: training sets, held-out columns, recipe choice (on synthetic sources)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from headway.predict.crosssource import (
    PROMPT_LENGTH,
    SOURCES,
    Recipe,
    Source,
    _tau,
    cross_source_matrix,
    embed_sources,
    exclude_shared_prompts,
    fit_recipe,
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


def test_a_fixed_scorer_is_held_out_only_where_it_never_trained() -> None:
    pairs = [_source(name, 100, k, signal=1, mirror=False) for k, name in enumerate(SOURCES)]
    sources = [s for s, _ in pairs]
    by_prompt = {p: float(e[i, 1]) for s, e in pairs for i, p in enumerate(s.prompts)}

    def score(prompts: object) -> np.ndarray:
        return np.array([by_prompt[p] for p in prompts])  # type: ignore[attr-defined]

    extra = {"old": score, "every": score}
    result = cross_source_matrix(sources, {}, [], extra_scorers=extra, extra_trained_on={"every": SOURCES})
    assert result.in_source[("-", "old")] == {"alpaca_eval:m"}  # unnamed: as if trained on alpaca_eval
    assert result.in_source[("-", "every")] == {f"{s}:m" for s in SOURCES}
    src = sources[1]
    on_split = stats.kendalltau(score(np.array(src.prompts)[src.test]), src.evals["m"][src.test]).statistic
    assert result.rows[("-", "every")]["sharegpt:m"] == pytest.approx(on_split)  # its held-out split only
    assert result.rows[("-", "old")]["sharegpt:m"] == pytest.approx(
        stats.kendalltau(score(src.prompts), src.evals["m"]).statistic
    )
    assert math.isnan(result.held_out_mean(("-", "every")))


def test_best_recipe_is_chosen_on_held_out_sources_only() -> None:
    # the length carries no signal here (prompt sizes are arbitrary): the text recipe must win
    pairs = [_source(name, 120, 10 + k, signal=0, mirror=False) for k, name in enumerate(SOURCES)]
    emb = {s.name: e.astype(np.float32) for s, e in pairs}
    result = cross_source_matrix([s for s, _ in pairs], emb, [Recipe("text", 1.0), Recipe("length", 1.0)])
    assert result.best_recipe() == "text, alpha 1"
    assert result.recipe_score("text, alpha 1") > result.recipe_score("length, alpha 1")


def test_training_only_prompts_train_and_are_never_evaluated() -> None:
    """A source whose evaluated prompts carry no signal in training (lengths shuffled) learns the shared
    signal from its extra prompts; the columns still score the evaluated prompts only."""
    rng = np.random.default_rng(7)
    src, emb = _source("sharegpt", 40, 3, signal=1, mirror=False)
    shuffled = {"m": rng.permutation(src.train["m"])}
    extra_emb = rng.normal(size=(300, 4))
    extra = {"m": np.exp(extra_emb[:, 1]) * 100 + 1}
    prompts = tuple(f"extra {i}" for i in range(300))
    with_extra = Source(src.name, src.prompts, shuffled, src.evals, src.test, prompts, extra)
    without = Source(src.name, src.prompts, shuffled, src.evals, src.test)
    emb_all = {"sharegpt": emb, "sharegpt:extra": extra_emb}
    other, other_emb = _source("codealpaca", 200, 4, signal=1, mirror=False)
    emb_all["codealpaca"] = other_emb
    recipe = Recipe("text", 1.0)
    good = fit_recipe(recipe, [with_extra], emb_all)
    bad = fit_recipe(recipe, [without], emb_all)
    truth = other.evals["m"]
    assert stats.kendalltau(good.score(other_emb), truth).statistic > 0.8
    assert abs(stats.kendalltau(bad.score(other_emb), truth).statistic) < 0.5
    assert good.n_train == int((~src.test).sum()) + 300
    result = cross_source_matrix([with_extra, other], emb_all, [recipe])
    assert result.n_prompts == {"sharegpt": 40, "codealpaca": 200}


def test_sqrt_weighting_lets_a_larger_source_count_more() -> None:
    """Two sources disagree (one's lengths follow dimension 0, the other's dimension 1); with equal weights
    the head splits between them, with sqrt(n) the source with 16x the answers gets 4x the weight."""
    small, e_small = _source("alpaca_eval", 50, 5, signal=0, mirror=False)
    large, e_large = _source("sharegpt", 800, 6, signal=1, mirror=False)
    emb = {"alpaca_eval": e_small, "sharegpt": e_large}
    equal = fit_recipe(Recipe("text", 1.0), [small, large], emb)
    sqrt = fit_recipe(Recipe("text", 1.0, "sqrt"), [small, large], emb)
    assert 0.7 < equal.weights[0] / equal.weights[1] < 1.4
    assert sqrt.weights[1] > 2.5 * sqrt.weights[0]
    assert Recipe("text", 1.0, "sqrt").label == "text, alpha 1, sources by sqrt(n)"
    assert Recipe("text", 1.0).label == "text, alpha 1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weighting": "cube"}, "unknown 'cube'; choose one of equal, sqrt"),
        ({"alpha": 0.0}, "alpha must be > 0"),
        ({"head": "gbdt"}, "Recipe.head: unknown 'gbdt'; choose one of ridge, ranknet, mlp"),
        ({"target": "raw"}, "Recipe.target: unknown 'raw'; choose one of rank, zlog"),
        ({"head": "ranknet", "target": "zlog"}, "target 'zlog' applies to ridge heads only, not 'ranknet'"),
    ],
)
def test_recipe_names_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Recipe(**{"features": "text", "alpha": 1.0, **kwargs})  # type: ignore[arg-type]


def test_sharegpt_training_only_prompts_are_other_prompts(data_dir: Path) -> None:
    from headway.predict.crosssource import SHAREGPT_PROMPTS, load_source

    src = load_source("sharegpt", data_dir)
    assert len(src.prompts) <= SHAREGPT_PROMPTS
    assert len(src.extra_prompts) > 10_000
    assert not set(src.extra_prompts) & set(src.prompts)
    assert len(set(src.extra_prompts)) == len(src.extra_prompts)
    (lengths,) = src.extra_train.values()
    assert lengths.shape == (len(src.extra_prompts),) and np.all(lengths >= 1)


def test_no_head_trains_on_a_prompt_another_source_scores_as_unseen() -> None:
    """sharegpt's training prompts hold variants (case, spacing, end punctuation) of 30 alpaca_eval prompts
    with alpaca_eval's lengths and embeddings: a head trained on sharegpt would rank alpaca_eval by
    remembering them. It must score alpaca_eval exactly as a head trained without those prompts."""
    rng = np.random.default_rng(7)
    n = 60
    a_emb, b_emb = rng.normal(size=(n, 8)), rng.normal(size=(n, 8))
    a_len, b_len = np.exp(rng.normal(size=n)) * 100, np.exp(rng.normal(size=n)) * 100
    a_prompts = tuple(f"Alpaca prompt {i}?" for i in range(n))
    alpaca = Source("alpaca_eval", a_prompts, {"m": a_len}, {"m": a_len}, np.zeros(n, dtype=bool))
    own = tuple(f"sharegpt prompt {i}" for i in range(n))
    copies = tuple(f"  ALPACA   prompt {i}" for i in range(30))
    test = np.zeros(n + 30, dtype=bool)
    test[:12] = True  # held-out prompts of sharegpt's own: the copies are all training prompts
    both = np.concatenate([b_len, a_len[:30]])
    leaky = Source("sharegpt", own + copies, {"m": both}, {"m": both}, test)
    clean = Source("sharegpt", own, {"m": b_len}, {"m": b_len}, test[:n])
    a32 = a_emb.astype(np.float32)
    emb_leaky = {"alpaca_eval": a32, "sharegpt": np.vstack([b_emb, a_emb[:30]]).astype(np.float32)}
    emb_clean = {"alpaca_eval": a32, "sharegpt": b_emb.astype(np.float32)}
    recipe = Recipe("text", 0.01)
    remembered = fit_recipe(recipe, [leaky], emb_leaky).score(a_emb)
    honest = fit_recipe(recipe, [clean], emb_clean).score(a_emb)
    assert _tau(remembered, a_len) > _tau(honest, a_len) + 0.2  # the copies would show
    key = ("sharegpt", recipe.label)
    got = cross_source_matrix([alpaca, leaky], emb_leaky, [recipe]).rows[key]["alpaca_eval:m"]
    want = cross_source_matrix([alpaca, clean], emb_clean, [recipe]).rows[key]["alpaca_eval:m"]
    assert got == pytest.approx(want, abs=1e-12)


def test_shared_prompts_lose_their_training_lengths_only() -> None:
    nan = math.nan
    a = Source(
        "alpaca_eval",
        ("Tell me a joke", "Name a colour.", "Why is the sky blue?"),
        {"mean": np.array([10.0, 20.0, 30.0])},
        {"m": np.array([1.0, 2.0, 3.0])},
        np.array([False, False, True]),
    )
    b = Source(
        "sharegpt",
        ("tell me  a JOKE!", "hello", "Hello", "why is the sky blue", "write a poem"),
        {"m": np.array([4.0, 5.0, 6.0, 7.0, 8.0])},
        {"m": np.array([4.0, 5.0, 6.0, 7.0, 8.0])},
        np.array([False, True, False, False, False]),
        ("name a colour", "WRITE A POEM.", "something else"),
        {"m": np.array([9.0, 10.0, 11.0])},
    )
    (a2, b2), left_out = exclude_shared_prompts([a, b])
    # alpaca_eval's "Tell me a joke" is a sharegpt prompt (scored in full when sharegpt is not trained on);
    # its held-out "Why is the sky blue?" keeps its length (never trained on with its split left out)
    np.testing.assert_array_equal(a2.train["mean"], [nan, 20.0, 30.0])
    # sharegpt: a copy of alpaca_eval's prompts (one of them held out there), a copy of its own held-out "hello"
    np.testing.assert_array_equal(b2.train["m"], [nan, 5.0, nan, nan, 8.0])
    # training-only prompts that copy any evaluated prompt, sharegpt's own included
    np.testing.assert_array_equal(b2.extra_train["m"], [nan, nan, 11.0])
    assert left_out == {"alpaca_eval": 1, "sharegpt": 5}
    for old, new in ((a, a2), (b, b2)):
        assert new.prompts == old.prompts and new.extra_prompts == old.extra_prompts
        assert all(np.array_equal(new.evals[m], old.evals[m]) for m in old.evals)
        np.testing.assert_array_equal(new.test, old.test)
    np.testing.assert_array_equal(b.train["m"], [4.0, 5.0, 6.0, 7.0, 8.0])  # the inputs are not changed
    assert exclude_shared_prompts([a2, b2])[1] == {"alpaca_eval": 0, "sharegpt": 0}


def test_real_sources_share_prompts_and_none_is_trained_on_where_scored_as_unseen(data_dir: Path) -> None:
    from headway.predict.crosssource import load_source
    from headway.predict.data import normalized_prompt

    sources = [load_source(name, data_dir) for name in SOURCES]
    cleaned, left_out = exclude_shared_prompts(sources)
    assert left_out["alpaca_eval"] > 0 and left_out["sharegpt"] > 0  # alpaca_eval holds ShareGPT first turns
    keys = {s.name: [normalized_prompt(p) for p in s.prompts] for s in cleaned}
    for src in cleaned:
        unseen = {k for other, ks in keys.items() if other != src.name for k in ks}
        unseen |= {k for k, t in zip(keys[src.name], src.test.tolist(), strict=True) if t}
        trained = np.any([np.isfinite(v) for v in src.train.values()], axis=0) & ~src.test
        assert not {k for k, t in zip(keys[src.name], trained.tolist(), strict=True) if t} & unseen
        if src.extra_prompts:
            (extra,) = src.extra_train.values()
            kept = {normalized_prompt(p) for p, y in zip(src.extra_prompts, extra.tolist(), strict=True) if y >= 1}
            assert not kept & {k for ks in keys.values() for k in ks}


def test_ranknet_and_zlog_recipes_learn_the_shared_signal() -> None:
    pairs = [_source(name, 150, 20 + k, signal=2, mirror=False) for k, name in enumerate(SOURCES)]
    sources = [s for s, _ in pairs]
    emb = {s.name: e for s, e in pairs}
    recipes = [Recipe("text", 1.0, "sqrt", head="ranknet"), Recipe("text", 1.0, target="zlog")]
    assert [r.label for r in recipes] == [
        "text, alpha 1, RankNet pairs, sources by sqrt(n)",
        "text, alpha 1, z-scored log length",
    ]
    result = cross_source_matrix(sources, emb, recipes)
    for recipe in recipes:
        assert result.recipe_score(recipe.label) > 0.8
        head = fit_recipe(recipe, sources, emb)
        assert int(np.argmax(np.abs(head.weights))) == 2


def test_zlog_targets_keep_each_source_models_scale_apart() -> None:
    """One source's lengths follow dimension 0 over a narrow range, another's dimension 1 over a range
    10x wider in log: z-scored log lengths weigh both the same, as rank targets do; raw log lengths
    (what z-scoring removes) would let the wide one dominate."""
    a, ea = _source("alpaca_eval", 400, 30, signal=0, mirror=False)
    b, eb = _source("sharegpt", 400, 31, signal=1, mirror=False)
    narrow = np.exp(0.1 * np.log(a.train["m"]))
    a = Source(a.name, a.prompts, {"m": narrow}, a.evals, a.test)
    emb = {"alpaca_eval": ea, "sharegpt": eb}
    head = fit_recipe(Recipe("text", 1.0, target="zlog"), [a, b], emb)
    assert 0.7 < head.weights[0] / head.weights[1] < 1.4


def test_recipe_grid_gives_mlp_heads_their_decays() -> None:
    from headway.predict.crosssource import recipe_grid

    grid = recipe_grid(["text"], [10.0, 100.0], ["sqrt"], ["ridge", "ranknet", "mlp"], ["rank", "zlog"], [0.01])
    assert [r.label for r in grid] == [
        "text, alpha 10, sources by sqrt(n)",
        "text, alpha 100, sources by sqrt(n)",
        "text, alpha 10, z-scored log length, sources by sqrt(n)",
        "text, alpha 100, z-scored log length, sources by sqrt(n)",
        "text, alpha 10, RankNet pairs, sources by sqrt(n)",
        "text, alpha 100, RankNet pairs, sources by sqrt(n)",
        "text, decay 0.01, MLP 64 on RankNet pairs, sources by sqrt(n)",
    ]
    pairs = [_source(name, 120, 40 + k, signal=3, mirror=False) for k, name in enumerate(SOURCES)]
    emb = {s.name: e for s, e in pairs}
    result = cross_source_matrix([s for s, _ in pairs], emb, grid[-1:])
    assert result.recipe_score(grid[-1].label) > 0.7


def test_embed_sources_says_what_it_embeds_and_what_it_reads_from_the_cache(tmp_path: Path) -> None:
    src, emb = _source("alpaca_eval", 10, 0, 0)
    calls: list[int] = []

    def embed(prompts: object) -> np.ndarray:
        calls.append(len(prompts))  # type: ignore[arg-type]
        return emb.astype(np.float32)

    lines: list[str] = []
    first = embed_sources([src], embed, tmp_path, say=lines.append)
    assert calls == [10]
    assert lines[0] == "  alpaca_eval: embedding 10 prompts ..."  # before the slow part, not after
    assert lines[1].startswith("  alpaca_eval: embedded 10 prompts in ")
    lines.clear()
    again = embed_sources([src], embed, tmp_path, say=lines.append)
    assert calls == [10]  # read back, not embedded again
    assert lines == ["  alpaca_eval: 10 prompts, embeddings read from the cache"]
    np.testing.assert_array_equal(first["alpaca_eval"], again["alpaca_eval"])


def test_embed_sources_leaves_no_cache_when_stopped_while_writing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while the cache is written: no file a later run would read as the embeddings
    src, emb = _source("alpaca_eval", 10, 0, 0)
    real_savez = np.savez

    def stopped_halfway(file: object, **arrays: np.ndarray) -> None:
        real_savez(file, **arrays)  # type: ignore[call-overload]
        data = Path(str(file)).read_bytes()
        Path(str(file)).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", stopped_halfway)
    with pytest.raises(KeyboardInterrupt):
        embed_sources([src], lambda prompts: emb.astype(np.float32), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_embed_sources_embeds_again_over_a_damaged_cache(tmp_path: Path) -> None:
    # a cache file cut short (as an earlier version, stopped while writing it, left one) is embedded again
    src, emb = _source("alpaca_eval", 10, 0, 0)
    calls: list[int] = []

    def embed(prompts: object) -> np.ndarray:
        calls.append(len(prompts))  # type: ignore[arg-type]
        return emb.astype(np.float32)

    embed_sources([src], embed, tmp_path)
    (cached,) = tmp_path.iterdir()
    data = cached.read_bytes()
    for damaged in (data[: len(data) // 2], b""):
        cached.write_bytes(damaged)
        again = embed_sources([src], embed, tmp_path)
        np.testing.assert_array_equal(again["alpaca_eval"], emb.astype(np.float32))
    assert calls == [10, 10, 10]
    embed_sources([src], embed, tmp_path)  # and the cache written again is read
    assert calls == [10, 10, 10]
