"""The shipped predictor: low-rank packing of a fine-tuned checkpoint, torch-free scoring, the default."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from headway.predict import CheckpointError
from headway.predict.shipped import (
    ShippedPredictor,
    pack_checkpoint,
    pack_linear_head,
    read_pack_header,
    shipped_predictor_path,
)

PROMPTS = [
    "Write a long essay about the ocean and its tides, with sources.",
    "yes?",
    "Summarize the plot of a novel about a lighthouse keeper.",
    "What is 2+2?",
    "Compose a sonnet about autumn leaves.",
]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, tiny_encoder_3_layers: Path) -> Path:
    """A 'fine-tuned' checkpoint: the tiny encoder with every weight moved, pooler pooling."""
    torch = pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    torch.manual_seed(1)
    encoder, tokenizer = load_encoder(tiny_encoder_3_layers)
    model = LengthPredictor(encoder, "pooler")
    with torch.no_grad():
        for name, p in model.encoder.named_parameters():
            if "word_embeddings" not in name:
                p.add_(0.05 * torch.randn_like(p))
        torch.nn.init.normal_(model.head.weight, std=1.0)
    out = tmp_path_factory.mktemp("tuned") / "ck"
    return save_checkpoint(model, tokenizer, out, fine_tuned=True, max_length=32)


def _torch_scores(path: Path) -> np.ndarray:
    from headway.predict import Scorer

    return np.asarray(Scorer.from_checkpoint(path, "torch", threads=1, cache_size=0).score(PROMPTS))


def test_a_full_rank_pack_scores_like_the_checkpoint(tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    header = pack_checkpoint(tuned, tmp_path / "p.npz", rank=64, base=tiny_encoder_3_layers)
    assert (header["pooling"], header["max_length"]) == ("pooler", 32)
    shipped = ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder_3_layers, threads=1)
    assert np.allclose(shipped.score(PROMPTS), _torch_scores(tuned), atol=2e-3)  # float16 deltas


def test_a_lower_rank_pack_is_smaller_and_approximates(
    tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path
) -> None:
    low = pack_checkpoint(tuned, tmp_path / "low.npz", rank=4, base=tiny_encoder_3_layers)
    full = pack_checkpoint(tuned, tmp_path / "full.npz", rank=64, base=tiny_encoder_3_layers)
    assert low["bytes"] < full["bytes"]
    want = _torch_scores(tuned)
    err_low = np.abs(ShippedPredictor(tmp_path / "low.npz", base=tiny_encoder_3_layers).score(PROMPTS) - want).max()
    err_full = np.abs(ShippedPredictor(tmp_path / "full.npz", base=tiny_encoder_3_layers).score(PROMPTS) - want).max()
    assert err_full < err_low


def test_a_pack_over_other_weights_is_refused(
    tuned: Path, tiny_encoder_3_layers: Path, tiny_encoder: Path, tmp_path: Path
) -> None:
    pack_checkpoint(tuned, tmp_path / "p.npz", rank=8, base=tiny_encoder_3_layers)
    with pytest.raises(CheckpointError, match="packed over other encoder weights"):
        ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder)
    with pytest.raises(CheckpointError, match="not a packed predictor"):
        ShippedPredictor(tmp_path / "missing.npz", base=tiny_encoder)


def test_a_pack_header_is_read_without_its_encoder(tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    pack_checkpoint(tuned, tmp_path / "p.npz", rank=8, base=tiny_encoder_3_layers, meta={"trained_on": ["codealpaca"]})
    header = read_pack_header(tmp_path / "p.npz")
    assert header == ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder_3_layers, threads=1).meta
    assert header["meta"]["trained_on"] == ["codealpaca"]
    # no array is read: a pack whose deltas are damaged still gives its header; loading it is refused
    # (a member without numpy's magic comes back from np.load as bytes, not as an error)
    for damage, why in ((b"\x93NUMPY\x01\x00damaged", "EOF"), (b"damaged", "is not an array")):
        with zipfile.ZipFile(tmp_path / "p.npz") as src, zipfile.ZipFile(tmp_path / "damaged.npz", "w") as dst:
            for name in src.namelist():
                dst.writestr(name, src.read(name) if name == "header.npy" else damage)
        assert read_pack_header(tmp_path / "damaged.npz") == header
        with pytest.raises(CheckpointError, match=rf"damaged\.npz: not a packed predictor \(.*{why}"):
            ShippedPredictor(tmp_path / "damaged.npz", base=tiny_encoder_3_layers)
    (tmp_path / "empty.npz").write_bytes(b"")
    for bad in ("missing.npz", "empty.npz"):
        with pytest.raises(CheckpointError, match=f"{re.escape(bad)}: not a packed predictor"):
            read_pack_header(tmp_path / bad)


def test_the_packaged_predictor_is_the_default_with_nothing_trained() -> None:
    from headway.predict.score import default_scorer

    assert shipped_predictor_path().is_file()
    assert shipped_predictor_path().stat().st_size < 4_000_000
    scorer = default_scorer(threads=1)
    assert isinstance(scorer, ShippedPredictor)
    scores = scorer.score(["Write a detailed 2000-word essay on the history of Rome.", "Say yes or no: is 7 prime?"])
    assert scores.shape == (2,) and scores[0] > scores[1]
    int8 = default_scorer("onnx-int8", threads=1)
    assert isinstance(int8, ShippedPredictor) and int8.backend == "onnx-int8 (packed)"
    # activations quantized per token: a prompt scores the same alone as beside others (per tensor, the
    # batch's scale moved this one by 0.4 on an AMD EPYC)
    batch = [f"Question {i}: " + "please explain in detail " * (i % 5) + "what a tide is." for i in range(24)]
    alone = [float(int8.score([p])[0]) for p in batch[::5]]
    assert np.allclose(alone, int8.score(batch)[::5], atol=1e-5)
    assert np.corrcoef(int8.score(batch), scorer.score(batch))[0, 1] > 0.95


def test_the_default_scorer_scores_a_workload_and_is_evaluated() -> None:
    """What default_scorer() returns with nothing trained (a ShippedPredictor) goes wherever a Scorer does."""
    from headway.predict import ExampleSet, evaluate_scorer, score_workload
    from headway.predict.data import Example
    from headway.predict.score import default_scorer
    from headway.workload import RequestSpec, Workload

    scorer = default_scorer(threads=1)
    assert isinstance(scorer, ShippedPredictor)
    specs = [RequestSpec(f"r{i}", 0.0, 10, 5, prompt=p) for i, p in enumerate(PROMPTS)]
    scored = score_workload(Workload("w", (*specs, RequestSpec("bare", 0.0, 10, 5))), scorer)
    assert [s.score for s in scored.requests[:-1]] == pytest.approx(scorer.score(PROMPTS).tolist())
    assert scored.requests[-1].score is None
    assert (scored.meta["scorer"], scored.meta["scored"]) == ("pars-minilm-default", len(PROMPTS))
    data = ExampleSet("d", "tokens", tuple(Example(p, 10 * (i + 1)) for i, p in enumerate(PROMPTS)))
    assert evaluate_scorer(scorer, data)[None].n == len(PROMPTS)


@pytest.mark.parametrize(
    ("meta", "trained_on"),
    [({"trained_on": ["alpaca_eval", "sharegpt"]}, ["alpaca_eval", "sharegpt"]),
     ({"source": "alpaca_eval:mean", "rank": 32}, ["alpaca_eval"])],
)  # fmt: skip
def test_a_pack_names_the_sources_it_was_trained_on(
    tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path, meta: dict[str, object], trained_on: list[str]
) -> None:
    pack_checkpoint(tuned, tmp_path / "p.npz", rank=8, base=tiny_encoder_3_layers, meta=meta)
    assert ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder_3_layers, threads=1).trained_on == trained_on


def test_the_int8_graph_scores_close_to_the_float_one(tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path) -> None:
    pack_checkpoint(tuned, tmp_path / "p.npz", rank=64, base=tiny_encoder_3_layers)
    plain = ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder_3_layers, threads=1)
    int8 = ShippedPredictor(tmp_path / "p.npz", base=tiny_encoder_3_layers, threads=1, int8=True)
    assert int8.backend == "onnx-int8 (packed)"
    a, b = plain.score(PROMPTS), int8.score(PROMPTS)
    assert not np.array_equal(a, b)  # it is another graph
    assert np.corrcoef(a, b)[0, 1] > 0.9
    assert np.allclose([int8.score([p])[0] for p in PROMPTS], b, atol=1e-5)  # as alone as in a batch


def test_a_linear_head_packs_over_the_unchanged_encoder(tiny_encoder: Path, tmp_path: Path) -> None:
    """A ridge head fitted on the frozen encoder's mean-pooled embeddings, packed without deltas, scores
    exactly as the head on those embeddings."""
    from headway.predict.crosssource import raw_linear
    from headway.predict.encoder import OnnxEncoder
    from headway.predict.head import fit_ridge

    encoder = OnnxEncoder(tiny_encoder, max_length=32, threads=1)
    emb = encoder.embed(PROMPTS).astype(np.float64)
    head = fit_ridge(emb, np.arange(len(PROMPTS), dtype=float), kind="text", alpha=0.5)
    w, b = raw_linear(head)
    assert np.allclose(emb @ w + b, head.score(emb))
    header = pack_linear_head(w, b, tmp_path / "mix.npz", max_length=32, base=tiny_encoder, meta={"recipe": "r"})
    assert (header["pooling"], header["rank"], header["meta"]) == ("mean", 0, {"recipe": "r"})
    packed = ShippedPredictor(tmp_path / "mix.npz", base=tiny_encoder, threads=1)
    assert packed.trained_on == []  # the header records none
    assert np.allclose(packed.score(PROMPTS), head.score(emb), atol=1e-4)
    with pytest.raises(ValueError, match="must be finite"):
        pack_linear_head([np.nan], 0.0, tmp_path / "bad.npz", max_length=32, base=tiny_encoder)


def test_the_packaged_mix_predictor_loads_as_a_scorer_spec() -> None:
    from headway.predict._resolve import resolve_score_fn
    from headway.predict.shipped import MIX_PREDICTOR

    path = shipped_predictor_path(MIX_PREDICTOR)
    assert path.is_file() and path.stat().st_size < 10_000  # a head only: no encoder deltas
    score = resolve_score_fn("headway.predict.shipped:mix_predictor()")
    prompts = ["Write a detailed 2000-word essay on the history of Rome.", "Say yes or no: is 7 prime?"]
    scores = np.asarray(score(prompts))
    assert scores.shape == (2,) and scores[0] > scores[1]
    assert ShippedPredictor(path).meta["meta"]["recipe"] == "text, alpha 10000, sources by sqrt(n)"


def test_the_packaged_predictors_name_their_training_sources_and_the_alpaca_one_loads_as_a_spec() -> None:
    """The default was trained on every shared source; the former default, still packaged for the
    online replay (whose offline predictor must never have seen arena_hard_v2), on alpaca_eval alone."""
    from headway.predict._resolve import resolve_score_fn
    from headway.predict.shipped import ALPACA_PREDICTOR, MIX_PREDICTOR

    assert ShippedPredictor().trained_on == ["alpaca_eval", "sharegpt", "codealpaca", "arena_hard_v2"]
    assert ShippedPredictor(shipped_predictor_path(ALPACA_PREDICTOR)).trained_on == ["alpaca_eval"]
    # the packaged linear head over every source (its header names them "sources", as --save-head wrote
    # them then): not a predictor that saw none of them
    assert ShippedPredictor(shipped_predictor_path(MIX_PREDICTOR)).trained_on == [
        "alpaca_eval", "sharegpt", "codealpaca", "arena_hard_v2"
    ]  # fmt: skip
    score = resolve_score_fn("headway.predict.shipped:alpaca_predictor()")
    prompts = ["Write a detailed 2000-word essay on the history of Rome.", "Say yes or no: is 7 prime?"]
    scores = np.asarray(score(prompts))
    assert scores.shape == (2,) and scores[0] > scores[1]


def test_the_shipped_predictor_reads_the_prefix_every_front_end_reads(
    tuned: Path, tiny_encoder_3_layers: Path, tmp_path: Path
) -> None:
    """The gateway and the plugin cut a prompt to ``scoring_text``'s prefix before scoring it and a
    checkpoint's ``Scorer`` cuts it so itself; the shipped predictor (what the simulator's
    ``pars.scorer=default`` scores with) read all of it. A prompt whose first few thousand characters are
    white space then scored 1.71 in the simulator and -2.85 (blank) through the gateway and the plugin;
    a lone surrogate (JSON ``"\\ud800"`` in a workload) stopped it; a megabyte prompt was tokenized whole."""
    from headway.predict.score import MAX_CHARS_PER_TOKEN, scoring_text

    pack = tmp_path / "p.npz"
    pack_checkpoint(tuned, pack, rank=64, base=tiny_encoder_3_layers)
    predictor = ShippedPredictor(pack, base=tiny_encoder_3_layers, threads=1)
    cut = predictor.max_length * MAX_CHARS_PER_TOKEN
    padded = " " * cut + "Write a long essay about the ocean and its tides, with sources."
    odd = ["\ud800" + PROMPTS[0], padded, PROMPTS[2] * 20_000]
    assert predictor.score(odd) == pytest.approx(
        predictor.score([scoring_text(p, predictor.max_length) for p in odd]), abs=1e-6
    )
    assert predictor.score([padded])[0] == pytest.approx(predictor.score([""])[0], abs=1e-6)
    assert predictor.embed(odd).shape == (3, predictor.encoder.hidden_size)
