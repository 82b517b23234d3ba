"""The serving-time scorer: cache, dynamic padding, workloads, ONNX export."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scipy.stats import spearmanr  # noqa: E402

from headway.predict import CheckpointError, Scorer, export_onnx, score_workload  # noqa: E402
from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint  # noqa: E402
from headway.predict.score import _padding_chunks, ensure_predictor  # noqa: E402
from headway.workload import RequestSpec, Workload  # noqa: E402

PROMPTS = [
    "Write a long essay about the ocean.",
    "yes?",
    "Summarize the plot of a novel about a lighthouse keeper who collects stories.",
    "What is 2+2?",
    "Compose a sonnet.",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_encoder: Path) -> Path:
    torch.manual_seed(0)
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    torch.nn.init.normal_(model.head.weight, std=1.0)
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("score") / "ck", fine_tuned=True, max_length=32)


def test_scores_do_not_depend_on_batching_or_padding(checkpoint: Path) -> None:
    one_by_one = np.array([Scorer.from_checkpoint(checkpoint, cache_size=0).score_one(p) for p in PROMPTS])
    batched = Scorer.from_checkpoint(checkpoint, batch_size=2, cache_size=0).score(PROMPTS)
    assert batched.shape == (5,) and batched.dtype == np.float64
    assert np.allclose(batched, one_by_one, atol=1e-5)
    assert len(set(np.round(batched, 6))) == 5


def _tokens_run(lengths: list[int], chunks: list[tuple[int, int]], pass_cost: int) -> int:
    return sum(pass_cost + (b - a) * lengths[b - 1] for a, b in chunks)


@given(
    st.lists(st.integers(1, 64), max_size=40).map(sorted),
    st.integers(1, 12),
    st.integers(0, 40),
)
def test_padding_chunks_cover_in_order_within_the_cap_and_run_no_more_than_fixed_batches(
    lengths: list[int], cap: int, pass_cost: int
) -> None:
    chunks = _padding_chunks(lengths, cap, pass_cost)
    assert [i for a, b in chunks for i in range(a, b)] == list(range(len(lengths)))
    assert all(1 <= b - a <= cap for a, b in chunks)
    fixed = [(k, min(k + cap, len(lengths))) for k in range(0, len(lengths), cap)]
    assert _tokens_run(lengths, chunks, pass_cost) <= _tokens_run(lengths, fixed, pass_cost)


@given(st.lists(st.integers(1, 20), min_size=1, max_size=8).map(sorted), st.integers(1, 4), st.integers(0, 10))
def test_padding_chunks_are_optimal_against_every_split(lengths: list[int], cap: int, pass_cost: int) -> None:
    n = len(lengths)
    best = None
    for mask in itertools.product((False, True), repeat=n - 1):  # a cut after position i where mask[i]
        cuts = [0] + [i + 1 for i, cut in enumerate(mask) if cut] + [n]
        split = list(itertools.pairwise(cuts))
        if all(b - a <= cap for a, b in split):
            cost = _tokens_run(lengths, split, pass_cost)
            best = cost if best is None else min(best, cost)
    assert _tokens_run(lengths, _padding_chunks(lengths, cap, pass_cost), pass_cost) == best


def test_padding_chunks_keep_a_long_prompt_from_padding_the_short_ones() -> None:
    assert _padding_chunks([8] * 30 + [64, 64], 32) == [(0, 30), (30, 32)]
    assert _padding_chunks([], 32) == []
    with pytest.raises(ValueError, match="ascending"):
        _padding_chunks([3, 2], 4)
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        _padding_chunks([1], 0)


def test_max_length_truncates_prompts_at_scoring_time_within_the_checkpoints_length(checkpoint: Path) -> None:
    long_a = "alpha beta gamma delta " * 20  # far over 32 tokens; the two differ from the third word on
    long_b = "alpha beta " + "omega psi chi " * 20
    full = Scorer.from_checkpoint(checkpoint, cache_size=0)
    assert full.max_length == 32  # the checkpoint's
    short = Scorer.from_checkpoint(checkpoint, cache_size=0, max_length=8)
    assert short.max_length == 8
    a, b = short.score([long_a, long_b])
    assert a != b  # 8 tokens still see where they differ ([CLS] + 6 words + [SEP])
    same = Scorer.from_checkpoint(checkpoint, cache_size=0, max_length=8).score(["x " * 6 + "y " * 50, "x " * 6])
    assert same[0] == pytest.approx(same[1], abs=1e-5)  # truncated to the same 8 tokens
    assert not np.allclose(full.score(["x " * 6 + "y " * 50, "x " * 6]), same)
    for bad in (4, 33):
        with pytest.raises(ValueError, match=f"max_length must be 8..32 tokens .*got {bad}"):
            Scorer.from_checkpoint(checkpoint, max_length=bad)


def test_cache_hits_misses_duplicates_and_eviction(checkpoint: Path) -> None:
    scorer = Scorer.from_checkpoint(checkpoint, cache_size=3)
    first = scorer.score(PROMPTS[:3])
    info = scorer.cache_info()
    assert (info.hits, info.misses, info.size, info.maxsize) == (0, 3, 3, 3)
    again = scorer.score([PROMPTS[2], PROMPTS[0], PROMPTS[2]])
    assert np.array_equal(again, first[[2, 0, 2]])  # cached values are the computed ones
    assert scorer.cache_info().hits == 3 and scorer.cache_info().misses == 3
    scorer.score([PROMPTS[3], PROMPTS[3]])  # one miss for a duplicated prompt; evicts the LRU entry (1)
    info = scorer.cache_info()
    assert (info.misses, info.size) == (4, 3)
    scorer.score([PROMPTS[1]])
    assert scorer.cache_info().misses == 5  # PROMPTS[1] had been evicted
    scorer.clear_cache()
    assert scorer.cache_info().size == 0


def test_threads_share_a_scorer_and_its_cache(checkpoint: Path) -> None:
    """A cached score was looked up, then moved to the cache's end: another thread scoring meanwhile
    could evict it in between, and the first raised KeyError (seen with a 3-entry cache, 8 threads and a
    1 us switch interval: 3 errors in 24,000 calls). The cache's reads and writes are now atomic; here a
    cache whose reads let another thread run makes the interleaving happen every time."""
    import threading
    import time
    from collections import OrderedDict

    class YieldingCache(OrderedDict[bytes, float]):
        def get(self, key: bytes, default: float | None = None) -> float | None:  # type: ignore[override]
            value = super().get(key, default)
            time.sleep(0.002)  # (releases the GIL: the other thread scores its prompt here)
            return value

    scorer = Scorer.from_checkpoint(checkpoint, cache_size=1)
    alone = {p: scorer.score_one(p) for p in PROMPTS[:2]}
    scorer._cache = YieldingCache()
    errors: list[BaseException] = []
    got: list[tuple[str, float]] = []

    def work(prompt: str) -> None:
        try:
            for _ in range(20):
                got.append((prompt, scorer.score_one(prompt)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in PROMPTS[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == 40 and all(s == pytest.approx(alone[p], abs=1e-5) for p, s in got)
    assert scorer.cache_info().size == 1


def test_an_empty_or_blank_prompt_is_scored_and_a_non_string_is_named(checkpoint: Path) -> None:
    scorer = Scorer.from_checkpoint(checkpoint, cache_size=0)
    scores = scorer.score(["fine", "  ", "", PROMPTS[0]])
    assert np.all(np.isfinite(scores))
    assert scores[1] == pytest.approx(scores[2], abs=1e-5)  # both are [CLS] [SEP] alone
    assert scores[[0, 3]] == pytest.approx(scorer.score(["fine", PROMPTS[0]]), abs=1e-5)  # the others as alone
    with pytest.raises(TypeError, match="prompt 1 is not a string: None"):
        scorer.score(["fine", None])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        scorer.score("a string, not a list")


def test_score_workload(checkpoint: Path) -> None:
    specs = [
        RequestSpec("a", 0.0, 5, 10, prompt=PROMPTS[0]),
        RequestSpec("b", 1.0, 5, 10, prompt=None),
        RequestSpec("c", 2.0, 5, 10, prompt=PROMPTS[1]),
    ]
    wl = Workload.from_specs("w", specs, {"source": "test"})
    scorer = Scorer.from_checkpoint(checkpoint)
    scored = score_workload(wl, scorer)
    assert scored is not wl and wl.requests[0].score is None
    assert scored.requests[0].score == pytest.approx(scorer.score_one(PROMPTS[0]))
    assert scored.requests[1].score is None and scored.requests[2].score is not None
    assert scored.meta["source"] == "test" and scored.meta["scored"] == 2
    with pytest.raises(ValueError, match="'b' has no prompt"):
        score_workload(wl, scorer, require_prompts=True)


def test_onnx_export_matches_torch_and_detects_staleness(checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    path = export_onnx(ck)
    assert path == ck / "model.onnx"
    ref = Scorer.from_checkpoint(ck, "torch").score(PROMPTS)
    onnx = Scorer.from_checkpoint(ck, "onnx", batch_size=2)
    assert onnx.backend == "onnx"
    assert np.allclose(onnx.score(PROMPTS), ref, atol=1e-4)
    with pytest.MonkeyPatch.context() as mp:  # ONNX Runtime's thread spinning: 1 (default) or 0, nothing else
        mp.setenv("HEADWAY_ORT_SPINNING", "0")
        assert np.allclose(Scorer.from_checkpoint(ck, "onnx").score(PROMPTS), ref, atol=1e-4)
        mp.setenv("HEADWAY_ORT_SPINNING", "yes")
        with pytest.raises(ValueError, match="HEADWAY_ORT_SPINNING must be 0 or 1, got 'yes'"):
            Scorer.from_checkpoint(ck, "onnx")
    # a modified ONNX file is refused (or re-exported when allowed)
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match="corrupt or was modified"):
        Scorer.from_checkpoint(ck, "onnx", export_if_missing=False)
    assert np.allclose(Scorer.from_checkpoint(ck, "onnx").score(PROMPTS), ref, atol=1e-4)
    side = json.loads((ck / "model.onnx.json").read_text())
    side["weights_sha256"] = "0" * 64
    (ck / "model.onnx.json").write_text(json.dumps(side))
    with pytest.raises(CheckpointError, match="stale"):
        Scorer.from_checkpoint(ck, "onnx", export_if_missing=False)


def test_a_read_only_checkpoint_gets_its_exports_in_the_cache_once(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("onnxruntime")
    import shutil

    import headway.predict._export as export_mod
    import headway.predict.score as score_mod

    ck, shipped = tmp_path / "ck", tmp_path / "shipped"
    shutil.copytree(checkpoint, ck)
    shutil.copytree(checkpoint, shipped)
    score_mod.quantize_onnx(shipped)  # a checkpoint that comes with its exports
    read_only = {ck.resolve(), shipped.resolve()}
    monkeypatch.setattr(export_mod, "_writable", lambda path: path.resolve() not in read_only)  # root writes anywhere
    files = sorted(f.name for f in ck.iterdir())
    ref = Scorer.from_checkpoint(ck, "torch").score(PROMPTS)
    with caplog.at_level(logging.INFO, logger="headway.predict.score"):
        got = Scorer.from_checkpoint(ck, "onnx-int8").score(PROMPTS)
    assert sorted(f.name for f in ck.iterdir()) == files  # nothing written into the checkpoint
    where = score_mod.derived_dir(ck, "onnx-int8")
    said = [r.getMessage() for r in caplog.records if r.name == "headway.predict.score"]
    assert said == [  # one line for each file built on first use, saying where it is kept
        f"exporting ck's ONNX graph once (no ONNX export); cached at {where}",
        f"building ck's int8 scorer once (no int8 ONNX model); cached at {where / 'model.int8.onnx'}",
    ]
    caplog.clear()
    assert where.parent.name == "derived" and (where / "model.int8.onnx").is_file() and (where / "model.onnx").is_file()
    assert spearmanr(got, ref).statistic > 0.9

    def no_export(*args: object, **kw: object) -> Path:
        raise AssertionError("exported again")

    monkeypatch.setattr(score_mod, "export_onnx", no_export)
    monkeypatch.setattr(score_mod, "quantize_onnx", no_export)
    with caplog.at_level(logging.INFO, logger="headway.predict.score"):
        assert np.array_equal(Scorer.from_checkpoint(ck, "onnx-int8").score(PROMPTS), got)  # the cached exports
    assert not [r for r in caplog.records if r.name == "headway.predict.score"]  # nothing built: nothing said
    assert np.allclose(Scorer.from_checkpoint(ck, "onnx").score(PROMPTS), ref, atol=1e-4)
    assert score_mod.derived_dir(shipped, "onnx-int8") == shipped.resolve()  # used in place
    Scorer.from_checkpoint(shipped, "onnx-int8")


def test_int8_onnx_ranks_like_the_float_model_and_detects_changes(checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import shutil

    from headway.predict import quantize_onnx

    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    path = quantize_onnx(ck)  # exports the float model first
    assert path == ck / "model.int8.onnx" and (ck / "model.onnx").is_file()
    ref = Scorer.from_checkpoint(ck, "onnx").score(PROMPTS)
    int8 = Scorer.from_checkpoint(ck, "onnx-int8", batch_size=2)
    assert int8.backend == "onnx-int8"  # the header of `headway predictor eval` names it
    got = int8.score(PROMPTS)
    assert spearmanr(got, ref).statistic > 0.9
    assert float(np.max(np.abs(got - ref))) <= 0.1 * float(np.ptp(ref))
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match="corrupt or was modified"):
        Scorer.from_checkpoint(ck, "onnx-int8", export_if_missing=False)
    Scorer.from_checkpoint(ck, "onnx-int8")  # quantized again
    side = json.loads((ck / "model.int8.onnx.json").read_text())
    side["source_sha256"] = "0" * 64  # as if model.onnx had been exported again since
    (ck / "model.int8.onnx.json").write_text(json.dumps(side))
    with pytest.raises(CheckpointError, match="stale int8"):
        Scorer.from_checkpoint(ck, "onnx-int8", export_if_missing=False)
    Scorer.from_checkpoint(ck, "onnx-int8")
    side = json.loads((ck / "model.int8.onnx.json").read_text())
    assert side["per_channel"] is False and side["activations"] == "per_row"  # per-tensor weight scales pass
    del side["activations"]  # an int8 model made before activations were quantized per row
    (ck / "model.int8.onnx.json").write_text(json.dumps(side))
    with pytest.raises(CheckpointError, match="quantized per batch, not per row"):
        Scorer.from_checkpoint(ck, "onnx-int8", export_if_missing=False)
    one = Scorer.from_checkpoint(ck, "onnx-int8", batch_size=1).score(PROMPTS)  # quantized again
    assert np.allclose(one, Scorer.from_checkpoint(ck, "onnx-int8", batch_size=8).score(PROMPTS), atol=1e-5)


@pytest.mark.parametrize("passing_step", [1, 2, 3])
def test_int8_escalates_until_its_scores_match_the_float_model(
    passing_step: int, checkpoint: Path, tiny_encoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-tensor scales, then per-channel ones, then per-channel with the score head in float, then
    also the feed-forward output projections (the tiny encoder's one layer: ``layer.0/output/dense``):
    the first setting whose scores pass is kept. Settings before ``passing_step`` quantize another model."""
    pytest.importorskip("onnxruntime")
    import shutil

    import onnxruntime.quantization as ortq

    from headway.predict import quantize_onnx

    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    torch.manual_seed(1)
    encoder, tokenizer = load_encoder(tiny_encoder)
    other = save_checkpoint(
        LengthPredictor(encoder, "mean"), tokenizer, tmp_path / "other", fine_tuned=True, max_length=32
    )
    stray = export_onnx(other)  # scores nothing like ck's
    real = ortq.quantize_dynamic
    calls: list[tuple[bool, list[str]]] = []

    def quantize(source: str, target: str, **kw: object) -> None:
        calls.append((bool(kw["per_channel"]), list(cast(list[str], kw["nodes_to_exclude"]))))
        real(source if len(calls) > passing_step else str(stray), target, **kw)

    monkeypatch.setattr(ortq, "quantize_dynamic", quantize)
    quantize_onnx(ck)
    head = ["/head/Gemm", "/head/Gemm_MatMul"]  # (and as quantize_dynamic renames it)
    ffn = "/encoder/encoder/layer.0/output/dense/MatMul"
    ladder = [(False, []), (True, []), (True, head), (True, [*head, ffn])]
    assert calls == ladder[: passing_step + 1]
    side = json.loads((ck / "model.int8.onnx.json").read_text())
    assert (side["per_channel"], side["float_nodes"]) == ladder[passing_step]
    ref = Scorer.from_checkpoint(ck, "onnx").score(PROMPTS)
    got = Scorer.from_checkpoint(ck, "onnx-int8").score(PROMPTS)
    assert float(np.max(np.abs(got - ref))) <= 0.1 * float(np.ptp(ref))
    monkeypatch.setattr(ortq, "quantize_dynamic", lambda source, target, **kw: real(str(stray), target, **kw))
    with pytest.raises(CheckpointError, match="int8 scores differ too much"):
        quantize_onnx(ck)
    assert not (ck / ".model.int8.onnx.tmp").exists()


