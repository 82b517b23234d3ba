from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.workload import (
    GammaArrivals,
    Workload,
    WorkloadFormatError,
    approx_token_count,
    load_workload,
    read_alpaca_eval,
    read_alpaca_eval_outputs,
    read_azure_trace,
    read_burstgpt_trace,
    read_mooncake_trace,
    read_sharegpt,
    read_vidur_trace,
)

BASE = datetime(2023, 11, 16, 18, 15, 46)

# (offset in 100 ns ticks, prompt tokens, output tokens)
rows_strategy = st.lists(
    st.tuples(st.integers(0, 10**11), st.integers(1, 50_000), st.integers(1, 5_000)), min_size=1, max_size=30
)

TextWriter = Callable[[Path, str], Path]  # the write_text fixture (conftest.py)
JsonlWriter = Callable[[Path, Sequence[object]], Path]  # the write_jsonl fixture


def azure_ts(ticks: int) -> str:
    t = BASE + timedelta(seconds=ticks // 10**7)
    return f"{t:%Y-%m-%d %H:%M:%S}.{ticks % 10**7:07d}"


def azure_csv(rows: list[tuple[int, int, int]]) -> str:
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{azure_ts(t)},{p},{o}\n" for t, p, o in rows
    )


def lengths(w: Workload) -> list[tuple[int, int]]:
    return [(s.num_prompt_tokens, s.num_output_tokens) for s in w]


# ----------------------------------------------------------------- round trips
@given(rows=rows_strategy, gz=st.booleans())
def test_azure_round_trip(write_text: TextWriter, rows: list[tuple[int, int, int]], gz: bool) -> None:
    rows = sorted(rows)
    with tempfile.TemporaryDirectory() as d:
        path = write_text(Path(d) / ("trace.csv.gz" if gz else "trace.csv"), azure_csv(rows))
        w = read_azure_trace(path)
    assert lengths(w) == [(p, o) for _, p, o in rows]
    t0 = rows[0][0]
    for spec, (t, _, _) in zip(w, rows, strict=True):
        assert spec.arrival_time == pytest.approx((t - t0) / 1e7, abs=1e-6)
    assert w.requests[0].arrival_time == 0.0


def test_azure_seven_fractional_digits_and_utc_offset(write_text: TextWriter, tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:16:00,10,1\n"
        "2023-11-16 20:16:00.5+02:00,10,1\n"
    )
    w = read_azure_trace(write_text(tmp_path / "a.csv", text))
    times = [s.arrival_time for s in w]
    assert times[:3] == pytest.approx([0.0, 4.314579, 13.31941])
    assert times[3] == pytest.approx(13.81941)


@given(rows=rows_strategy, timed=st.booleans())
def test_vidur_round_trip(write_text: TextWriter, rows: list[tuple[int, int, int]], timed: bool) -> None:
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
    body = "".join(f"{t / 1e7!r},{p},{o},{p + o}\n" for t, p, o in rows)
    if not timed:
        header = "num_prefill_tokens,num_decode_tokens,pd_ratio\n"
        body = "".join(f"{p},{o},{p / o!r}\n" for _, p, o in rows)
    with tempfile.TemporaryDirectory() as d:
        w = read_vidur_trace(write_text(Path(d) / "v.csv", header + body))
    if timed:
        assert sorted(s.arrival_time for s in w) == sorted(t / 1e7 for t, _, _ in rows)
        assert sorted(lengths(w)) == sorted((p, o) for _, p, o in rows)
    else:
        assert lengths(w) == [(p, o) for _, p, o in rows]
        assert all(s.arrival_time == 0.0 for s in w)
    assert w.meta["timed"] is timed


def test_vidur_untimed_takes_arrivals_from_a_process(write_text: TextWriter, tmp_path: Path) -> None:
    path = write_text(tmp_path / "arxiv.csv", "num_prefill_tokens,num_decode_tokens\n" + "100,10\n" * 50)
    process = GammaArrivals(5.0, 0.5)
    w = read_vidur_trace(path, arrivals=process, seed=3)
    assert [s.arrival_time for s in w] == process.sample(50, 3).tolist()


