"""Workloads that share prefixes: multi-turn sessions and shared system prompts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from headway.sim import CacheConfig, simulate
from headway.workload import (
    BurstArrivals,
    RequestSpec,
    Workload,
    WorkloadFormatError,
    load_workload,
    read_turn_lengths,
    resample_output_lengths,
    session_workload,
    with_system_prompts,
)

TextWriter = Callable[[Path, str], Path]  # the write_text fixture (conftest.py)


def test_turn_lengths_are_read_in_turn_order(write_text: TextWriter, tmp_path: Path) -> None:
    text = "conv_id,turn,prompt_tokens,response_tokens,prompt_chars,response_chars\n"
    text += "a,1,5,6,0,0\na,0,3,4,0,0\nb,0,7,8,0,0\nb,1,0,2,0,0\nb,2,9,9,0,0\nc,0,1,1,0,0\n"
    path = write_text(tmp_path / "t.csv.gz", text)
    assert read_turn_lengths(path) == [[(3, 4), (5, 6)], [(7, 8)], [(1, 1)]]  # b stops at its empty turn
    assert read_turn_lengths(path, limit=2) == [[(3, 4), (5, 6)], [(7, 8)]]


@pytest.mark.parametrize(
    ("row", "line", "message"),
    [
        ("a,1,5,x,0,0", 3, "t.csv:3: response_tokens: expected an integer token count (got 'x')"),
        ("a,-1,5,6,0,0", 3, "t.csv:3: turn: expected a non-negative integer (got '-1')"),
        ("a,0,5,6,0,0", 3, "t.csv:3: turn: conversation 'a' has this turn already (line 2) (got 0)"),
        ("a,1,5,6", 3, "t.csv:3: row: expected 6 fields, got 4"),
    ],
)
def test_a_bad_turn_row_names_its_file_and_line(
    write_text: TextWriter, tmp_path: Path, row: str, line: int, message: str
) -> None:
    text = "conv_id,turn,prompt_tokens,response_tokens,prompt_chars,response_chars\na,0,3,4,0,0\n" + row + "\n"
    path = write_text(tmp_path / "t.csv", text)
    with pytest.raises(WorkloadFormatError, match=re.escape(message)) as info:
        read_turn_lengths(path)
    assert info.value.line == line


def _turn_table(tmp_path: Path, write_text: TextWriter, conversations: list[list[tuple[int, int]]]) -> Path:
    """A data folder holding ``sharegpt/sharegpt_all_turn_lengths.csv.gz`` of these conversations."""
    (tmp_path / "sharegpt").mkdir()
    text = "conv_id,turn,prompt_tokens,response_tokens,prompt_chars,response_chars\n"
    for c, conv in enumerate(conversations):
        text += "".join(f"c{c},{k},{m},{a},0,0\n" for k, (m, a) in enumerate(conv))
    write_text(tmp_path / "sharegpt" / "sharegpt_all_turn_lengths.csv.gz", text)
    return tmp_path


def test_resampled_sessions_keep_each_turns_history(write_text: TextWriter, tmp_path: Path) -> None:
    convs = [[(10 + c, 200 + 10 * k) for k in range(4)] for c in range(5)]
    data = _turn_table(tmp_path, write_text, convs)
    plain = load_workload("sharegpt-sessions", data_dir=data, num_requests=20)
    noisy = load_workload("sharegpt-sessions", data_dir=data, num_requests=20, output_cv=0.5, seed=3)
    assert noisy == load_workload("sharegpt-sessions", data_dir=data, num_requests=20, output_cv=0.5, seed=3)
    assert noisy.meta["output_cv"] == 0.5
    answers = {s.request_id: s.num_output_tokens for s in plain}
    assert sum(s.num_output_tokens != answers[s.request_id] for s in noisy) >= 15  # the answers were resampled
    by_id = {s.request_id: s for s in noisy}
    for s in noisy:
        c, k = (int(x) for x in s.request_id.rsplit("-", 2)[1:])
        history = sum(
            m + by_id[f"sharegpt-sessions-{c}-{j}"].num_output_tokens for j, (m, _) in enumerate(convs[c][:k])
        )
        assert s.num_prompt_tokens == history + convs[c][k][0]  # the answers its conversation got, resampled
        assert s.hashed_tokens == (s.num_prompt_tokens + s.num_output_tokens) // 16 * 16
    with pytest.raises(ValueError, match="resampling the answers alone would break that history"):
        resample_output_lengths(plain, 0.5)


def test_sessions_refuse_more_turns_than_the_data_has(write_text: TextWriter, tmp_path: Path) -> None:
    data = _turn_table(tmp_path, write_text, [[(5, 5)] * 3] * 4)
    assert len(load_workload("sharegpt-sessions", data_dir=data, num_requests=12)) == 12
    with pytest.raises(ValueError, match="has 12 turns; cannot take num_requests=13"):
        load_workload("sharegpt-sessions", data_dir=data, num_requests=13)


def test_a_turn_is_the_history_plus_its_message() -> None:
    w = session_workload([[(20, 30), (10, 40), (5, 5)], [(100, 1)]], BurstArrivals(), think_time=2.0, seed=1)
    by_id = {s.request_id: s for s in w}
    t0, t1, t2 = (by_id[f"sessions-0-{k}"] for k in range(3))
    assert (t0.num_prompt_tokens, t1.num_prompt_tokens, t2.num_prompt_tokens) == (20, 60, 105)
    assert (t0.after, t1.after, t2.after) == (None, t0.request_id, t1.request_id)
    assert t0.think_time == 0.0 and t1.think_time > 0.0
    # one token stream: a turn's hashes are the whole blocks up to the end of its answer
    assert len(t0.block_hashes) == 50 // 16 and len(t1.block_hashes) == 100 // 16
    # ...and say so: t0's third hash (tokens 32-47, its prompt ends at 20) is a whole block of its answer
    assert (t0.hashed_tokens, t1.hashed_tokens, t2.hashed_tokens) == (48, 96, 96)
    assert t1.block_hashes[: len(t0.block_hashes)] == t0.block_hashes
    assert t2.block_hashes[: len(t1.block_hashes)] == t1.block_hashes
    assert not set(by_id["sessions-1-0"].block_hashes) & set(t2.block_hashes)
    cut = session_workload([[(20, 30), (10, 40)]], BurstArrivals(), max_model_len=60)
    assert len(cut) == 1  # the second turn (60 + 40 tokens) does not fit
    assert len(session_workload([[(1, 1)] * 5] * 3, BurstArrivals(), num_requests=7)) == 7


# (9, 10): every history ends in a block its last prompt began and its answer completed
@pytest.mark.parametrize(("msg", "ans"), [(40, 40), (9, 10)])
def test_sessions_hit_their_history_in_the_simulator(msg: int, ans: int) -> None:
    w = session_workload([[(msg, ans)] * 4 for _ in range(5)], BurstArrivals(), think_time=1.0)
    on = simulate(w, "fcfs", cache=CacheConfig(enable_prefix_caching=True))
    off = simulate(w, "fcfs", cache=CacheConfig(enable_prefix_caching=False))
    by_id = {r.request_id: r for r in on.requests}
    for c in range(5):
        for k in range(1, 4):
            prev, cur = by_id[f"sessions-{c}-{k - 1}"], by_id[f"sessions-{c}-{k}"]
            assert cur.arrival_time >= prev.finish_time  # type: ignore[operator]
            # the history's whole computed blocks are cached: the previous prompt and its answer
            # but the answer's last token, which was sampled and never computed (as in vLLM)
            assert cur.num_cached_tokens == (prev.num_prompt_tokens + ans - 1) // 16 * 16
    assert on.replicas[0].prefix_cache_hit_rate > 0.5  # type: ignore[operator]
    assert sum(r.ttft for r in on.requests) < sum(r.ttft for r in off.requests)  # type: ignore[misc]


def test_system_prompts_share_their_whole_blocks() -> None:
    base = Workload.from_specs("t", [RequestSpec(f"r{i}", float(i), 10 + i, 1) for i in range(6)])
    w = with_system_prompts(base, 2, 40, seed=0)
    assert [s.num_prompt_tokens for s in w] == [50 + i for i in range(6)]
    prefixes = {s.block_hashes[:2] for s in w}
    assert len(prefixes) == 2  # both prompts drawn
    for s in w:
        assert len(s.block_hashes) == s.num_prompt_tokens // 16
        assert not set(s.block_hashes[2:]) & {h for o in w if o is not s for h in o.block_hashes}
    with pytest.raises(ValueError, match="already has block hashes"):
        with_system_prompts(w, 2, 40)
    with pytest.raises(ValueError, match="num_prompts must be an int >= 1, got 0"):
        with_system_prompts(base, 0, 40)
    loaded = load_workload("default", num_requests=20, system_prompts=3, system_prompt_tokens=64)
    assert all(len(s.block_hashes) >= 4 for s in loaded)
    with pytest.raises(ValueError, match="system_prompt_tokens needs system_prompts"):
        load_workload("default", num_requests=20, system_prompt_tokens=64)


def test_sharegpt_sessions_workload(data_dir: Path) -> None:
    w = load_workload("sharegpt-sessions", num_requests=300, data_dir=data_dir)
    assert len(w) == 300
    assert sum(s.after is not None for s in w) > 150  # most turns follow another
    assert all(s.num_prompt_tokens + s.num_output_tokens <= 8192 for s in w)