def test_int8_keeps_the_head_in_float(tiny_encoder: Path, tmp_path: Path) -> None:
    """A frozen-encoder head has the feature standardization folded in: weights of 1e4 and more on
    features that hardly vary (as some of MiniLM's do) beside weights near 1. Quantized with them,
    the others rounded to zero and every prompt scored the head's bias."""
    pytest.importorskip("onnxruntime")
    from headway.predict import quantize_onnx

    torch.manual_seed(0)
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    norm = encoder.encoder.layer[-1].output.LayerNorm
    with torch.no_grad():
        norm.weight[0] = norm.bias[0] = 0.0  # feature 0 is 0 for every prompt
        torch.nn.init.normal_(model.head.weight, std=1.0)
        model.head.weight[0, 0] = 3e4
    ck = save_checkpoint(model, tokenizer, tmp_path / "ck", fine_tuned=True, max_length=32)
    quantize_onnx(ck)
    ref = Scorer.from_checkpoint(ck, "onnx").score(PROMPTS)
    got = Scorer.from_checkpoint(ck, "onnx-int8").score(PROMPTS)
    assert float(np.max(np.abs(got - ref))) <= 0.1 * float(np.ptp(ref))
    assert "/head/Gemm" in json.loads((ck / "model.int8.onnx.json").read_text())["float_nodes"]


