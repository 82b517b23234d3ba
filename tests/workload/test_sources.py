from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from headway.core import Tier
from headway.workload import (
    DEFAULT_TENANT_MIX,
    TenantMix,
    UnknownWorkloadError,
    WorkloadFormatError,
    available_formats,
    available_workloads,
    default_workload,
    find_data_dir,
    load_workload,
    workload_description,
)

TextWriter = Callable[[Path, str], Path]  # the write_text fixture (conftest.py)
JsonlWriter = Callable[[Path, Sequence[object]], Path]  # the write_jsonl fixture


def azure_file(write_text: TextWriter, tmp_path: Path, n: int = 40) -> Path:
    rows = "".join(f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.5000000,{100 + i},{1 + i}\n" for i in range(n))
    return write_text(tmp_path / "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)


def sharegpt_file(write_text: TextWriter, tmp_path: Path, n: int = 30) -> Path:
    records = [
        {
            "id": f"s{i}",
            "conversations": [
                {"from": "human", "value": "q" * (4 * i + 4)},
                {"from": "gpt", "value": "a" * (8 * i + 8)},
            ],
        }
        for i in range(n)
    ]
    return write_text(tmp_path / "sg.json", json.dumps(records))


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownWorkloadError) as info:
        load_workload("azure-chat")
    message = str(info.value)
    for name in ("default", "burst", "azure-conv", "azure-code", "sharegpt", "alpaca-eval"):
        assert name in message
    assert set(available_workloads()) >= {"default", "burst", "azure-conv", "azure-code", "arxiv"}
    typos = (("azure_conv", "azure-conv"), ("ShareGPT", "sharegpt"), ("sharegpt-session", "sharegpt-sessions"))
    for typo, meant in typos:
        with pytest.raises(UnknownWorkloadError, match=f"did you mean '{meant}'"):
            load_workload(typo)
    with pytest.raises(UnknownWorkloadError) as far:
        load_workload("qqqq")
    assert "did you mean" not in str(far.value)


def test_unknown_option_lists_valid_options() -> None:
    with pytest.raises(TypeError, match=r"unknown workload option\(s\) reqs; valid options: num_requests"):
        load_workload("default", reqs=3)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"rate": 0.0}, "rate must be a positive finite number, got 0.0"),
        ({"burstiness": float("nan")}, "got nan"),
        ({"num_requests": -3}, "got -3"),
        ({"output_cv": -0.5}, "got -0.5"),
        ({"arrivals": "uniform"}, "got 'uniform'"),
        ({"tenants": "some"}, "got 'some'"),
        ({"format": "parquet"}, "got 'parquet'"),
        ({"model": "gpt-4"}, "only applies to alpaca_eval"),
        ({"arrivals": "trace"}, "no recorded times"),
        ({"arrivals": "poisson", "burstiness": 0.5}, "got burstiness=0.5"),
    ],
)
def test_bad_options_name_the_value(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        load_workload("default", **{"num_requests": 5, **options})
    assert fragment in str(info.value)


def test_default_and_burst() -> None:
    assert load_workload("default", num_requests=100, seed=3) == default_workload(100, seed=3)
    burst = load_workload("burst")
    assert len(burst) == 2000 and burst.duration == 0.0
    assert {s.tier for s in burst} == {Tier.PREMIUM, Tier.STANDARD, Tier.BATCH}
    poisson = load_workload("default", num_requests=50, arrivals="poisson", rate=10.0)
    assert poisson.meta["arrivals"] == "PoissonArrivals(rate=10.0, start=0.0)"
    with pytest.raises(ValueError, match="burst arrivals"):
        load_workload("burst", arrivals="gamma")


def test_default_tenants_can_be_turned_off() -> None:
    w = load_workload("default", num_requests=50, tenants="none")
    assert {s.tenant_id for s in w} == {"default"}


def test_file_formats_are_sniffed(write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    az = load_workload(str(azure_file(write_text, tmp_path)))
    assert az.meta["format"] == "azure" and len(az) == 40
    vidur = write_text(tmp_path / "v.csv.gz", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,6\n1.5,7,8\n")
    assert load_workload(str(vidur)).meta["format"] == "vidur"
    moon = write_jsonl(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 3, "output_length": 4, "hash_ids": []}])
    assert load_workload(str(moon)).meta["format"] == "mooncake"
    assert load_workload(str(sharegpt_file(write_text, tmp_path))).meta["format"] == "sharegpt"
    first_turn = write_jsonl(tmp_path / "ft.jsonl", [{"id": "x", "prompt": "hi", "response": "yo"}])
    assert load_workload(str(first_turn)).meta["format"] == "sharegpt"
    outputs = write_text(
        tmp_path / "model_outputs.json",
        '[\n  {\n    "dataset": "d",\n    "instruction": "hi",\n    "output": "hello",\n    "generator": "g"\n  }\n]',
    )
    assert load_workload(str(outputs)).meta["format"] == "alpaca-eval-outputs"
    assert load_workload(str(outputs), model="g").meta["model"] == "g"
    assert set(available_formats()) == {
        "azure",
        "vidur",
        "mooncake",
        "burstgpt",
        "sharegpt",
        "alpaca-eval",
        "alpaca-eval-outputs",
        "jsonl",
    }


def test_sniffing_a_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_bytes(b"\x1f\x8bgarbage")
    with pytest.raises(WorkloadFormatError, match=r"x\.csv.*corrupt gzip"):
        load_workload(str(bad))


def test_alpaca_folder_and_model_option(write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "instructions.jsonl", [{"idx": 0, "dataset": "d", "instruction": "say hi"}])
    write_text(tmp_path / "output_lengths_long.csv.gz", "model,idx,chars,words,cl100k_tokens\nM,0,9,2,3\n")
    w = load_workload(str(tmp_path), model="M")
    assert [(s.num_output_tokens, s.category) for s in w] == [(3, "d")]
    assert load_workload(str(tmp_path / "instructions.jsonl"), model="M") == w


def test_format_flag_overrides_sniffing(write_text: TextWriter, tmp_path: Path) -> None:
    odd = write_text(tmp_path / "odd.txt", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,2\n")
    assert len(load_workload(str(odd), format="vidur")) == 1
    unknown = write_text(tmp_path / "mystery.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(WorkloadFormatError, match=r"mystery.csv:1: header: cannot tell the format.*format="):
        load_workload(str(unknown))


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_file_is_named_empty_not_of_an_unknown_format(
    write_text: TextWriter, tmp_path: Path, text: str
) -> None:
    empty = write_text(tmp_path / "log.jsonl", text)
    with pytest.raises(WorkloadFormatError, match=r"log\.jsonl: empty file \(no line but blank ones\): no requests$"):
        load_workload(str(empty))


def test_a_path_object_loads_as_its_string_does(write_text: TextWriter, tmp_path: Path) -> None:
    path = azure_file(write_text, tmp_path)
    from_path = load_workload(path, num_requests=5)
    assert from_path == load_workload(str(path), num_requests=5)
    assert from_path.name == "trace"
    with pytest.raises(TypeError, match="workload name or a file path, got int"):
        load_workload(3)  # type: ignore[arg-type]


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.csv"):
        load_workload(str(tmp_path / "absent.csv"))


def test_timed_trace_num_requests_rate_and_burstiness(write_text: TextWriter, tmp_path: Path) -> None:
    path = str(azure_file(write_text, tmp_path, n=120))
    first = load_workload(path, num_requests=10)
    assert [s.num_prompt_tokens for s in first] == list(range(100, 110))
    assert first.duration == pytest.approx(9.0)
    scaled = load_workload(path, rate=4.0)
    assert (len(scaled) - 1) / scaled.duration == pytest.approx(4.0)
    assert [s.num_prompt_tokens for s in scaled] == list(range(100, 220))
    gamma = load_workload(path, burstiness=0.5, seed=1)
    assert gamma.meta["arrivals"] == "GammaArrivals(rate=1.0, burstiness=0.5, start=0.0)"
    assert gamma == load_workload(path, burstiness=0.5, seed=1)
    assert load_workload(path, arrivals="burst").duration == 0.0
    with pytest.raises(ValueError, match="cannot take num_requests=500"):
        load_workload(path, num_requests=500)


def test_untimed_dataset_sampling_and_arrivals(write_text: TextWriter, tmp_path: Path) -> None:
    path = str(sharegpt_file(write_text, tmp_path, n=30))
    burst = load_workload(path)
    assert burst.duration == 0.0 and len(burst) == 30
    sample = load_workload(path, num_requests=10, seed=2)
    assert len(sample) == 10 and sample == load_workload(path, num_requests=10, seed=2)
    assert len({s.request_id for s in sample}) == 10
    more = load_workload(path, num_requests=100, rate=5.0, seed=2)
    assert len(more) == 100 and len({s.request_id for s in more}) == 100
    assert more.meta["arrivals"] == "GammaArrivals(rate=5.0, burstiness=1.0, start=0.0)"
    times = np.array([s.arrival_time for s in more])
    assert np.all(np.diff(times) >= 0)
    with pytest.raises(ValueError, match="no recorded arrival times"):
        load_workload(path, arrivals="trace")
    with pytest.raises(ValueError, match="needs a rate"):
        load_workload(path, arrivals="gamma")


def test_output_cv_and_tenants_options(write_text: TextWriter, tmp_path: Path) -> None:
    path = str(sharegpt_file(write_text, tmp_path, n=30))
    plain = load_workload(path)
    noisy = load_workload(path, output_cv=0.5, seed=1)
    assert noisy == load_workload(path, output_cv=0.5, seed=1)
    assert [s.num_output_tokens for s in noisy] != [s.num_output_tokens for s in plain]
    assert [s.num_prompt_tokens for s in noisy] == [s.num_prompt_tokens for s in plain]
    assert {s.tenant_id for s in plain} == {"default"}
    mixed = load_workload(path, tenants="default")
    assert {s.tenant_id for s in mixed} <= {t.tenant_id for t in DEFAULT_TENANT_MIX.tenants}
    solo = load_workload(path, tenants=TenantMix.of(("solo", 1.0, "batch")))
    assert {(s.tenant_id, s.tier) for s in solo} == {("solo", Tier.BATCH)}


def test_find_data_dir_honours_env_and_reports_what_it_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path.resolve()
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match=r"gone.*HEADWAY_DATA_DIR") as info:
        load_workload("azure-conv")
    # the command line's user gets the variable to set and where the folder is described, not only
    # the Python argument
    assert "set HEADWAY_DATA_DIR to the folder" in str(info.value) and "docs/workloads.md" in str(info.value)


@pytest.mark.parametrize(
    ("name", "missing"),
    [("azure-conv", "azure_llm_2023"), ("alpaca-eval", "alpaca_eval"), ("sharegpt-sessions", "sharegpt")],
)
def test_a_data_folder_without_the_named_data_says_which_folder_was_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, missing: str
) -> None:
    # a folder that exists but is not the shared data (or holds only part of it): the path looked
    # for, in the folder, and the variable to set; not another path (alpaca-eval's instructions.jsonl)
    monkeypatch.setenv("HEADWAY_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        load_workload(name)
    assert info.value.filename.startswith(str(tmp_path.resolve() / missing))
    assert f"not in the data folder {tmp_path.resolve()}" in str(info.value)
    assert "set HEADWAY_DATA_DIR" in str(info.value)


@pytest.mark.parametrize(
    ("source", "options", "fragment"),
    [
        ("default", {"think_time": 5.0}, "(--think-time) only applies to sharegpt-sessions, not 'default'"),
        ("trace", {"think_time": 5.0}, "(--think-time) only applies to sharegpt-sessions"),
        ("default", {"format": "azure"}, "(--format) applies to a workload file, not the built-in 'default'"),
        # each conversation is its own tenant: the mix was dropped without a word
        ("sharegpt-sessions", {"tenants": "default"}, "tenants='default' (--tenants) does not apply to sharegpt-"),
        ("sharegpt-sessions", {"tenants": "none"}, "tenants='none' (--tenants) does not apply to sharegpt-sessions"),
    ],
)
def test_options_the_workload_would_ignore_are_refused(
    write_text: TextWriter, tmp_path: Path, source: str, options: dict[str, object], fragment: str
) -> None:
    path = str(azure_file(write_text, tmp_path)) if source == "trace" else source
    with pytest.raises(ValueError, match=re.escape(fragment)):
        load_workload(path, **options)


def test_every_built_in_workload_is_described() -> None:
    for name in available_workloads():
        assert workload_description(name), name
    assert "Gamma(6 req/s, burstiness 0.5)" in workload_description("default")
    assert "AzureLLMInferenceTrace_conv.csv" in workload_description("azure-conv")
    with pytest.raises(UnknownWorkloadError, match="valid names: alpaca-eval"):
        workload_description("nope")


@pytest.mark.parametrize(
    ("source", "options", "fragments"),
    [
        ("burst", {"rate": 5.0}, ("ignore rate", "rate=5.0 (--rate)", "use workload 'default'")),
        ("burst", {"burstiness": 0.5}, ("ignore burstiness", "burstiness=0.5 (--burstiness)")),
        ("default", {"arrivals": "burst", "rate": 5.0}, ("ignore rate", "rate=5.0")),
        ("default", {"arrivals": "burst", "burstiness": 2.0}, ("ignore burstiness", "burstiness=2.0")),
        ("timed", {"arrivals": "trace", "burstiness": 0.5}, ("ignores burstiness", "burstiness=0.5")),
        ("timed", {"arrivals": "trace", "rate": 2.0, "burstiness": 0.5}, ("ignores burstiness",)),
        ("timed", {"arrivals": "burst", "rate": 2.0}, ("ignore rate", "rate=2.0")),
        ("untimed", {"arrivals": "burst", "rate": 5.0}, ("ignore rate", "rate=5.0")),
    ],
)
def test_options_the_arrivals_would_ignore_are_refused(
    write_text: TextWriter, tmp_path: Path, source: str, options: dict[str, object], fragments: tuple[str, ...]
) -> None:
    if source == "timed":
        source = str(azure_file(write_text, tmp_path))
    elif source == "untimed":
        source = str(sharegpt_file(write_text, tmp_path))
    with pytest.raises(ValueError) as info:
        load_workload(source, num_requests=10, **options)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_rate_on_a_replayed_trace_is_n_minus_one_over_the_span_of_the_n_taken(
    write_text: TextWriter, tmp_path: Path
) -> None:
    path = str(azure_file(write_text, tmp_path, n=120))
    plain = load_workload(path, num_requests=10)
    scaled = load_workload(path, num_requests=10, rate=4.0)
    assert (len(scaled) - 1) / scaled.duration == pytest.approx(4.0)
    factor = scaled.duration / plain.duration  # one uniform time scale
    assert [s.arrival_time for s in scaled] == pytest.approx([s.arrival_time * factor for s in plain])


def test_gamma_vllm_arrivals_place_the_last_request_at_n_over_rate(write_text: TextWriter, tmp_path: Path) -> None:
    w = load_workload("default", num_requests=300, arrivals="gamma-vllm", seed=2)
    assert w.requests[-1].arrival_time == pytest.approx(300 / 6.0, rel=1e-12) and w.requests[0].arrival_time > 0.0
    assert w.meta["arrivals"] == "GammaArrivals(rate=6.0, burstiness=0.5, start=0.0, vllm_placement=True)"
    plain = load_workload("default", num_requests=300, seed=2)
    lengths = sorted((s.request_id, s.num_output_tokens) for s in w)
    assert lengths == sorted((s.request_id, s.num_output_tokens) for s in plain)  # same streams, new times
    trace = load_workload(str(azure_file(write_text, tmp_path, n=40)), arrivals="gamma-vllm", burstiness=0.5)
    assert trace.requests[-1].arrival_time == pytest.approx(40 / 1.0)  # the trace's own rate, 1 req/s


def test_too_many_requests_and_too_long_spans_are_refused_naming_the_value(
    write_text: TextWriter, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="num_requests must be at most 100,000,000, got 100000001"):
        load_workload("default", num_requests=10**8 + 1)
    with pytest.raises(ValueError, match="got 10000000000"):
        load_workload("default", num_requests=10**10)
    with pytest.raises(ValueError, match="10 arrivals at rate 1e-300 requests/s span"):
        load_workload("default", num_requests=10, rate=1e-300)
    with pytest.raises(ValueError, match="rate 1e-300"):
        load_workload(str(sharegpt_file(write_text, tmp_path)), num_requests=10, rate=1e-300, arrivals="poisson")
    with pytest.raises(ValueError, match="40 replayed arrivals at rate 1e-300"):
        load_workload(str(azure_file(write_text, tmp_path)), rate=1e-300)


def test_numpy_numbers_are_options_and_bools_are_not() -> None:
    plain = load_workload("default", num_requests=20, rate=4.0, burstiness=2.0, output_cv=0.3)
    numpy = load_workload(
        "default", num_requests=np.int64(20), rate=np.float32(4.0), burstiness=np.int64(2), output_cv=np.float64(0.3)
    )
    assert numpy == plain
    for what in ("rate", "burstiness", "output_cv", "num_requests"):
        with pytest.raises(ValueError, match=f"{what} must be a .* got True"):
            load_workload("default", **{what: True})
