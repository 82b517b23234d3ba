"""Fine-tuning the encoder on a mix of sources: the split encoder, the lower-layer cache, PARS pairs inside
one source x model, and a leave-one-source-out fold on synthetic sources (a tiny random BERT)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.predict.crossfinetune import FinetuneRecipe, group_pairs
from headway.predict.crosssource import SOURCES, Source

torch = pytest.importorskip("torch")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 2000), st.sampled_from([("a", "m"), ("a", "m2"), ("b", "m")])),
        min_size=0,
        max_size=30,
    ),
    st.sampled_from([0.0, 0.2, 0.5]),
)
def test_pairs_stay_inside_one_source_x_model_and_pass_the_gap(
    rows: list[tuple[int, tuple[str, str]]], delta: float
) -> None:
    lengths = np.array([r[0] for r in rows], dtype=np.float64)
    groups = [r[1] for r in rows]
    pairs = group_pairs(lengths, groups, delta)
    expected = {
        (i, j)
        for i in range(len(rows))
        for j in range(i + 1, len(rows))
        if groups[i] == groups[j]
        and lengths[i] != lengths[j]
        and abs(lengths[i] - lengths[j]) / max(lengths[i], lengths[j]) >= delta
    }
    assert {(int(a), int(b)) for a, b, _ in pairs} == expected
    for a, b, label in pairs.tolist():
        assert groups[a] == groups[b]
        assert label == int(lengths[a] > lengths[b])


def test_recipe_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="top_layers must be >= 1, got 0"):
        FinetuneRecipe(top_layers=0)
    with pytest.raises(ValueError, match="weighting: unknown 'cube'"):
        FinetuneRecipe(weighting="cube")
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got nan"):
        FinetuneRecipe(lr=math.nan)
    with pytest.raises(ValueError, match=r"delta must be in \[0, 1\), got 1.0"):
        FinetuneRecipe(delta=1.0)
    with pytest.raises(ValueError, match="encoder_layers must be >= 1 or None, got 0"):
        FinetuneRecipe(encoder_layers=0)
    with pytest.raises(ValueError, match=r"top_layers \(4\) is more than the encoder_layers kept \(3\)"):
        FinetuneRecipe(encoder_layers=3)
    assert FinetuneRecipe(encoder_layers=5).label.startswith("minilm first 5 layers, top 4 layers fine-tuned, ")
    assert FinetuneRecipe().label.startswith("minilm top 4 layers fine-tuned, ")
    with pytest.raises(ValueError, match="truncation: unknown 'tail'; choose one of head, head-tail"):
        FinetuneRecipe(truncation="tail")
    assert "max_length 96 (head-tail)," in FinetuneRecipe(truncation="head-tail").label
    assert "max_length 96," in FinetuneRecipe().label


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 60), st.integers(3, 40))
def test_head_tail_keeps_both_ends_and_the_special_tokens(n: int, max_length: int) -> None:
    from headway.predict.model import head_tail

    ids = [-1, *range(n), -2]  # [CLS] ... [SEP]
    cut = head_tail(ids, max_length)
    if len(ids) <= max_length:
        assert cut == ids
        return
    assert len(cut) == max_length and cut[0] == -1 and cut[-1] == -2
    inner = cut[1:-1]
    head, tail = (max_length - 1) // 2, (max_length - 2) // 2
    assert inner == list(range(head)) + list(range(n - tail, n))  # the first and the last tokens, in order


def test_head_tail_tokenizes_the_question_at_the_end_of_a_long_prompt(tiny_encoder_3_layers: Path) -> None:
    from headway.predict.model import tokenize

    _, tok = _encoder(tiny_encoder_3_layers)
    long = "tell me more " * 40 + "write a poem about the sea"
    head = tokenize(tok, [long, "hi"], 16)
    both = tokenize(tok, [long, "hi"], 16, "head-tail")
    assert len(head[0]) == len(both[0]) == 16 and head[1] == both[1]  # a short prompt is not cut
    assert both[0][:8] == head[0][:8]
    assert both[0][-8:] == tokenize(tok, [long], 512)[0][-8:]  # the end, [SEP] included
    with pytest.raises(ValueError, match="unknown truncation 'middle'"):
        tokenize(tok, ["hi"], 16, "middle")


def _encoder(path: Path) -> tuple[object, object]:
    from headway.predict.model import load_encoder

    return load_encoder(path)


PROMPTS = ["write a poem about the sea", "hi", "explain in detail how a jet engine works, step by step " * 3, "ok"]


def test_cached_lower_states_score_as_the_full_forward(tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    from headway.predict.crossfinetune import MixModel, lower_states, score_states, split_encoder
    from headway.predict.model import pad_batch, tokenize

    full, tok = _encoder(tiny_encoder_3_layers)
    enc, _ = _encoder(tiny_encoder_3_layers)
    lower, top = split_encoder(enc, 1)  # type: ignore[arg-type]
    model = MixModel(top).eval()
    states = lower_states(lower, tok, PROMPTS, 32, cache=tmp_path, tag="t")
    again = lower_states(lower, tok, PROMPTS, 32, cache=tmp_path, tag="t")  # from the disk cache
    assert len(list(tmp_path.glob("*.npz"))) == 1
    other = lower_states(lower, tok, PROMPTS, 32, cache=tmp_path, tag="t", truncation="head-tail")
    assert len(list(tmp_path.glob("*.npz"))) == 2  # another cut never reads the head's states
    assert [s.shape for s in other] == [s.shape for s in states]
    assert not np.array_equal(other[2], states[2]) and np.array_equal(other[0], states[0])  # only the long one
    assert all(np.array_equal(a, b) for a, b in zip(states, again, strict=True))
    cached = score_states(model, again, micro=3)

    ids = tokenize(tok, PROMPTS, 32)
    x, mask = (torch.from_numpy(a) for a in pad_batch(ids, 0))
    full.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        hidden = full(input_ids=x, attention_mask=mask).last_hidden_state  # type: ignore[operator]
        m = mask.unsqueeze(-1).float()
        direct = model.head((hidden * m).sum(1) / m.sum(1)).squeeze(-1)
    assert torch.allclose(cached, direct, atol=1e-5)
    assert float((cached - direct).abs().max()) < 1e-5
    assert len(set(np.round(cached.numpy(), 6).tolist())) == len(PROMPTS)  # not a constant


def _source(name: str, n: int, seed: int) -> Source:
    """Prompts whose output length grows with a word count that every source shares."""
    rng = np.random.default_rng(seed)
    words = rng.integers(1, 12, size=n)
    prompts = tuple(f"{name} {i} " + " ".join(["tell me more"] * int(w)) for i, w in enumerate(words))
    lengths = (words * 40 + rng.integers(1, 20, size=n)).astype(np.float64)
    test = np.zeros(n, dtype=bool)
    test[: n // 5] = True
    return Source(name, prompts, {"m": lengths, "m2": lengths * 2}, {"m": lengths}, test)


def test_fold_trains_only_the_top_layers_and_learns_the_shared_signal(
    tiny_encoder_3_layers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headway.predict import crossfinetune
    from headway.predict.crossfinetune import finetune_fold, fold_table

    sources = [_source(name, 60, k) for k, name in enumerate(SOURCES)]
    before, _ = _encoder(tiny_encoder_3_layers)
    before_state = {k: v.clone() for k, v in before.state_dict().items()}  # type: ignore[attr-defined]
    seen: dict[str, object] = {}
    real_split = crossfinetune.split_encoder

    def spy(encoder: object, top_layers: int) -> tuple[object, object]:
        lower, top = real_split(encoder, top_layers)  # type: ignore[arg-type]
        seen["lower"], seen["top"] = lower, top
        return lower, top

    recipe = FinetuneRecipe(
        encoder=str(tiny_encoder_3_layers), top_layers=1, max_length=32, steps=40, batch_size=24, lr=3e-3, head_lr=3e-2
    )
    monkeypatch.setattr(crossfinetune, "split_encoder", spy)
    fold = finetune_fold(recipe, sources, "sharegpt", cache=tmp_path)
    lower_state = seen["lower"].state_dict()  # type: ignore[attr-defined]
    for k, v in lower_state.items():  # embeddings and layers 0-1: untouched
        assert torch.equal(v, before_state[k]), k
    top_state = seen["top"].state_dict()  # type: ignore[attr-defined]
    moved = [
        k
        for k, v in top_state.items()
        if k.startswith("encoder.layer.0.") and not torch.equal(v, before_state[k.replace("layer.0.", "layer.2.")])
    ]
    assert moved  # the top layer (layer 2 of the original) was trained
    assert fold.in_source == {f"{s}:m" for s in SOURCES if s != "sharegpt"}
    assert fold.taus["sharegpt:m"] > 0.5  # the held-out source ranks by the shared signal
    assert fold.loss_last < fold.loss_first
    again = finetune_fold(recipe, sources, "sharegpt", cache=tmp_path)
    assert again.taus == fold.taus  # seeded: the same run gives the same numbers
    table = fold_table(recipe, sources, [fold], None)
    assert table.held_out_source(recipe.label, "sharegpt") == pytest.approx(fold.taus["sharegpt:m"])
    assert math.isnan(table.held_out_source(recipe.label, "alpaca_eval"))
    assert table.to_markdown(recipe.label).startswith("# Length predictors across sources, encoder fine-tuned")


def test_a_fold_never_trains_on_a_prompt_another_source_holds(
    tiny_encoder_3_layers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headway.predict import crossfinetune
    from headway.predict.crossfinetune import finetune_fold

    sources = [_source(name, 30, k) for k, name in enumerate(SOURCES)]
    a = sources[0]  # alpaca_eval, held out below: every one of its prompts is scored as unseen
    copy = "  " + a.prompts[10].upper() + "."
    b = sources[1]
    sources[1] = Source(
        b.name, (*b.prompts, copy), {m: np.append(v, 7.0) for m, v in b.train.items()},
        {m: np.append(v, 7.0) for m, v in b.evals.items()}, np.append(b.test, False),
    )  # fmt: skip
    seen: dict[str, Source] = {}
    real = crossfinetune._training_groups

    def spy(src: Source) -> object:
        seen[src.name] = src
        return real(src)

    monkeypatch.setattr(crossfinetune, "_training_groups", spy)
    recipe = FinetuneRecipe(encoder=str(tiny_encoder_3_layers), top_layers=1, max_length=32, steps=1, batch_size=8)
    finetune_fold(recipe, sources, "alpaca_eval", cache=tmp_path)
    trained = seen["sharegpt"]
    assert trained.prompts[-1] == copy
    assert all(np.isnan(v[-1]) and np.isfinite(v[:-1][~b.test]).all() for v in trained.train.values())


def test_ridge_head_start_already_ranks_before_any_training(tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    from headway.predict.crossfinetune import finetune_fold

    sources = [_source(name, 60, k) for k, name in enumerate(SOURCES)]
    still = {"encoder": str(tiny_encoder_3_layers), "top_layers": 1, "max_length": 32, "steps": 1, "batch_size": 8}
    still |= {"lr": 1e-12, "head_lr": 1e-12}  # one step that moves nothing: the fold scores the start
    recipe = FinetuneRecipe(**still, head_init="ridge", ridge_alpha=1.0, dropout=False)
    ridge = finetune_fold(recipe, sources, "codealpaca", cache=tmp_path)
    rand = finetune_fold(FinetuneRecipe(**still), sources, "codealpaca", cache=tmp_path)
    assert ridge.taus["codealpaca:m"] > 0.5
    assert ridge.taus["codealpaca:m"] > rand.taus["codealpaca:m"] + 0.2  # a random head ranks either way
    assert recipe.label.endswith("head from ridge (alpha 1), no dropout")


def test_training_on_every_source_saves_a_checkpoint_that_scores_as_the_model(
    tiny_encoder_3_layers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headway.predict import crossfinetune
    from headway.predict.crossfinetune import MixModel, finetune_all, lower_states, score_states
    from headway.predict.model import load_checkpoint
    from headway.predict.score import Scorer
    from headway.predict.shipped import ShippedPredictor, pack_checkpoint

    sources = [_source(name, 60, k) for k, name in enumerate(SOURCES)]
    recipe = FinetuneRecipe(
        encoder=str(tiny_encoder_3_layers), top_layers=1, max_length=32, steps=30, batch_size=24, lr=3e-3, head_lr=3e-2
    )
    trained: dict[str, MixModel] = {}
    real = crossfinetune._finetune

    def spy(*args: object, **kwargs: object) -> tuple[object, MixModel]:
        fold, model = real(*args, **kwargs)  # type: ignore[arg-type]
        trained["model"] = model
        return fold, model

    monkeypatch.setattr(crossfinetune, "_finetune", spy)
    fold = finetune_all(recipe, sources, tmp_path / "ck", cache=tmp_path / "cache", meta={"note": "x"})
    assert fold.held_out is None
    assert fold.in_source == {f"{s}:{m}" for s in SOURCES for m in ("m",)}  # every column held-out split only
    assert fold.taus["sharegpt:m"] > 0.5

    base, tok = _encoder(tiny_encoder_3_layers)
    lower, _ = crossfinetune.split_encoder(base, 1)  # type: ignore[arg-type]
    prompts = [p for s in sources for p in s.prompts[:10]]
    in_memory = score_states(trained["model"].eval(), lower_states(lower, tok, prompts, 32)).numpy()

    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.meta["pooling"] == "mean" and loaded.meta["max_length"] == 32
    assert loaded.meta["finetune"]["held_out_tau_b"] == fold.taus and loaded.meta["note"] == "x"
    saved = Scorer.from_checkpoint(tmp_path / "ck", "torch", threads=1, cache_size=0).score(prompts)
    np.testing.assert_allclose(saved, in_memory, atol=1e-5)
    assert len(set(np.round(in_memory, 5).tolist())) > len(prompts) // 2  # not a constant

    fresh, _ = _encoder(tiny_encoder_3_layers)
    stock = fresh.state_dict()  # type: ignore[attr-defined]
    tuned = loaded.model.encoder.state_dict()
    assert set(tuned) == set(stock)
    changed = {k for k in stock if not torch.equal(tuned[k], stock[k])}
    assert changed and all(k.startswith("encoder.layer.2.") for k in changed)  # only the top layer moved

    header = pack_checkpoint(tmp_path / "ck", tmp_path / "p.npz", rank=64, base=tiny_encoder_3_layers)
    assert header["pooling"] == "mean" and header["max_length"] == 32
    with np.load(tmp_path / "p.npz") as z:
        packed = [k for k in z.files if k not in ("header", "head.weight", "head.bias")]
    assert packed and all(".encoder.layer.2." in k for k in packed)  # unchanged weights cost nothing
    table = crossfinetune.fold_table(recipe, sources, [fold], None)
    assert table.to_markdown(recipe.label).startswith("# Length predictors across sources, encoder fine-tuned on a "
                                                      "mix of every source")  # fmt: skip
    assert ("all sources", recipe.label) in table.rows
    shipped = ShippedPredictor(tmp_path / "p.npz", threads=1, base=tiny_encoder_3_layers)
    np.testing.assert_allclose(shipped.score(prompts), in_memory, atol=1e-3)  # float16 deltas


def test_a_cut_encoder_trains_packs_and_scores_on_its_first_layers(tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    from headway.predict.crossfinetune import finetune_all, finetune_fold
    from headway.predict.model import load_checkpoint
    from headway.predict.score import Scorer
    from headway.predict.shipped import ShippedPredictor, pack_checkpoint

    sources = [_source(name, 60, k) for k, name in enumerate(SOURCES)]
    options = {"encoder": str(tiny_encoder_3_layers), "top_layers": 1, "max_length": 32, "steps": 30}
    options |= {"batch_size": 24, "lr": 3e-3, "head_lr": 3e-2}
    cut = FinetuneRecipe(**options, encoder_layers=2)
    fold = finetune_fold(cut, sources, "sharegpt", cache=tmp_path / "cache")
    whole = finetune_fold(FinetuneRecipe(**options), sources, "sharegpt", cache=tmp_path / "cache")
    assert fold.taus["sharegpt:m"] > 0.5
    assert fold.taus != whole.taus  # another network, not the full encoder's cached states read back

    finetune_all(cut, sources, tmp_path / "ck", cache=tmp_path / "cache")
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.model.encoder.config.num_hidden_layers == 2
    assert len(loaded.model.encoder.encoder.layer) == 2
    fresh, _ = _encoder(tiny_encoder_3_layers)
    stock = fresh.state_dict()  # type: ignore[attr-defined]
    tuned = loaded.model.encoder.state_dict()
    assert not any(k.startswith("encoder.layer.2.") for k in tuned)
    changed = {k for k in tuned if not torch.equal(tuned[k], stock[k])}
    assert changed and all(k.startswith("encoder.layer.1.") for k in changed)  # the kept top layer only

    prompts = [p for s in sources for p in s.prompts[:10]]
    saved = Scorer.from_checkpoint(tmp_path / "ck", "torch", threads=1, cache_size=0).score(prompts)
    pack_checkpoint(tmp_path / "ck", tmp_path / "p.npz", rank=64, base=tiny_encoder_3_layers)
    shipped = ShippedPredictor(tmp_path / "p.npz", threads=1, base=tiny_encoder_3_layers)
    np.testing.assert_allclose(shipped.score(prompts), saved, atol=1e-3)  # float16 deltas, two layers run


def test_a_head_tail_recipe_saves_no_checkpoint(tmp_path: Path) -> None:
    from headway.predict.crossfinetune import finetune_all

    with pytest.raises(ValueError, match="a checkpoint is scored on a prompt's head"):
        finetune_all(FinetuneRecipe(truncation="head-tail"), [], tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA device")
def test_cuda_is_refused_where_torch_has_none(capsys: pytest.CaptureFixture[str]) -> None:
    from headway.predict._cli import main

    assert main(["predictor", "cross-source-finetune", "--device", "cuda", "--data-dir", "/nonexistent"]) == 2
    assert "device 'cuda': torch sees no CUDA device here" in capsys.readouterr().err


def test_too_many_encoder_layers_are_refused_before_the_data_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    from headway.predict._cli import main

    # no data there: only a refusal before the sources load names the layers
    argv = ["predictor", "cross-source-finetune", "--encoder-layers", "7", "--data-dir", "/nonexistent"]
    assert main(argv) == 2
    assert "encoder layers must be 1..6 (its layer count), got 7" in capsys.readouterr().err


def test_save_checkpoint_is_refused_with_folds(capsys: pytest.CaptureFixture[str]) -> None:
    from headway.predict._cli import main

    assert main(["predictor", "cross-source-finetune", "--save-checkpoint", "x", "--held-out", "sharegpt"]) == 2
    assert "--save-checkpoint trains on every source (no fold): leave out --held-out" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--held-out", "nope"], "--held-out: unknown source 'nope'"),
        (["--held-out", ","], "--held-out: choose at least one of"),
        (["--top-layers", "0"], "FinetuneRecipe.top_layers must be >= 1, got 0"),
        (["--encoder-layers", "2", "--top-layers", "3"], "top_layers (3) is more than the encoder_layers kept (2)"),
        (["--device", "tpu9"], "device 'tpu9': "),
        (["--sharegpt-extra", "-1"], "--sharegpt-extra: a count >= 0, got -1"),
    ],
)
def test_cli_names_the_bad_value(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from headway.predict._cli import main

    assert main(["predictor", "cross-source-finetune", *args]) == 2
    assert message in capsys.readouterr().err