def test_a_checkpoint_asking_for_more_positions_than_its_encoder_has_scores_long_prompts(
    tiny_encoder: Path, tmp_path: Path
) -> None:
    """Trained on short prompts with max_length 1000 (512 positions): prompts are cut at 512 tokens."""
    pytest.importorskip("onnxruntime")
    encoder, tokenizer = load_encoder(tiny_encoder)
    ck = save_checkpoint(LengthPredictor(encoder, "mean"), tokenizer, tmp_path / "ck", fine_tuned=True, max_length=1000)
    prompts = ["word " * 700, "word " * 510, PROMPTS[0]]
    for backend in ("torch", "onnx", "onnx-int8"):
        scorer = Scorer.from_checkpoint(ck, backend)  # type: ignore[arg-type]
        assert scorer.max_length == 512
        scores = scorer.score(prompts)
        assert np.all(np.isfinite(scores)) and scores[0] == pytest.approx(scores[1], abs=1e-2)


def test_a_failed_export_leaves_the_earlier_one(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxruntime")
    import shutil

    import headway.predict.score as score_mod

    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    before = export_onnx(ck).read_bytes()
    for opset in (0, 9, 99):
        with pytest.raises(ValueError, match=rf"opset must be 14\.\.\d+ .*, got {opset}"):
            export_onnx(ck, opset=opset)
    monkeypatch.setattr(score_mod.OnnxBackend, "run", lambda self, ids, mask: np.zeros(len(ids)))
    with pytest.raises(CheckpointError, match="ONNX scores differ from torch"):
        export_onnx(ck, opset=18)
    assert (ck / "model.onnx").read_bytes() == before
    assert not (ck / ".model.onnx.tmp").exists()
    with pytest.raises(CheckpointError, match=f"{ck}: is a directory; give the path of the ONNX file"):
        export_onnx(ck, ck)


def test_ensure_predictor_uses_existing_and_refuses_missing(checkpoint: Path, tmp_path: Path) -> None:
    assert ensure_predictor(checkpoint, train_if_missing=False) == checkpoint
    with pytest.raises(CheckpointError, match="headway predictor train"):
        ensure_predictor("no-such-predictor", train_if_missing=False)


def test_the_gateway_scores_with_a_checkpoint_directory(checkpoint: Path) -> None:
    pytest.importorskip("httpx")
    from headway.serve import BackendConfig, GatewayConfig
    from headway.serve._scorer import load_score_fn

    expected = Scorer.from_checkpoint(checkpoint, cache_size=0, max_length=16).score(PROMPTS)
    got = load_score_fn(f"{checkpoint}:onnx", threads=1, max_length=16)(PROMPTS)
    assert np.allclose(got, expected, atol=1e-4)
    config = GatewayConfig(backends=(BackendConfig("http://a"),), scorer=str(checkpoint), scorer_max_length=16)
    assert config.scorer == str(checkpoint)
    with pytest.raises(ValueError, match=r"--scorer-max-length\): max_length must be 8\.\.32 tokens .*got 64"):
        load_score_fn(str(checkpoint), max_length=64)