@given(rows=rows_strategy)
def test_mooncake_round_trip(write_jsonl: JsonlWriter, rows: list[tuple[int, int, int]]) -> None:
    records = [
        {"timestamp": t // 10**4, "input_length": p, "output_length": o, "hash_ids": [1, 2]}
        for t, p, o in rows
    ]
    with tempfile.TemporaryDirectory() as d:
        w = read_mooncake_trace(write_jsonl(Path(d) / "m.jsonl", records))
    t0 = min(r["timestamp"] for r in records)
    assert sorted((s.arrival_time, s.num_prompt_tokens, s.num_output_tokens) for s in w) == sorted(
        ((r["timestamp"] - t0) / 1000.0, r["input_length"], r["output_length"]) for r in records
    )
    assert all(s.block_hashes == (1, 2) and s.hash_block_size == 512 for s in w)


def test_mooncake_hash_ids_are_checked(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}])
    with pytest.raises(WorkloadFormatError, match="hash_ids"):
        read_mooncake_trace(path)
    path = write_jsonl(tmp_path / "n.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1}])
    assert read_mooncake_trace(path).requests[0].block_hashes == ()


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60)


@given(pairs=st.lists(st.tuples(texts, texts), min_size=1, max_size=15), gz=st.booleans())
def test_sharegpt_json_round_trip(write_text: TextWriter, pairs: list[tuple[str, str]], gz: bool) -> None:
    records = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "system", "value": "be nice"},
                {"from": "human", "value": q},
                {"from": "gpt", "value": a},
                {"from": "human", "value": "and then?"},
            ],
        }
        for i, (q, a) in enumerate(pairs)
    ]
    with tempfile.TemporaryDirectory() as d:
        path = write_text(Path(d) / ("sg.json.gz" if gz else "sg.json"), json.dumps(records, indent=2))
        w = read_sharegpt(path)
    assert [s.request_id for s in w] == [f"c{i}" for i in range(len(pairs))]
    assert [s.prompt for s in w] == [q for q, _ in pairs]
    assert lengths(w) == [(approx_token_count(q), approx_token_count(a)) for q, a in pairs]


def test_sharegpt_first_turn_jsonl_counts_and_skips(write_jsonl: JsonlWriter, tmp_path: Path) -> None:
    records = [
        {"id": "a", "prompt": "hello there", "response": "x" * 40},
        {"id": "b", "prompt": "recorded", "response": "y", "prompt_tokens": 7, "response_tokens": 9},
        {"id": "c", "prompt": "", "response": "empty prompt is skipped"},
        {"id": "a", "prompt": "dup id", "response": "kept, renamed"},
        {"id": "d", "conversations": [{"from": "gpt", "value": "no human turn"}]},
    ]
    path = write_jsonl(tmp_path / "ft.jsonl.gz", records)
    w = read_sharegpt(path)
    assert [s.request_id for s in w] == ["a", "b", "a@4"]
    assert lengths(w) == [(3, 10), (7, 9), (2, 4)]
    assert w.meta["skipped"] == 2
    # an explicit counter overrides recorded counts
    w2 = read_sharegpt(path, count_tokens=lambda text: len(text.split()))
    assert lengths(w2)[:2] == [(2, 1), (1, 1)]


def _alpaca(write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path) -> tuple[Path, Path]:
    instr = write_jsonl(
        tmp_path / "instructions.jsonl",
        [
            {
                "idx": 0,
                "dataset": "helpful_base",
                "instruction": "Name three colours.",
                "instruction_cl100k_tokens": 5,
            },
            {"idx": 1, "dataset": "koala", "instruction": "Why is the sky blue?"},
            {"idx": 2, "dataset": "oasst", "instruction": "Only model B answered this."},
        ],
    )
    lens = write_text(
        tmp_path / "output_lengths_long.csv.gz",
        "model,idx,chars,words,cl100k_tokens\nA,0,100,20,25\nA,1,400,80,90\nB,2,50,10,12\nB,0,8,2,3\n",
    )
    return instr, lens


