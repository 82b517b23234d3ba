"""The step-log cost-model fit (``fit_step_samples``) on synthetic logs from a known model."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import warnings

import pytest

from headway.sim import CostModel
from headway.sim._calibrate import fit_from_step_log, fit_step_samples, step_samples
from headway.sim._cost import StepSample
from sim._steplog import TRUE, Comp, base_model, log, mixed, rows, true_time


def test_one_or_two_repeated_token_counts_do_not_decide_the_new_count_cost() -> None:
    """Prefill steps of 1,000 sizes: nearly every one is new, and the one or two that repeat a count
    cannot tell the one-time cost of a new count from the per-prefill-step constant (they traded
    off: 5-24 ms of new-count cost, per_prefill_step 0, per_token down to 55 us)."""
    sizes = list(range(16, 16 + 8 * 1000, 8))
    for seed in range(12):
        fit, _ = fit_from_step_log(log(mixed(400, seed, sizes), noise=0.05, seed=seed + 100), "x")
        assert fit.new_shape_cost_s < 1e-3, seed  # true 0
        assert fit.model.per_token == pytest.approx(TRUE["per_token"], rel=0.03), seed
        assert abs(fit.prefill_time_error) < 0.005, seed


def test_a_mix_of_new_and_repeated_counts_recovers_the_new_count_cost() -> None:
    fs, ps = [], []
    for seed in range(10):
        lg = log(mixed(400, seed, [64, 256, 512, 1024]), noise=0.02, seed=seed + 100, new_shape_cost=2.5e-3)
        fit, _ = fit_from_step_log(lg, "x")
        fs.append(fit.new_shape_cost_s)
        ps.append(fit.model.per_prefill_step)
    assert statistics.fmean(fs) == pytest.approx(2.5e-3, rel=0.05)
    assert statistics.fmean(ps) == pytest.approx(TRUE["per_prefill_step"], rel=0.05)


def _all_new_prefills(n: int, seed: int) -> list[Comp]:
    rng = random.Random(seed)
    out: list[Comp] = []
    used: set[int] = set()
    for _ in range(n):
        seqs = rng.randint(1, 8)
        prefill = 0
        if rng.random() < 0.25:
            while True:
                prefill = rng.randint(16, 1024)
                if seqs + prefill not in used:
                    break
            used.add(seqs + prefill)
        out.append((seqs + prefill, seqs, seqs * rng.randint(16, 1500), rng.choice([0, 0, 0, 1, 2])))
    return out


def test_every_prefill_count_new_takes_the_new_count_cost_from_the_decode_steps() -> None:
    """Every prefill step runs a new token count: the prefill stage cannot fit the one-time cost,
    which landed on per_prefill_step (4.6 ms for 2.0); the decode steps' estimate is used instead."""
    lg = log(_all_new_prefills(400, 0), noise=0.02, seed=1, new_shape_cost=2.5e-3)
    pre = [s for s in step_samples(lg.steps) if s.num_tokens > s.num_seqs]
    assert pre and all(s.new_shape for s in pre)
    fit, _ = fit_from_step_log(lg, "x")
    assert fit.new_shape_cost_s == pytest.approx(2.5e-3, rel=0.1)
    assert fit.model.per_prefill_step == pytest.approx(TRUE["per_prefill_step"], rel=0.15)
    assert fit.model.step_overhead == pytest.approx(TRUE["step_overhead"], rel=0.05)


def _fixed_batch(n: int, seed: int, seqs_fixed: int) -> list[Comp]:
    rng = random.Random(seed)
    out: list[Comp] = []
    for _ in range(n):
        if rng.random() < 0.25:
            prefill, seqs = rng.choice([64, 256, 512, 1024]), 1  # lone prefills
        else:
            prefill, seqs = 0, seqs_fixed
        out.append((seqs + prefill, seqs, seqs * rng.randint(16, 1500), 0))
    return out


@pytest.mark.parametrize("seqs", [1, 4])
def test_decode_steps_of_one_batch_size_fall_back_to_the_joint_fit_and_say_so(seqs: int) -> None:
    """All decode-only steps of one batch size: their intercept and per-sequence columns are
    collinear, and the split fit returned per_token 0 and 28.6 ms per prefill step (R^2 0.56)."""
    lg = log(_fixed_batch(400, 0, seqs), noise=0.02, seed=1)
    with pytest.warns(RuntimeWarning, match=f"all 300 decode-only steps ran {seqs} sequences"):
        fit, meta = fit_from_step_log(lg, "x")
    assert "joint fit" in fit.note and meta["fit"]["note"] == fit.note
    assert fit.r2 > 0.99
    assert fit.model.per_token == pytest.approx(TRUE["per_token"], rel=0.03)
    for p in (64, 1024):
        assert fit.model.step_time(p + 1, 1, p) == pytest.approx(true_time(p + 1, 1, p), rel=0.03)
    with warnings.catch_warnings():  # varied batch sizes: the split fit, no warning
        warnings.simplefilter("error")
        ok, _ = fit_from_step_log(log(mixed(400, 0), noise=0.02, seed=1), "x")
    assert ok.note == ""


