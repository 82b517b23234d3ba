"""Readers against the real public files in the shared data folder (skipped when absent)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from headway.workload import load_workload, read_azure_trace, read_vidur_trace


def outputs(w: object) -> np.ndarray:
    return np.array([s.num_output_tokens for s in w])  # type: ignore[attr-defined]


def test_azure_conv_matches_published_statistics(data_dir: Path) -> None:
    w = read_azure_trace(data_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    assert len(w) == 19_366
    out = outputs(w)
    assert out.mean() == pytest.approx(211, abs=0.5)
    assert np.percentile(out, [50, 90, 99]).tolist() == pytest.approx([129, 424, 601], abs=0.5)
    assert w.requests[0].arrival_time == 0.0
    assert w.duration == pytest.approx(3501.722, abs=1e-3)


@pytest.mark.parametrize("trace", ["code", "conv"])
def test_azure_times_agree_with_vidurs_processed_copy(data_dir: Path, trace: str) -> None:
    azure = read_azure_trace(data_dir / "azure_llm_2023" / f"AzureLLMInferenceTrace_{trace}.csv")
    vidur = read_vidur_trace(data_dir / "vidur_traces" / f"splitwise_{trace}.csv")
    assert len(azure) == len(vidur)
    a = np.array([s.arrival_time for s in azure])
    v = np.array([s.arrival_time for s in vidur])
    assert np.max(np.abs(a - v)) < 1e-5
    assert [s.num_prompt_tokens for s in azure] == [s.num_prompt_tokens for s in vidur]


def test_azure_code_is_short_and_bursty(data_dir: Path) -> None:
    w = load_workload("azure-code", data_dir=data_dir)
    assert w.name == "azure-code" and len(w) == 8_819
    assert outputs(w).mean() == pytest.approx(28, abs=0.5)
    gaps = np.diff([s.arrival_time for s in w])
    assert gaps.std() / gaps.mean() == pytest.approx(13, abs=0.5)


def test_arxiv_lengths_without_times(data_dir: Path) -> None:
    w = load_workload("arxiv", data_dir=data_dir, rate=10.0, seed=1)
    assert len(w) == 28_257
    assert (len(w) - 1) / w.duration == pytest.approx(10.0, rel=0.05)
    assert w.requests[0].num_prompt_tokens > 0


def test_sharegpt_first_turn_uses_recorded_cl100k_counts(data_dir: Path) -> None:
    w = load_workload("sharegpt", data_dir=data_dir)
    assert len(w) == 17_332 and w.meta["skipped"] == 0
    # sharegpt/summary.txt: first-turn response cl100k tokens mean 301.4, p50 270
    assert outputs(w).mean() == pytest.approx(301.4, abs=0.1)
    assert np.median(outputs(w)) == 270


def test_alpaca_eval_lengths_match_model_summary(data_dir: Path) -> None:
    model = "Meta-Llama-3-8B-Instruct"
    with (data_dir / "alpaca_eval" / "model_summary.csv").open() as f:
        summary = {row["model"]: row for row in csv.DictReader(f)}[model]
    w = load_workload("alpaca-eval", data_dir=data_dir, model=model)
    assert len(w) == int(summary["rows"]) == 805
    assert outputs(w).mean() == pytest.approx(float(summary["mean_tok"]), abs=0.05)
    with pytest.raises(ValueError, match=r"close matches: .*Meta-Llama-3-8B-Instruct"):
        load_workload("alpaca-eval", data_dir=data_dir, model="meta-llama-3-8b-instruct-x")
