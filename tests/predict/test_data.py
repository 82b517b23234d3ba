"""Data: the pair filter, prompt-disjoint splits, JSONL validation and the real-data loaders."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.predict import DataError
from headway.predict.data import (
    Example,
    ExampleSet,
    keep_pair,
    load_alpaca_eval,
    load_alpaca_eval_consensus,
    load_codealpaca,
    load_dataset,
    load_jsonl,
    load_sharegpt,
    make_pairs,
    normalized_prompt,
    split_by_prompt,
    write_jsonl,
)

# ---------------------------------------------------------------------------------------------------------
# pair filter: keep iff |a - b| / max(a, b) >= delta (and a != b)


@pytest.mark.parametrize(
    ("a", "b", "delta", "keep"),
    [
        (100, 80, 0.2, True),  # exactly delta: 20 / 100 = 0.2 is kept
        (80, 100, 0.2, True),  # symmetric
        (100, 81, 0.2, False),  # 19 / 100 < 0.2
        (10, 8, 0.2, True),  # 2 / 10 = 0.2
        (5, 4, 0.2, True),  # 1 / 5 = 0.2
        (6, 5, 0.2, False),  # 1 / 6 < 0.2
        (1, 1000, 0.2, True),
        (7, 7, 0.0, False),  # a tie never says which is longer, even at delta 0
        (7, 8, 0.0, True),
        (100, 50, 0.5, True),  # 50 / 100 = 0.5
        (100, 51, 0.5, False),
    ],
)
def test_keep_pair_hand_cases(a: int, b: int, delta: float, keep: bool) -> None:
    assert keep_pair(a, b, delta) is keep


def test_make_pairs_respects_delta_labels_and_groups() -> None:
    lengths = np.array([100, 80, 81, 10, 200, 100, 5, 6, 50, 400], dtype=float)
    groups = ["a", "a", "a", "a", "a", "b", "b", "b", "b", "b"]
    pairs = make_pairs(lengths, partners=9, delta=0.2, seed=3, groups=groups)
    assert pairs.shape[1] == 3 and pairs.dtype == np.int64
    seen = set()
    for a, b, label in pairs.tolist():
        assert a != b
        assert groups[a] == groups[b]
        assert keep_pair(lengths[a], lengths[b], 0.2)
        assert label == int(lengths[a] > lengths[b])
        key = (min(a, b), max(a, b))
        assert key not in seen
        seen.add(key)
    # with partners >= group size - 1, every passing within-group pair is found
    expected = {
        (i, j)
        for i in range(10)
        for j in range(i + 1, 10)
        if groups[i] == groups[j] and keep_pair(lengths[i], lengths[j], 0.2)
    }
    assert seen == expected
    assert (0, 1) in seen and (1, 2) not in seen and (6, 7) not in seen  # 100/80 kept; 80/81 and 5/6 not


def test_make_pairs_partner_count_and_seed() -> None:
    lengths = np.geomspace(1, 10_000, 200)
    p1 = make_pairs(lengths, partners=4, delta=0.0, seed=1)
    p2 = make_pairs(lengths, partners=4, delta=0.0, seed=1)
    assert np.array_equal(p1, p2)
    assert len(p1) <= 200 * 4
    counts = np.bincount(p1[:, 0], minlength=200)
    assert counts.max() <= 4  # each example is the anchor of at most `partners` pairs
    with pytest.raises(DataError, match="delta"):
        make_pairs(lengths, delta=1.0)
    with pytest.raises(DataError, match="example 1"):
        make_pairs([3.0, 0.0, 2.0])


# ---------------------------------------------------------------------------------------------------------
# prompt-disjoint splits


prompt_text = st.text(alphabet="abcde ", min_size=1, max_size=6).filter(lambda s: s.strip() != "")


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(prompt_text, st.integers(1, 1000), st.sampled_from(["m1", "m2", None])), max_size=60),
    test_frac=st.floats(0.0, 0.6),
    val_frac=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**31),
)
def test_split_is_prompt_disjoint_and_seeded(
    rows: list[tuple[str, int, str | None]], test_frac: float, val_frac: float, seed: int
) -> None:
    data = ExampleSet("h", "tokens", tuple(Example(p, n, m) for p, n, m in rows))
    split = split_by_prompt(data, test_frac, val_frac, seed)
    parts = [{e.prompt.strip() for e in part} for part in (split.train, split.val, split.test)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert len(split.train) + len(split.val) + len(split.test) == len(data)
    again = split_by_prompt(data, test_frac, val_frac, seed)
    assert again.test.examples == split.test.examples and again.train.examples == split.train.examples
    # a prompt's part does not depend on which other examples are in the data
    if rows:
        sub = split_by_prompt(data.with_examples(data.examples[::2]), test_frac, val_frac, seed)
        assert {e.prompt for e in sub.test} <= {e.prompt for e in split.test}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("What is  the meaning of life?", "what is the meaning of life", True),
        ("Continue", "continue.", True),
        ("\tHello,\nworld!  ", "hello, world", True),
        ("hello, world", "hello world", False),  # punctuation inside the text counts
        ("Write C++ code", "Write C code", False),
        ("?", "?", True),  # punctuation alone is kept, not emptied
        ("?", "!", False),
    ],
)
def test_normalized_prompt_ignores_case_spacing_and_end_punctuation(a: str, b: str, same: bool) -> None:
    assert (normalized_prompt(a) == normalized_prompt(b)) is same


def test_split_fractions_are_close_on_many_prompts() -> None:
    data = ExampleSet("f", "tokens", tuple(Example(f"prompt {i}", i + 1) for i in range(5000)))
    split = split_by_prompt(data, 0.2, 0.1, seed=7)
    assert abs(len(split.test) / 5000 - 0.2) < 0.03
    assert abs(len(split.val) / 5000 - 0.1) < 0.03
    with pytest.raises(DataError):
        split_by_prompt(data, 0.8, 0.3)


# ---------------------------------------------------------------------------------------------------------
# generic JSONL


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = '{"prompt": "hi", "output_tokens": 3}'


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"output_tokens": 3}', "missing field 'prompt'"),
        ('{"prompt": "", "output_tokens": 3}', "empty prompt"),
        ('{"prompt": "   ", "output_tokens": 3}', "empty prompt"),
        ('{"prompt": 5, "output_tokens": 3}', "'prompt' must be a string"),
        ('{"prompt": "x"}', "missing field 'output_tokens'"),
        ('{"prompt": "x", "output_tokens": 0}', "must be positive, got 0"),
        ('{"prompt": "x", "output_tokens": -4}', "must be positive, got -4"),
        ('{"prompt": "x", "output_tokens": 2.5}', "must be an integer"),
        ('{"prompt": "x", "output_tokens": true}', "must be an integer"),
        ('{"prompt": "x", "output_tokens": "12"}', "must be an integer"),
        ('{"prompt": "x", "output_tokens": 4, "model": 3}', "'model' must be a string"),
        ('{"prompt": "x", "output_tokens": 4, "reasoning_tokens": -1}', "'reasoning_tokens' must be >= 0"),
    ],
)
def test_bad_jsonl_record_names_the_line(tmp_path: Path, bad: str, message: str) -> None:
    path = _write(tmp_path, [GOOD, "", bad, GOOD])
    with pytest.raises(DataError, match=message) as info:
        load_jsonl(path)
    assert f"{path}:3:" in str(info.value)  # the blank line 2 still counts


def test_jsonl_reads_models_reasoning_and_units(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            '{"prompt": "a", "output_tokens": 10, "model": "m"}',
            '{"prompt": "b", "output_tokens": 10, "reasoning_tokens": 90, "output": "one two",'
            ' "reasoning": "three four five"}',
            '{"prompt": "c", "output_tokens": 7.0, "output_words": 3, "output_chars": 9}',
        ],
    )
    tokens = load_jsonl(path)
    assert [e.length for e in tokens] == [10, 100, 7]  # reasoning trace counts in the length
    assert tokens.models() == ["m", None]
    assert tokens.unit_label == "tokens (as given)"
    with pytest.raises(DataError, match=r":1: unit 'words' needs an 'output' text"):
        load_jsonl(path, "words")
    path2 = _write(tmp_path, ['{"prompt": "b", "output_tokens": 1, "output": "one two", "reasoning": "x y z"}'])
    assert [e.length for e in load_jsonl(path2, "words")] == [5]
    assert [e.length for e in load_jsonl(path2, "chars")] == [len("one two") + len("x y z")]


def test_jsonl_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = _write(tmp_path, [""])
    with pytest.raises(DataError, match="no records"):
        load_jsonl(empty)
    with pytest.raises(DataError, match="file not found"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="unknown length unit"):
        load_jsonl(empty, "bytes")


def test_jsonl_round_trip(tmp_path: Path) -> None:
    data = ExampleSet("x", "tokens", (Example("p1", 3, "m"), Example("p2", 9)))
    path = write_jsonl(data, tmp_path / "out.jsonl")
    back = load_jsonl(path)
    assert [(e.prompt, e.length, e.model) for e in back] == [("p1", 3, "m"), ("p2", 9, None)]
    with pytest.raises(DataError, match="stores tokens"):
        write_jsonl(ExampleSet("w", "words", (Example("p", 1),)), tmp_path / "w.jsonl")


def test_example_validation() -> None:
    with pytest.raises(DataError, match="rec7: empty prompt"):
        Example("", 3, record="rec7")
    with pytest.raises(DataError, match="rec8: length must be positive"):
        Example("p", 0, record="rec8")


def test_data_module_does_not_import_torch() -> None:
    code = (
        "import sys, headway, headway.predict, headway.predict.data; "
        "import headway.predict as p; p.keep_pair; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------------
# real data (skipped without ../shared/data)


def test_alpaca_eval_loader(data_dir: Path) -> None:
    gpt4 = load_alpaca_eval("gpt4", "tokens", data_dir)
    assert len(gpt4) == 805 and gpt4.unit_label == "tokens (cl100k_base)"
    assert gpt4.models() == ["gpt4"]
    words = load_alpaca_eval(["gpt4", "claude-2.1"], "words", data_dir)
    assert len(words) == 2 * 805 and words.unit == "words"
    with pytest.raises(DataError, match="close matches: gpt4"):
        load_alpaca_eval("gpt-4x", data_dir=data_dir)
    assert len(load_dataset("alpaca_eval:gpt4", data_dir=data_dir)) == 805


def test_sharegpt_and_codealpaca_loaders(data_dir: Path) -> None:
    sg = load_sharegpt("tokens", data_dir, limit=50)
    assert len(sg) == 50 and sg.unit_label == "tokens (cl100k_base)" and all(e.length > 0 for e in sg)
    ca = load_codealpaca("2k", "words", data_dir)
    assert len(ca) > 1900 and ca.models() == ["text-davinci-003"]
    ca_tok = load_codealpaca("2k", "tokens", data_dir)
    assert "wordpiece" in ca_tok.unit_label


def test_alpaca_eval_consensus_is_the_geometric_mean(data_dir: Path) -> None:
    import math

    pair = load_alpaca_eval_consensus(["gpt4", "claude-2.1"], "tokens", data_dir)
    assert len(pair) == 805 and pair.models() == ["mean"] and "gpt4,claude-2.1" in pair.notes[0]
    a = {e.prompt: e.length for e in load_alpaca_eval("gpt4", "tokens", data_dir)}
    b = {e.prompt: e.length for e in load_alpaca_eval("claude-2.1", "tokens", data_dir)}
    for ex in pair.examples[:50]:
        assert ex.length == max(1, round(math.sqrt(a[ex.prompt] * b[ex.prompt])))
    every = load_dataset("alpaca_eval:mean", data_dir=data_dir)
    assert len(every) == 805 and "227 models" in every.notes[0]
    with pytest.raises(DataError, match="no model 'nope'"):
        load_dataset("alpaca_eval:mean:gpt4,nope", data_dir=data_dir)


def test_plus_concatenates_data_sets(data_dir: Path) -> None:
    mix = load_dataset("alpaca_eval:gpt4+sharegpt:30", data_dir=data_dir)
    assert len(mix) == 805 + 30 and mix.unit_label == "tokens (cl100k_base)"
    with pytest.raises(DataError, match="count tokens differently"):
        load_dataset("alpaca_eval:gpt4+codealpaca:2k", data_dir=data_dir)


def test_unknown_dataset_spec() -> None:
    with pytest.raises(DataError, match="unknown dataset"):
        load_dataset("imagenet")


def test_jsonl_spec_through_load_dataset(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"prompt": "q", "output_tokens": 2}) + "\n")
    assert len(load_dataset(str(path))) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("+", r"'\+': no data set named around '\+'"),
        ("++", r"'\+\+': no data set named around '\+'"),
        ("sharegpt:abc", "'sharegpt:abc': sharegpt:N takes a number of examples N, got 'abc'"),
        ("sharegpt:0", "sharegpt: the number of examples must be >= 1, got 0"),
        ("sharegpt:-3", "sharegpt: the number of examples must be >= 1, got -3"),
    ],
)
def test_bad_dataset_specs_are_named(spec: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_dataset(spec)


def test_unreadable_jsonl_names_the_file_and_line(tmp_path: Path) -> None:
    not_gzip = tmp_path / "data.jsonl.gz"
    not_gzip.write_text(GOOD + "\n")
    with pytest.raises(DataError, match=rf"{not_gzip}: cannot read it \(Not a gzipped file"):
        load_jsonl(not_gzip)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((GOOD + "\n" + '{"prompt": "caf\xe9", "output_tokens": 3}\n').encode("latin-1"))
    with pytest.raises(DataError, match=rf"{latin1}:2: not UTF-8 text \(invalid continuation byte at byte 15\)"):
        load_jsonl(latin1)
    good_gzip = tmp_path / "good.jsonl.gz"
    with gzip.open(good_gzip, "wt", encoding="utf-8") as fh:
        fh.write(GOOD + "\r\n\n" + '{"prompt": "café", "output_tokens": 3}\n')
    assert [e.prompt for e in load_jsonl(good_gzip)][1] == "café"


def test_wordpiece_counts_are_neither_padded_nor_cut() -> None:
    from headway.predict.data import count_wordpiece_tokens

    # the bundled tokenizer.json pads and truncates to 128; counts must not inherit that
    assert count_wordpiece_tokens(["hello world", "a " * 300]) == [2, 300]
