"""How ``headway bench serve`` reads a stream's SSE events other than one ``data:`` line, against vLLM
0.32's own client (``vllm bench serve``'s ``async_request_openai_completions``, run in the vLLM venv).

vLLM's client splits what it has read at blank lines (``StreamedResponseHandler``), skips an event that
starts with a comment line and ``json.loads`` every other event after a leading ``data: ``: an
``event:``, ``id:`` or ``retry:`` line, a second ``data:`` line or a comment after the data fail the
request. headway's client took every ``data:`` line and skipped every other line. (Read event by
event, vLLM's client does otherwise: its buffer keeps an event it could not place and glues the next
ones to it, so a lone ping before the first token fails the request there and a lone ``event:`` event
swallows the next token; those are not followed here.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headway.core import Request, RequestState
from headway.serve import _bench

from .test_bench import TOKEN, _raw_sse_app, _usage

T = f"data: {TOKEN}\n\n"
CASES = {  # max_tokens -> (what it names, the stream sent)
    3: ("data lines only", [T, T, f"data: {_usage(2)}\n\n", "data: [DONE]\n\n"]),
    4: ("an event: line before each data line", ["event: completion\n" + T, "event: completion\n" + T]),
    5: ("an event with an event: line alone", [T, "event: ping\n\n", T]),
    6: ("a comment event first (a ping)", [": ping\n\n", T, T]),
    7: ("a comment event between tokens", [T, ": ping\n\n", T]),
    8: ("an event that opens with a comment, then data", [T, ": note\n" + T, T]),
    9: ("a comment line after the data", [T, T.rstrip("\n") + "\n: note\n\n", T]),
    10: ("an id: line", ["id: 1\n" + T, T]),
    11: ("a retry: event", [T, "retry: 100\n\n", T]),
    12: ("two data lines in one event", [T.rstrip("\n") + "\n" + T, T]),
    13: ("a stream ending without its blank line", [T, T.rstrip("\n")]),
}


# Runs in the vLLM venv: vLLM's own client for /v1/completions, one request per max_tokens given, in turn
_VLLM_CLIENT = """
import asyncio, json, sys
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
async def main():
    out = []
    async with aiohttp.ClientSession() as session:
        for n in sys.argv[2:]:
            inp = RequestFuncInput(prompt="hi", api_url=sys.argv[1] + "/v1/completions", prompt_len=1,
                                   output_len=int(n), model="m")
            o = await async_request_openai_completions(inp, session)
            out.append({"success": o.success, "ttft": o.ttft, "itl": o.itl})
    print(json.dumps(out))
asyncio.run(main())
"""


def _whole(n: int) -> list[tuple[float, bytes]]:
    """The case's stream in one write, so that vLLM's client reads its events together."""
    return [(0.0, "".join(CASES[n][1]).encode())]


@pytest.mark.vllm
def test_non_data_lines_fail_or_are_skipped_as_vllms_client_does(servers, vllm_python: Path) -> None:
    from headway.serve import BenchConfig, run_bench_sync, serve_in_thread
    from headway.workload import RequestSpec, Workload

    url = servers.enter_context(serve_in_thread(_raw_sse_app(_whole)))
    specs = [RequestSpec(f"r{n}", 0.0, num_prompt_tokens=4, num_output_tokens=n) for n in CASES]
    reqs = run_bench_sync(Workload.from_specs("w", specs), BenchConfig(url, model="m", timeout_s=60))
    ours = {n: (r.state is RequestState.FINISHED, r.num_output_tokens if r.first_token_time else 0)
            for n, r in zip(CASES, reqs, strict=True)}  # fmt: skip
    done = subprocess.run([str(vllm_python), "-c", _VLLM_CLIENT, url, *map(str, CASES)], capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    outputs = json.loads(done.stdout.strip().splitlines()[-1])
    theirs = {n: (o["success"], len(o["itl"]) + 1 if o["ttft"] else 0) for n, o in zip(CASES, outputs, strict=True)}
    assert ours == theirs, {CASES[n][0]: (ours[n], theirs[n]) for n in CASES if ours[n] != theirs[n]}
    assert [ok for ok, _ in ours.values()] == [True, False, False, True, True, True, False, False, False, False, True]
    assert ours[8] == (True, 2)  # the event that opened with a comment was skipped, its data too
    assert {r.extra.get("abort_reason") for r in reqs if r.state is not RequestState.FINISHED} == {"bad_chunk"}


def _read(lines: list[str]) -> Request:
    async def gen() -> AsyncIterator[str]:
        for line in lines:
            yield line

    req = Request("r", 0.0, 4, max_tokens=8)
    req.transition(RequestState.RUNNING)  # (sent)
    asyncio.run(_bench._read_stream(gen(), req, 0.0))
    return req


@pytest.mark.parametrize(
    ("lines", "message", "tokens"),
    [
        (["event: completion", f"data: {TOKEN}", ""], "a line other than its data: event: completion", 0),
        ([f"data: {TOKEN}", "", "event: ping", "", f"data: {TOKEN}", ""], "a line other than its data: event: ping", 1),
        ([f"data: {TOKEN}", "id: 7", ""], "a line other than its data: id: 7", 0),
        ([f"data: {TOKEN}", ": note", ""], "a line other than its data: : note", 0),
        ([f"data: {TOKEN}", f"data: {TOKEN}", ""], f"a second data line: data: {TOKEN}", 0),
    ],
    ids=["event-line", "event-alone", "id-after-data", "comment-after-data", "two-data-lines"],
)
def test_an_event_that_is_not_one_data_line_fails_the_request(lines, message, tokens) -> None:
    # the tokens before the bad event are kept (with their times, as vLLM's record of a failed request);
    # the bad event's data is not counted
    req = _read([*lines, f"data: {TOKEN}", "", "data: [DONE]", ""])
    assert req.state is RequestState.ABORTED and req.extra["abort_reason"] == "bad_chunk"
    assert req.extra["error_message"] == f"a streamed event has {message}"
    assert req.num_output_tokens == tokens


def test_a_comment_event_is_skipped_whole() -> None:
    lines = [": ping", "", f"data: {TOKEN}", "", ": note", f"data: {TOKEN}", "", f"data: {TOKEN}", ""]
    req = _read([*lines, "data: [DONE]", ""])
    assert req.state is RequestState.FINISHED and req.num_output_tokens == 2


def test_a_crlf_split_between_two_reads_ends_one_line() -> None:
    class Content:
        async def iter_any(self) -> AsyncIterator[bytes]:
            for part in (b"event: x\r", b"\ndata: 1\r\n\r", b"\n", b"data: 2\r\r\n"):
                yield part

    async def lines() -> list[str]:
        return [line async for line in _bench._lines(Content())]  # type: ignore[arg-type]

    assert asyncio.run(lines()) == ["event: x", "data: 1", "", "data: 2", ""]
