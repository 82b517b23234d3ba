"""The documentation's generated results pages: up to date, and built from the result files as stated."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from factories import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> ModuleType:
    return load_script("scripts/results_pages.py")


def test_committed_pages_are_up_to_date(pages: ModuleType) -> None:
    expected = pages.expected_files()
    stale = [str(p.relative_to(ROOT)) for p, data in expected.items() if not p.is_file() or p.read_bytes() != data]
    assert stale == [], "run: python scripts/results_pages.py"


def test_every_canonical_result_file_exists_and_has_one_page(pages: ModuleType) -> None:
    slugs = [b.slug for b in pages.BENCHMARKS]
    assert len(set(slugs)) == len(slugs)
    files = [f for b in pages.BENCHMARKS for f in b.files]
    assert len(set(files)) == len(files)
    assert [f for f in files if not (pages.RESULTS / f).is_file()] == []


def test_notes_after_the_stop_heading_and_relative_links_are_left_out(pages: ModuleType) -> None:
    text = ("# Title\n\nrun by [this](other.md) and [site](https://x.org)\n\n"
            "## Run\n\n| a |\n|---|\n| 1 |\n\n## Notes\n\nlater")
    out = pages._md_measurements(text, "## Notes")
    assert out == "run by this and [site](https://x.org)\n\n### Run\n\n| a |\n|---|\n| 1 |"
    assert pages._md_measurements("```\n## Notes inside a block\n```\n## Notes\nx", "## Notes") == (
        "```\n## Notes inside a block\n```"
    )


def test_gateway_vllm_command_is_rebuilt_from_the_saved_arguments(pages: ModuleType) -> None:
    # an option at its empty default is left out (it used to print a dangling "--simulate-pack "),
    # and a value with a space is quoted for the shell
    args = {"num_requests": 96, "no_stream": False, "pin_client": True, "gateway_logs": None, "json": "x.json",
            "simulate_pack": "", "policies": "pars sjf"}
    assert pages.gateway_vllm_command(args) == (
        "python benchmarks/bench_gateway_vllm.py --num-requests 96 --pin-client "
        "--json benchmarks/results/gateway_vllm.json --policies 'pars sjf'"
    )
    saved = json.loads((pages.RESULTS / "gateway_vllm.json").read_text())
    assert set(saved["results"]) == {row.split(" | ")[0].lstrip("| ") for row in
                                     pages.gateway_vllm_table(saved).splitlines()[2:] if row.startswith("|")}

    probed = {**saved, "matmul_gflops": [150.25, 98.0]}  # files written before the probe have none
    assert "matrix-multiply" not in pages.gateway_vllm_table({k: v for k, v in saved.items() if k != "matmul_gflops"})
    assert "before vLLM started and after it stopped: 150.2 / 98.0 GFLOP/s." in pages.gateway_vllm_table(probed)


def test_nav_names_only_pages_that_exist(pages: ModuleType) -> None:
    pytest.importorskip("yaml")
    assert pages.missing_nav_pages() == []


def test_the_measuring_machines_paths_are_left_out(pages: ModuleType) -> None:
    text = "trace /work/shared/data/vidur/x.csv\n`VIDUR_PATH=/work/vidur-src run --out /tmp/a/b.md`"
    assert pages._md_measurements(text, None) == "trace $HEADWAY_DATA_DIR/vidur/x.csv\n`VIDUR_PATH=PATH run --out PATH`"


def test_gateway_throughput_page_shows_each_run_and_its_ratio_to_direct(pages: ModuleType) -> None:
    saved = json.loads((pages.RESULTS / "gateway_throughput.json").read_text())
    text = pages.gateway_throughput_table(saved)
    runs = [row.split(" | ")[0].lstrip("| ") for row in text.split("\n\n")[0].splitlines()[2:]]
    assert runs == list(saved["summary"])
    for label, s in saved["summary"].items():
        ratios = s.get("request_throughput_ratio")
        if ratios is None:
            assert label == "vllm-direct"
            continue
        assert len(ratios["rounds"]) == saved["args"]["repeats"] >= 4
        assert ratios["min"] <= ratios["median"] <= ratios["max"]
        assert f"{ratios['median']:.4f} ({ratios['min']:.4f} to {ratios['max']:.4f})" in text


def test_plugin_pars_page_carries_the_claim_row_with_its_verdict(pages: ModuleType) -> None:
    saved = json.loads((pages.RESULTS / "plugin_pars.json").read_text())
    text = pages.plugin_pars_table(saved)
    row = saved["claim_row"]
    assert f"| {row['measured']} | {row['rule']} | {row['verdict']} |" in text
    means = saved["ratios"]["mean_per_token_latency"]["rounds"]
    assert len(means) == saved["args"]["repeats"] >= 3
    assert row["measured"].startswith(f"{sum(means) / len(means):.3g}x")
