"""Cost models: presets, capacity, fitting from measured steps, JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from headway.sim import PRESETS, CostModel, StepSample, load_preset


def test_presets_are_plausible() -> None:
    a100, h100, l4 = PRESETS["llama3-8b-a100"], PRESETS["llama3-8b-h100"], PRESETS["llama3-8b-l4"]
    # a decode step of one sequence reads the 16 GB of weights: ~10 ms on A100, faster on H100,
    # several times slower on L4's 300 GB/s
    assert 5e-3 < a100.step_time(1, 1, 1000) < 20e-3
    assert h100.step_time(1, 1, 1000) < a100.step_time(1, 1, 1000) < l4.step_time(1, 1, 1000)
    # prefill of 1,000 tokens: tens of milliseconds on A100 (compute bound)
    assert 0.05 < a100.step_time(1000, 1, 1000) < 0.3
    # KV capacity: A100-80GB holds hundreds of thousands of tokens, L4 tens of thousands
    assert 300_000 < a100.num_gpu_blocks(0.9, 16) * 16 < 500_000
    assert 10_000 < l4.num_gpu_blocks(0.9, 16) * 16 < 60_000
    seventy = PRESETS["llama3-70b-4xh100"]
    assert seventy.num_gpu_blocks(0.9, 16) > 0 and seventy.step_overhead > h100.step_overhead


def test_fixed_step_takes_the_same_time_for_any_step_and_never_fills_its_cache() -> None:
    cost = CostModel.fixed_step(0.25)
    assert cost.name == "fixed-step"
    assert {cost.step_time(n, s, kv) for n, s, kv in [(1, 1, 0), (8192, 256, 10**6), (512, 1, 131_072)]} == {0.25}
    assert cost.num_gpu_blocks(0.9, 16) * 16 > 10**11  # no KV bound a workload could reach
    assert CostModel.fixed_step(1.0, name="unit-step").name == "unit-step"
    with pytest.raises(ValueError, match="step_overhead must be >= 0"):
        CostModel.fixed_step(-1.0)
    with pytest.raises(ValueError, match="a step must take positive time"):
        CostModel.fixed_step(0.0)


def test_fit_recovers_constants() -> None:
    truth = CostModel("t", step_overhead=0.004, per_token=5e-5, per_seq=1e-5, per_kv_token=2e-8,
                      gpu_memory_bytes=1e10, weight_bytes=1e9, kv_bytes_per_token=1e4, per_prefill_step=0.002,
                      per_arrival=0.0015)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(300):
        tokens, seqs, kv = int(rng.integers(1, 4096)), int(rng.integers(1, 128)), int(rng.integers(1, 200_000))
        if rng.random() < 0.4:  # a decode-only step
            tokens = seqs
        noise = 1.0 + 0.01 * rng.standard_normal()
        arrivals = int(rng.integers(0, 3))
        samples.append(StepSample(tokens, seqs, kv, 0.0, arrivals))
        samples[-1] = StepSample(tokens, seqs, kv, truth.sample_time(samples[-1]) * noise, arrivals)
    fitted = CostModel.fit(samples, base=truth, name="fitted")
    assert fitted.step_overhead == pytest.approx(truth.step_overhead, rel=0.1)
    assert fitted.per_token == pytest.approx(truth.per_token, rel=0.02)
    assert fitted.per_kv_token == pytest.approx(truth.per_kv_token, rel=0.05)
    assert fitted.per_prefill_step == pytest.approx(truth.per_prefill_step, rel=0.15)
    assert fitted.per_arrival == pytest.approx(truth.per_arrival, rel=0.15)
    assert truth.step_time(8, 8, 100) + truth.per_prefill_step == pytest.approx(truth.step_time(9, 8, 100) - 5e-5)
    assert fitted.kv_bytes_per_token == truth.kv_bytes_per_token  # memory figures from the base
    # an empty step is never sampled: its time is the base's
    assert CostModel.fit(samples, base=dataclasses.replace(truth, empty_step=3e-4), name="f").empty_step == 3e-4


def test_fit_needs_samples_and_positive_durations() -> None:
    base = PRESETS["llama3-8b-a100"]
    with pytest.raises(ValueError, match="at least 4"):
        CostModel.fit([StepSample(1, 1, 1, 0.01)], base=base, name="x")
    with pytest.raises(ValueError, match="positive"):
        CostModel.fit([StepSample(i + 1, 1, 1, -0.01) for i in range(5)], base=base, name="x")


def test_json_round_trip_and_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    PRESETS["llama3-8b-l4"].save(path)
    assert load_preset(path) == PRESETS["llama3-8b-l4"]
    assert load_preset(str(path)) == PRESETS["llama3-8b-l4"]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a headway cost model"):
        load_preset(tmp_path / "bad.json")


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="llama3-8b-a100"):
        load_preset("gpt-9")


def test_a_step_that_only_preempted_takes_empty_step_said_and_scaled_with_the_rest(tmp_path: Path) -> None:
    from headway.sim._calibrate import scaled

    base = PRESETS["llama3-8b-a100"]
    assert base.empty_step == 0.0 and "only preempted" not in base.describe()
    mine = dataclasses.replace(base, empty_step=2e-4)
    assert "; a step that only preempted 0.200 ms" in mine.describe()
    assert scaled(mine, 2.0).empty_step == pytest.approx(4e-4)
    mine.save(tmp_path / "m.json")
    assert load_preset(tmp_path / "m.json") == mine


@pytest.mark.parametrize("field", ["per_token", "per_kv_token", "step_overhead", "empty_step"])
def test_negative_constants_rejected_by_name(field: str) -> None:
    kwargs = {"name": "x", "step_overhead": 0.01, "per_token": 1e-4, "per_seq": 0.0, "per_kv_token": 1e-8,
              "gpu_memory_bytes": 1e10, "weight_bytes": 1e9, "kv_bytes_per_token": 1e3, field: -1.0}
    with pytest.raises(ValueError, match=field):
        CostModel(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"gpu_memory_bytes": "x"}, "field 'gpu_memory_bytes' must be a number, got 'x'"),
        ({"per_token": True}, "field 'per_token' must be a number, got True"),
        ({"name": None}, "field 'name' must be a non-empty string, got None"),
        ({"extra": 1}, r"unknown fields: extra"),
        ({"weight_bytes": -5.0}, "weight_bytes must be >= 0 and finite, got -5.0"),
        ({"kv_bytes_per_token": float("nan")}, "kv_bytes_per_token must be > 0"),
    ],
)
def test_bad_fields_in_a_cost_model_file_are_named(tmp_path: Path, change: dict[str, object], error: str) -> None:
    path = tmp_path / "mine.json"
    PRESETS["llama3-8b-l4"].save(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: .*{error}"):
        load_preset(path)


def test_cost_model_files_that_are_not_objects_or_not_utf8_name_the_file(tmp_path: Path) -> None:
    for i, content in enumerate((b"[1, 2]", b"null", b"\xff\xfe{")):
        path = tmp_path / f"bad{i}.json"
        path.write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(f"{path}: not a headway cost model JSON file")):
            load_preset(path)
    fields = dataclasses.asdict(PRESETS["llama3-8b-l4"])
    del fields["per_token"]
    (tmp_path / "short.json").write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="missing fields: per_token"):
        load_preset(tmp_path / "short.json")


def test_memory_figures_must_be_finite_and_non_negative() -> None:
    with pytest.raises(ValueError, match="gpu_memory_bytes must be >= 0 and finite, got inf"):
        dataclasses.replace(PRESETS["llama3-8b-l4"], gpu_memory_bytes=float("inf"))
