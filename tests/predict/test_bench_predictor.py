"""The scoring-speed benchmark (``benchmarks/bench_predictor.py``): the shipped predictor's rows, and the
CPU line that says whether ONNX Runtime's int8 kernels have VNNI to run on."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from factories import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("benchmarks/bench_predictor.py")


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    block = f"processor\t: {{}}\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 {flags}\n\n"
    path.write_text(block.format(0) + block.format(1))
    return path


def test_the_cpu_line_names_the_model_and_whether_int8_has_vnni(tmp_path: Path, bench: ModuleType) -> None:
    plain = bench.cpu_description(_cpuinfo(tmp_path, "avx avx2 fma"))
    assert plain.startswith("AMD EPYC 7B13, ") and "; avx2; no VNNI" in plain
    vnni = bench.cpu_description(_cpuinfo(tmp_path, "avx2 avx512f avx512_vnni"))
    assert "; avx2, avx512f, avx512_vnni; with VNNI" in vnni
    assert "with VNNI" in bench.cpu_description(_cpuinfo(tmp_path, "avx2 avx_vnni"))
    assert "VNNI" not in bench.cpu_description(tmp_path / "missing")  # no cpuinfo: the platform's name only


def test_the_shipped_predictor_is_timed_on_onnx_and_refused_on_torch(
    tmp_path: Path, bench: ModuleType, data_dir: Path
) -> None:
    out = tmp_path / "bench.md"
    argv = ["--model", "shipped", "--backends", "onnx,torch", "--score-max-length", "32", "--repeats", "1",
            "--single", "2", "--num-prompts", "40", "--data-dir", str(data_dir), "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    text = out.read_text()
    from headway.predict.shipped import SHIPPED_PREDICTOR, read_pack_header

    trained = read_pack_header()["max_length"]
    assert f"- checkpoint `{SHIPPED_PREDICTOR}`: the predictor shipped in the package (ONNX Runtime)" in text
    assert f"(`max_length` {trained} tokens)" in text
    rows = [line for line in text.splitlines() if line.startswith(f"| {SHIPPED_PREDICTOR} |")]
    assert len(rows) == 1 and rows[0].startswith(f"| {SHIPPED_PREDICTOR} | 6 | onnx | 32 | padding | ")
    assert f"- {SHIPPED_PREDICTOR} on torch: the shipped predictor runs on ONNX Runtime only" in text
    assert "alpaca_eval's 40 instructions" in text and "- threads: 2; CPU: " in text
    assert "- float32 matrix-multiply rate before the first row and after each: " in text
    share = rows[0].split(" | ")[-1].removesuffix(" |")  # 'GFLOP/s (share%)' of the encoder's operations
    gflops, pct = share.removesuffix("%)").split(" (")
    assert float(gflops) > 0 and int(pct) > 0


def test_a_pack_on_the_encoders_first_layers_is_listed_with_those(
    tmp_path: Path, bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from headway.predict import shipped

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 6}')
    header: dict[str, object] = {"pooling": "mean", "max_length": 96}

    def fake(**_kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(meta=dict(header), encoder=SimpleNamespace(model_dir=tmp_path), max_length=96)

    monkeypatch.setattr(shipped, "ShippedPredictor", fake)
    whole = bench._Shipped("onnx", threads=1, batch_size=8, max_length=None)
    assert bench._layers(bench._encoder_config(tmp_path / "pack.npz", whole.meta)) == 6  # the base encoder's own count
    header["encoder_layers"] = 4
    cut = bench._Shipped("onnx", threads=1, batch_size=8, max_length=None)
    assert bench._layers(bench._encoder_config(tmp_path / "pack.npz", cut.meta)) == 4


@pytest.mark.parametrize("n", ["0", "-5"])
def test_a_prompt_count_below_one_is_refused(bench: ModuleType, n: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--num-prompts", n])
    assert exc.value.code == 2 and f"--num-prompts must be >= 1, got {n}" in capsys.readouterr().err


def test_encoder_flops_count_the_dense_products_per_token_and_the_attention_per_batch(bench: ModuleType) -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 4, "intermediate_size": 8}
    # per token and layer 2 * (4 * 16 + 2 * 32) = 256; per layer and batch 4 * b * t^2 * 4
    one = 2 * (3 * 3 * 256 + 4 * 3 * 9 * 4)
    assert bench.encoder_flops([(3, 3)], config) == one
    assert bench.encoder_flops([(3, 3), (1, 5)], config) == one + 2 * (5 * 256 + 4 * 25 * 4)
    assert bench.encoder_flops([], config) == 0


def test_batch_shapes_are_the_forward_passes_the_scorer_ran(bench: ModuleType) -> None:
    from headway.predict.shipped import ShippedPredictor

    scorer = bench._Shipped("onnx", threads=1, batch_size=4, max_length=8)
    prompts = ["hi", "a much longer prompt than the others, cut at eight tokens", "two words", "x", "y z"]
    session = scorer._p.encoder._session
    shapes = bench.batch_shapes(scorer, prompts)
    assert scorer._p.encoder._session is session  # put back
    assert sum(b for b, _ in shapes) == len(prompts) and all(b <= 4 for b, _ in shapes)
    lengths = sorted(len(ids) for ids in scorer._p.encoder.token_ids(prompts))
    assert max(t for _, t in shapes) == lengths[-1] == 8  # truncated at max_length
    assert {t for _, t in shapes} <= set(lengths)  # each batch padded to its longest prompt
    assert sum(b * t for b, t in shapes) < len(prompts) * 8  # not every batch to max_length
    assert isinstance(scorer._p, ShippedPredictor)


def test_the_matmul_probe_times_the_product_it_names(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(ticks)) * 0.5)  # every run takes 0.5 s
    assert bench.matmul_rate(1, repeats=3, shape=(8, 4, 2)) == pytest.approx(2 * 8 * 4 * 2 / 0.5 / 1e9)