def _outlier_comps(n: int, seed: int) -> list[Comp]:
    rng = random.Random(seed)
    out: list[Comp] = []
    for _ in range(n):
        seqs = rng.randint(1, 8)
        prefill = rng.choice([64, 128, 256, 512, 1024]) if rng.random() < 0.25 else 0
        out.append((seqs + prefill, seqs, seqs * rng.randint(16, 1500), rng.choice([0, 0, 0, 1, 2])))
    return out


def test_the_outlier_rule_keeps_long_steps_and_new_counts_and_drops_slow_steps() -> None:
    """Absolute residuals (without the new-count cost) dropped every step of a new token count and
    most of the longest prefill steps; relative residuals of the full model drop the slow ones."""
    ss = step_samples(rows(_outlier_comps(400, 0), noise=0.03, seed=1, new_shape_cost=5e-3))
    plain = fit_step_samples(ss, base_model(), "x")
    fit = fit_step_samples(ss, base_model(), "x", outlier_mad=3.0)
    assert fit.num_new_shapes == sum(s.new_shape for s in ss) == plain.num_new_shapes
    assert fit.num_outliers <= 4
    assert fit.new_shape_cost_s == pytest.approx(5e-3, rel=0.1)
    ss = step_samples(rows(_outlier_comps(400, 0), noise=0.03, seed=1))
    slow = {7, 50, 123, 250, 333}  # a descheduled engine: these took 4x as long
    bad = [dataclasses.replace(s, duration=s.duration * 4) if i in slow else s for i, s in enumerate(ss)]
    fit = fit_step_samples(bad, base_model(), "x", outlier_mad=3.0)
    assert 5 <= fit.num_outliers <= 25  # the first fit, skewed by the slow steps, drops a few more
    assert fit.model.per_token == pytest.approx(TRUE["per_token"], rel=0.03)
    assert fit.model.per_prefill_step == pytest.approx(TRUE["per_prefill_step"], rel=0.15)
    assert fit.model.step_overhead == pytest.approx(TRUE["step_overhead"], rel=0.05)
    kept = fit_step_samples(ss, base_model(), "x", outlier_mad=3.0)  # no slow steps: the long ones stay
    assert kept.num_outliers <= 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1e-3])
@pytest.mark.parametrize("method", ["split", "nnls"])
def test_bad_durations_are_named_before_fitting(bad: float, method: str) -> None:
    rng = random.Random(0)
    good = [
        StepSample(s + p, s, s * 100, true_time(s + p, s, s * 100))
        for s, p in [(rng.randint(1, 8), rng.choice([0, 0, 0, 200, 500])) for _ in range(40)]
    ]
    good[3] = dataclasses.replace(good[3], duration=bad)
    with pytest.raises(ValueError, match=r"step sample 3 \(.*\) has duration .*positive and finite"):
        fit_step_samples(good, base_model(), "x", method=method)


def test_samples_of_one_composition_are_an_error() -> None:
    same = [StepSample(4, 4, 400, 0.005 * (1 + 0.01 * i)) for i in range(6)]
    for method in ("split", "nnls"):
        with pytest.raises(ValueError, match="same composition"):
            fit_step_samples(same, base_model(), "x", method=method)
    with pytest.raises(ValueError, match="same composition"):
        CostModel.fit(same, base_model(), "x")


def test_arrivals_during_the_last_step_before_idle_are_counted() -> None:
    """A step after which the engine had nothing to run (``busy`` false) still ran while requests
    arrived when the next step followed at once; the simulator charges per_arrival to the step in
    flight, so the sample counts them. After a wait, they may have come during the wait."""
    lines = rows([(4, 4, 400, 0), (3, 3, 300, 2), (5, 5, 500, 0), (2, 2, 200, 1), (6, 6, 600, 0)], noise=0.0)
    lines[1]["busy"] = False  # the next step follows at once: requests came in while it ran
    lines[3]["busy"] = False
    for later in lines[4:]:  # ... and after this one the engine waited
        later["t0"] += 1.0
        later["t3"] += 1.0
    ss = step_samples(lines)
    assert ss[1].num_arrivals == 2
    assert ss[1].duration == pytest.approx(true_time(3, 3, 300, 2), rel=1e-9)
    assert ss[3].num_arrivals == 0  # arrivals counted by a line after a wait are not this step's


def test_describe_names_every_time_constant() -> None:
    m = CostModel("t", 4e-3, 6e-5, 2e-4, 3e-7, gpu_memory_bytes=1e9, weight_bytes=0.0, kv_bytes_per_token=1.0,
                  per_prefill_step=2e-3, per_arrival=1.5e-3, swap_per_token=5.2e-6)  # fmt: skip
    text = m.describe()
    assert "5.200 us/token" in text and "swap" in text
    assert "swap" not in dataclasses.replace(m, swap_per_token=0.0).describe()