def test_alpaca_eval_picks_the_model(
    write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    instr, lens = _alpaca(write_text, write_jsonl, tmp_path)
    w = read_alpaca_eval(instr, lens, "A")
    assert [s.request_id for s in w] == ["alpaca-0", "alpaca-1"]
    assert lengths(w) == [(5, 25), (approx_token_count("Why is the sky blue?"), 90)]
    assert [s.category for s in w] == ["helpful_base", "koala"]
    assert w.meta["skipped"] == 1
    assert lengths(read_alpaca_eval(instr, lens, "B")) == [
        (5, 3),
        (approx_token_count("Only model B answered this."), 12),
    ]


def test_alpaca_eval_unknown_model_suggests_close_names(
    write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    instr, lens = _alpaca(write_text, write_jsonl, tmp_path)
    with pytest.raises(ValueError, match=r"no rows for model 'a'.*2 models.*close matches: A"):
        read_alpaca_eval(instr, lens, "a")


AE_OUTPUTS = [
    {"dataset": "helpful_base", "instruction": "Name three actors.", "output": "A, B and C are actors.",
     "generator": "gpt4"},
    {"dataset": "koala", "instruction": "Write a haiku", "output": "", "generator": "gpt4"},
    {"dataset": "oasst", "instruction": "Why?", "output": "Because " * 40, "generator": "gpt4"},
]  # fmt: skip


@pytest.mark.parametrize("as_jsonl", [False, True])
def test_alpaca_eval_outputs_as_published(
    write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path, as_jsonl: bool
) -> None:
    if as_jsonl:
        path = write_jsonl(tmp_path / "model_outputs.jsonl", AE_OUTPUTS)
    else:
        path = write_text(tmp_path / "model_outputs.json", json.dumps(AE_OUTPUTS, indent=2))
    w = read_alpaca_eval_outputs(path)
    assert lengths(w) == [
        (approx_token_count("Name three actors."), approx_token_count("A, B and C are actors.")),
        (approx_token_count("Why?"), approx_token_count("Because " * 40)),
    ]
    assert [s.category for s in w] == ["helpful_base", "oasst"]
    assert w.meta["skipped"] == 1 and w.meta["model"] == "gpt4" and w.meta["format"] == "alpaca-eval-outputs"


def test_alpaca_eval_outputs_pick_a_generator(write_text: TextWriter, tmp_path: Path) -> None:
    mixed = [*AE_OUTPUTS, {"instruction": "Hi", "output": "Hello there", "generator": "claude"}]
    path = write_text(tmp_path / "all.json", json.dumps(mixed))
    with pytest.raises(ValueError, match=r"outputs of 2 generators \(claude, gpt4\); pick one with model="):
        read_alpaca_eval_outputs(path)
    assert lengths(read_alpaca_eval_outputs(path, model="claude")) == [(1, approx_token_count("Hello there"))]
    with pytest.raises(ValueError, match=r"no outputs of generator 'claud'.*close matches: claude"):
        read_alpaca_eval_outputs(path, model="claud")


def test_alpaca_eval_outputs_bad_record_names_file_and_line(write_text: TextWriter, tmp_path: Path) -> None:
    path = write_text(
        tmp_path / "o.json", '[\n{"instruction": "x", "output": "y"},\n{"instruction": "x", "output": 3}\n]'
    )
    with pytest.raises(WorkloadFormatError) as info:
        read_alpaca_eval_outputs(path)
    assert str(info.value) == f"{path}:3: output: expected a string (got 3)"


def test_limit_keeps_first_rows(write_text: TextWriter, tmp_path: Path) -> None:
    rows = [(i * 10**7, 10 + i, 5 + i) for i in range(20)]
    w = read_azure_trace(write_text(tmp_path / "a.csv", azure_csv(rows)), limit=5)
    assert lengths(w) == [(10 + i, 5 + i) for i in range(5)]


# ------------------------------------------------------------------ bad input
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_AZ = "2023-11-16 18:15:46.6805900,374,44\n"
VIDUR_HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
MOON = '{"timestamp": 0, "input_length": 5, "output_length": 6, "hash_ids": []}\n'
SG_OK = '{"id": "a", "prompt": "p", "response": "r"}\n'


def _azure(p: Path) -> object:
    return read_azure_trace(p)


def _vidur(p: Path) -> object:
    return read_vidur_trace(p)


def _mooncake(p: Path) -> object:
    return read_mooncake_trace(p)


def _sharegpt(p: Path) -> object:
    return read_sharegpt(p)


BAD: list[tuple[str, Callable[[Path], object], str, str, int, list[str]]] = [
    # (id, reader, file name, content, line, fragments the message must contain)
    (
        "azure-bad-time",
        _azure,
        "a.csv",
        AZURE_HEAD + GOOD_AZ + "yesterday,1,2\n",
        3,
        ["TIMESTAMP", "'yesterday'"],
    ),
    (
        "azure-bad-date",
        _azure,
        "a.csv",
        AZURE_HEAD + "2023-13-45 18:15:46.1,1,2\n",
        2,
        ["TIMESTAMP", "2023-13-45"],
    ),
    (
        "azure-text-count",
        _azure,
        "a.csv",
        AZURE_HEAD + GOOD_AZ + GOOD_AZ + "2023-11-16 18:15:47,abc,2\n",
        4,
        ["ContextTokens", "'abc'"],
    ),
    (
        "azure-zero-output",
        _azure,
        "a.csv",
        AZURE_HEAD + "2023-11-16 18:15:47,10,0\n",
        2,
        ["GeneratedTokens", "must be > 0", "got 0"],
    ),
    (
        "azure-negative",
        _azure,
        "a.csv.gz",
        AZURE_HEAD + GOOD_AZ + "2023-11-16 18:15:47,-3,2\n",
        3,
        ["ContextTokens", "got -3"],
    ),
    (
        "azure-fractional",
        _azure,
        "a.csv",
        AZURE_HEAD + "2023-11-16 18:15:47,1.5,2\n",
        2,
        ["ContextTokens", "'1.5'"],
    ),
    (
        "azure-short-row",
        _azure,
        "a.csv",
        AZURE_HEAD + GOOD_AZ + "\n" + "2023-11-16 18:15:47,5\n",
        4,
        ["expected 3 fields, got 2"],
    ),
    (
        "azure-missing-column",
        _azure,
        "a.csv",
        "TIMESTAMP,ContextTokens\n" + "x,1\n",
        1,
        ["missing column(s) GeneratedTokens"],
    ),
    ("azure-empty", _azure, "a.csv", "", 1, ["empty file"]),
    (
        "vidur-negative-time",
        _vidur,
        "v.csv",
        VIDUR_HEAD + "0.0,1,2\n-0.5,1,2\n",
        3,
        ["arrived_at", ">= 0", "'-0.5'"],
    ),
    ("vidur-nan-time", _vidur, "v.csv", VIDUR_HEAD + "nan,1,2\n", 2, ["arrived_at", "finite", "'nan'"]),
    ("vidur-text-time", _vidur, "v.csv", VIDUR_HEAD + "soon,1,2\n", 2, ["arrived_at", "'soon'"]),
    (
        "vidur-zero-decode",
        _vidur,
        "v.csv.gz",
        VIDUR_HEAD + "0.0,1,2\n1.0,7,0\n",
        3,
        ["num_decode_tokens", "got 0"],
    ),
    (
        "vidur-missing-column",
        _vidur,
        "v.csv",
        "arrived_at,num_prefill_tokens\n0,1\n",
        1,
        ["missing column(s) num_decode_tokens"],
    ),
    ("mooncake-bad-json", _mooncake, "m.jsonl", MOON + MOON + "{not json\n", 3, ["invalid JSON"]),
    (
        "mooncake-missing-field",
        _mooncake,
        "m.jsonl",
        MOON + '{"timestamp": 5, "input_length": 3}\n',
        2,
        ["output_length", "missing field"],
    ),
    (
        "mooncake-zero-input",
        _mooncake,
        "m.jsonl.gz",
        MOON + '{"timestamp": 5, "input_length": 0, "output_length": 3}\n',
        2,
        ["input_length", "got 0"],
    ),
    (
        "mooncake-negative-time",
        _mooncake,
        "m.jsonl",
        '{"timestamp": -5, "input_length": 1, "output_length": 3}\n',
        1,
        ["timestamp", "got -5"],
    ),
    (
        "mooncake-nan-time",
        _mooncake,
        "m.jsonl",
        '\n{"timestamp": NaN, "input_length": 1, "output_length": 3}\n',
        2,
        ["timestamp", "finite", "nan"],
    ),
    (
        "mooncake-string-length",
        _mooncake,
        "m.jsonl",
        '{"timestamp": 1, "input_length": "many", "output_length": 3}\n',
        1,
        ["input_length", "'many'"],
    ),
    ("mooncake-not-object", _mooncake, "m.jsonl", MOON + "[1, 2]\n", 2, ["expected a JSON object"]),
    (
        "mooncake-absurd-time",
        _mooncake,
        "m.jsonl",
        MOON + '{"timestamp": 1e308, "input_length": 1, "output_length": 3}\n' + MOON,
        2,
        ["timestamp", "1e+305 s after the earliest request (line 1)", "3,660 days"],
    ),
    (
        "vidur-absurd-time",
        _vidur,
        "v.csv",
        VIDUR_HEAD + "5.0,1,2\n4e8,3,4\n",
        3,
        ["arrived_at", "4e+08 s after the earliest request (line 2)"],
    ),
    (
        "azure-absurd-time",
        _azure,
        "a.csv",
        AZURE_HEAD + GOOD_AZ + "9999-11-16 18:15:46.6805900,374,44\n",
        3,
        ["TIMESTAMP", "after the earliest request (line 2)"],
    ),
    (
        "sharegpt-jsonl-bad",
        _sharegpt,
        "s.jsonl",
        SG_OK + '{"id": "b", "prompt": 5, "response": "r"}\n',
        2,
        ["prompt", "expected a string", "got 5"],
    ),
    (
        "sharegpt-jsonl-missing",
        _sharegpt,
        "s.jsonl",
        SG_OK + SG_OK.replace('"prompt"', '"question"'),
        2,
        ["prompt", "missing field"],
    ),
    (
        "sharegpt-json-bad-turns",
        _sharegpt,
        "s.json",
        '[\n  {"id": "a", "conversations": []},\n  {"id": "b",\n   "conversations": "oops"}\n]\n',
        3,
        ["conversations", "expected a list", "'oops'"],
    ),
    (
        "sharegpt-json-bad-turn",
        _sharegpt,
        "s.json.gz",
        '[{"id": "a", "conversations": []},\n{"id": "b", "conversations": [{"from": "human"}]}]',
        2,
        ["conversations[0]", "value", "missing field"],
    ),
    (
        "sharegpt-json-truncated",
        _sharegpt,
        "s.json",
        '[\n{"id": "a", "conversations": []},\n{"id": "b", "conv',
        3,
        ["invalid JSON"],
    ),
    (
        "sharegpt-json-not-array",
        _sharegpt,
        "s.json",
        '\n\n"hello"',
        3,
        ["record", "expected a JSON object", "'hello'"],
    ),
]


@pytest.mark.parametrize(
    ("reader", "name", "content", "line", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_names_file_line_and_value(
    write_text: TextWriter,
    tmp_path: Path,
    reader: Callable[[Path], object],
    name: str,
    content: str,
    line: int,
    fragments: list[str],
) -> None:
    path = write_text(tmp_path / name, content)
    with pytest.raises(WorkloadFormatError) as info:
        reader(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert info.value.line == line
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_alpaca_eval_bad_inputs_name_file_and_line(
    write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    instr, _ = _alpaca(write_text, write_jsonl, tmp_path)
    header = "model,idx,chars,words,cl100k_tokens\n"
    cases = [
        (header + "A,0,1,1,4\nA,1,1,1,0\n", 3, "cl100k_tokens: token count must be > 0 (got 0)"),
        (header + "A,0,1,1,4\nA,0,1,1,5\n", 3, "idx: duplicate row for model 'A' (first on line 2) (got 0)"),
        (header + "A,0,1,1,4\nA,x,1,1,5\n", 3, "idx: expected a non-negative integer (got 'x')"),
    ]
    for content, line, tail in cases:
        lens = write_text(tmp_path / "l.csv", content)
        with pytest.raises(WorkloadFormatError) as info:
            read_alpaca_eval(instr, lens, "A")
        assert str(info.value) == f"{lens}:{line}: {tail}"
    lens = write_text(tmp_path / "l.csv", header + "A,0,1,1,4\n")
    bad = write_text(
        tmp_path / "i.jsonl", '{"idx": 0, "instruction": "x"}\n{"idx": "one", "instruction": "y"}\n'
    )
    with pytest.raises(WorkloadFormatError) as info:
        read_alpaca_eval(bad, lens, "A")
    assert str(info.value) == f"{bad}:2: idx: expected a non-negative integer (got 'one')"


def test_absurd_token_counts_are_format_errors(write_text: TextWriter, tmp_path: Path) -> None:
    bad = write_text(tmp_path / "a.csv", AZURE_HEAD + "2023-11-16 18:15:46.0,10,99999999999999999999999\n")
    with pytest.raises(WorkloadFormatError, match=r"a\.csv:2: GeneratedTokens: token count must be at most"):
        read_azure_trace(bad)


def test_not_utf8_and_corrupt_gzip_are_format_errors(tmp_path: Path) -> None:
    latin = tmp_path / "latin.csv"
    latin.write_bytes(AZURE_HEAD.encode() + b"\xff\xfe,1,2\n")
    with pytest.raises(WorkloadFormatError, match="not UTF-8"):
        read_azure_trace(latin)
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(WorkloadFormatError, match=r"broken\.csv\.gz"):
        read_azure_trace(broken)


@pytest.mark.parametrize("reader", [_azure, _vidur, _mooncake, _sharegpt])
def test_missing_file_names_the_path(tmp_path: Path, reader: Callable[[Path], object]) -> None:
    path = tmp_path / "nowhere" / "trace.csv"
    with pytest.raises(FileNotFoundError, match=r"nowhere/trace\.csv"):
        reader(path)


def test_missing_alpaca_lengths_file_names_the_path(
    write_text: TextWriter, write_jsonl: JsonlWriter, tmp_path: Path
) -> None:
    instr, _ = _alpaca(write_text, write_jsonl, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no_lengths\.csv"):
        read_alpaca_eval(instr, tmp_path / "no_lengths.csv", "A")


# ----------------------------------------------------------------------- BurstGPT
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@given(rows=rows_strategy, gz=st.booleans())
def test_burstgpt_round_trip(write_text: TextWriter, rows: list[tuple[int, int, int]], gz: bool) -> None:
    # the published columns (Timestamp in seconds from the trace's start), models and log types kept
    model = ["ChatGPT", "GPT-4"]
    log = ["Conversation log", "API log", "API log"]
    body = "".join(f"{t / 10**4:g},{model[i % 2]},{p},{o},{p + o},{log[i % 3]}\n" for i, (t, p, o) in enumerate(rows))
    with tempfile.TemporaryDirectory() as d:
        path = write_text(Path(d) / ("BurstGPT_1.csv.gz" if gz else "BurstGPT_1.csv"), BURSTGPT_HEADER + body)
        w = read_burstgpt_trace(path)
        assert load_workload(str(path)).requests == w.requests  # told from its header
    t0 = min(float(f"{t / 10**4:g}") for t, _, _ in rows)
    want = sorted(
        (float(f"{t / 10**4:g}") - t0, p, o, model[i % 2], log[i % 3]) for i, (t, p, o) in enumerate(rows)
    )
    got = sorted((s.arrival_time, s.num_prompt_tokens, s.num_output_tokens, s.model, s.category) for s in w)
    assert got == want
    assert w.meta["skipped"] == 0 and w.meta["format"] == "burstgpt"


def test_burstgpt_failed_requests_are_skipped_and_counted(write_text: TextWriter, tmp_path: Path) -> None:
    # BurstGPT_1.csv logs its failures with 0 response tokens (its _without_fails files leave them out)
    body = "5,ChatGPT,472,18,490,Conversation log\n7,GPT-4,300,0,300,API log\n9,ChatGPT,0,0,0,API log\n"
    body += "45,ChatGPT,1087,230,1317,Conversation log\n"
    w = read_burstgpt_trace(write_text(tmp_path / "b.csv", BURSTGPT_HEADER + body))
    assert [(s.request_id, s.arrival_time, s.num_prompt_tokens) for s in w] == [("b-0", 0.0, 472), ("b-1", 40.0, 1087)]
    assert (w.meta["skipped"], w.meta["models"]) == (2, {"ChatGPT": 2})
    assert "failed requests" in str(w.meta["skipped_why"])
    with pytest.raises(WorkloadFormatError, match="Response tokens"):
        read_burstgpt_trace(write_text(tmp_path / "c.csv", BURSTGPT_HEADER + "5,ChatGPT,472,x,490,API log\n"))
