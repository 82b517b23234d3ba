"""The plugin's background scoring (``scoring: "background"``): the scorer runs on a thread of its
own, so vLLM's engine thread never waits for it; requests wait, unscheduled, until their scores
are in, and none is lost on the way."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from headway.core import make_policy
from headway.integrations._server import headway_src_dir
from headway.integrations.vllm import (
    PluginConfig,
    PluginConfigError,
    PolicyAdapter,
    check_settings,
    word_count_scorer,
)
from headway.integrations.vllm._background import BackgroundScorer
from integrations._fake import FakeRequest

HERE = Path(__file__).resolve().parent


class Gate:
    """A scorer that waits until the test opens it (word counts as scores), and records its batches."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.batches: list[list[str]] = []
        self.entered = threading.Event()

    def __call__(self, prompts: list[str]) -> list[float]:
        self.entered.set()
        assert self.open.wait(10), "the test never opened the gate"
        self.batches.append(list(prompts))
        return word_count_scorer(prompts)


def _adapter(scorer: object, **kwargs: object) -> PolicyAdapter:
    return PolicyAdapter(
        make_policy("pars"), score_batch=scorer, decode=lambda b: [" ".join(["w"] * len(i)) for i in b],  # type: ignore[arg-type]
        clock=lambda: 1.0, epoch=0.0, background=True, **kwargs,
    )  # fmt: skip


def _wait_for(pred: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def test_requests_wait_outside_the_queue_until_their_scores_are_in() -> None:
    """While the scorer works, the queue has a length (vLLM's engine keeps stepping) but nothing to
    take (vLLM's loop checks ``bool`` before it peeks); a request that brought its own score, or
    needs none, is schedulable at once. Inline scoring would have scored on this thread, in the
    first ``bool``, and blocked here until the gate opened (the gate would time out the test)."""
    gate = Gate()
    a = _adapter(gate)
    q = a.make_queue()
    given = FakeRequest("given", 0.5, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 50.0}))
    q.add_request(given)
    for i, n in enumerate([30, 3, 12]):
        q.add_request(FakeRequest(f"p{i}", 0.5, n, 10, prompt_token_ids=list(range(n))))
    assert gate.entered.wait(10)
    assert len(q) == 4 and q  # the given score: schedulable now, the others still being scored
    assert [r.request_id for r in q] == ["given"] and len(q) == 4
    assert q.pop_request().request_id == "given"
    assert len(q) == 3 and not q  # nothing to take, but the engine is not idle
    assert a._scoring and not a._pending and not a.num_scored
    gate.open.set()
    _wait_for(lambda: bool(q))
    _wait_for(lambda: len(list(q)) == 3)  # (the scorer's thread may hand them back in batches)
    assert [r.request_id for r in q] == ["p1", "p2", "p0"] and a.num_scored == 3
    assert sum(map(len, gate.batches)) == 3 and a.score_time == 0.0  # none of it on this thread
    a.close()


def test_an_aborted_request_is_dropped_and_its_late_score_ignored() -> None:
    """Aborted while the scorer's thread held it (in a batch being scored), or before the thread
    read its prompt (gone from the engine's requests: no text to score, so the scorer never sees it,
    and no scorer failure is counted): it never reaches the queue and its score is dropped."""
    gate = Gate()
    a = _adapter(gate)
    q = a.make_queue()
    held, gone, kept = (FakeRequest(r, 0.5, 4, 10, prompt_token_ids=[1, 2]) for r in ("held", "gone", "kept"))
    q.add_request(held)
    assert gate.entered.wait(10)  # the thread is scoring [held]; the next two wait for it
    q.add_request(gone)
    q.add_request(kept)
    for r in (held, gone):  # vLLM aborts a waiting request: removed from its queue, then freed
        q.remove_request(r)
        a.finish(r, aborted=True)
    assert len(q) == 1 and held not in q and gone not in q and kept in q
    gate.open.set()
    _wait_for(lambda: bool(q))
    assert [r.request_id for r in q] == ["kept"] and len(q) == 1
    _wait_for(lambda: sum(map(len, gate.batches)) == 2)  # held's and kept's prompts; gone had none left
    assert a.num_score_failures == 0 and not a._pending and not a._scoring
    assert {"held", "gone"}.isdisjoint(a.reqs)
    a.close()


@pytest.mark.parametrize("broken", ["scorer", "decode"])
def test_a_scorer_that_fails_leaves_no_request_waiting(broken: str) -> None:
    """A scorer that raises, and a decode that raises outside the scorer's own retry, each give
    the missing score: every request is announced, none waits for good."""

    def boom(_: list[object]) -> list[float]:
        raise RuntimeError("boom")

    if broken == "scorer":
        a = _adapter(boom, missing_score=7.0)
    else:
        a = PolicyAdapter(
            make_policy("pars"), score_batch=word_count_scorer, decode=boom,  # type: ignore[arg-type]
            clock=lambda: 1.0, epoch=0.0, background=True, missing_score=7.0,
        )  # fmt: skip
    q = a.make_queue()
    for i in range(3):
        q.add_request(FakeRequest(f"r{i}", 0.5, 4, 10, prompt_token_ids=[1, 2, 3]))
    _wait_for(lambda: len(list(q)) == 3)
    assert [a.reqs[f"r{i}"].score for i in range(3)] == [7.0] * 3
    assert a.num_score_failures == 3 and a.num_missing_scores == 3
    a.close()


def test_the_background_scorer_hands_back_every_request_even_after_a_bug() -> None:
    """``score`` raising (a bug: :meth:`PolicyAdapter._score` catches the scorer's own failures) or
    answering the wrong count: each request comes back, with no score."""
    answers = iter([RuntimeError("bug"), [1.0], [2.0, 3.0]])

    def score(batch: object) -> list[float]:
        out = next(answers)
        if isinstance(out, Exception):
            raise out
        return out

    bs = BackgroundScorer(score, batch_size=2)  # type: ignore[arg-type]
    reqs = [SimpleNamespace(i=i) for i in range(6)]
    taken: list[tuple[object, float | None]] = []
    for r in reqs[:2]:
        bs.submit(r)  # type: ignore[arg-type]
    _wait_for(lambda: taken.extend(bs.take()) or len(taken) == 2)
    for r in reqs[2:4]:
        bs.submit(r)  # type: ignore[arg-type]
    _wait_for(lambda: taken.extend(bs.take()) or len(taken) == 4)
    for r in reqs[4:]:
        bs.submit(r)  # type: ignore[arg-type]
    _wait_for(lambda: taken.extend(bs.take()) or len(taken) == 6)
    assert [s for _, s in taken] == [None, None, None, None, 2.0, 3.0]
    assert [r for r, _ in taken] == reqs
    bs.close()
    assert not bs._thread.is_alive()


def test_the_scoring_setting() -> None:
    assert PluginConfig().scoring == "background"
    assert PluginConfig(scoring="inline").scoring == "inline"
    with pytest.raises(PluginConfigError, match="scoring must be one of background, inline, got 'thread'"):
        PluginConfig(scoring="thread")
    word_count = "headway.integrations.vllm:word_count_scorer"
    for scoring, where in (("background", "a thread of its own"), ("inline", "the engine's thread")):
        lines = check_settings(PluginConfig(policy="pars", scorer=word_count, scoring=scoring))
        assert any(f"it will run on {where}" in line for line in lines)


_SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    sys.path.insert(0, {tests!r})
    from _vllm_steps import Harness
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    import gate
    sc = dict(block_size=16, num_blocks=256, max_num_seqs=32, max_num_batched_tokens=512, chunked_prefill=True,
              prefix_caching=False, max_model_len=512,
              headway=dict(policy="pars", scorer="gate:score", scoring={scoring!r}, check_version=False))
    sched = Harness({model!r}).build(sc, {kind!r})

    def add(rid, n, out):
        p = SamplingParams(max_tokens=out, ignore_eos=True, detokenize=False)
        sched.add_request(Request(rid, list(range(3, 3 + n)), p, None, arrival_time=time.time()))

    def step():
        t = time.monotonic()
        out = sched.schedule()
        took = time.monotonic() - t
        ids = list(out.num_scheduled_tokens)
        res = ModelRunnerOutput(req_ids=ids, req_id_to_index={{r: k for k, r in enumerate(ids)}},
                                sampled_token_ids=[[7] for _ in ids])
        sched.update_from_output(out, res)
        return ids, took

    gate.OPEN.set()  # the first request is scored at once
    add("long", 8, 200)
    end = time.monotonic() + 60  # (the scorer's thread loads the tokenizer first)
    while "long" not in step()[0] and time.monotonic() < end:
        time.sleep(0.001)
    gate.OPEN.clear()
    for i in range(20):
        add(f"b{{i}}", 4 + i, 4)
    steps = []
    while len(steps) < 5:  # inline: the first of these waits for the scorer's whole batch
        steps.append(step())
    opened_at = len(steps)
    gate.OPEN.set()
    done = {{i for ids, _ in steps for i in ids if i.startswith("b")}}
    end = time.monotonic() + 60
    while len(done) < 20 and time.monotonic() < end:
        ids, took = step()
        steps.append((ids, took))
        done.update(i for i in ids if i.startswith("b"))
        time.sleep(0.001)  # as vLLM's engine loop yields the GIL between steps
    sched.shutdown()
    rep = dict(steps=steps[:opened_at], opened_at=opened_at, done=sorted(done), scored=sched.headway.num_scored,
               mro=[c.__name__ for c in type(sched).__mro__[:2]])
    print(json.dumps(rep))
""")

_GATE = textwrap.dedent("""
    import threading
    OPEN = threading.Event()
    def score(prompts):
        OPEN.wait(1.0)  # inline scoring holds the engine's step this long; background, only its thread
        return [float(len(p)) for p in prompts]
""")


@pytest.mark.parametrize(
    ("scoring", "kind"), [("background", "headway"), ("inline", "headway"), ("background", "headway-async")]
)
def test_vllm_s_steps_go_on_while_a_burst_is_scored(
    vllm_paths: tuple[Path, Path], tmp_path: Path, scoring: str, kind: str
) -> None:
    """``HeadwayScheduler`` on vLLM's own scheduler, a running request decoding, then a burst of 20
    arrivals whose scorer takes a second (a gate, not the machine's speed). Inline, the step that
    sees the burst waits for the scorer (the stall that 100 arrivals cost a live engine, ~1-3 s);
    in the background, the running request gets a token in each of the next steps while the burst
    waits for its scores, and every burst request is scheduled once they are in; the same on vLLM's
    ``AsyncScheduler`` (``--async-scheduling``; driven one batch at a time here)."""
    python, model = vllm_paths
    (tmp_path / "gate.py").write_text(_GATE)
    code = _SCRIPT.format(tests=str(HERE), model=str(model), scoring=scoring, kind=kind)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(headway_src_dir()), str(tmp_path)])}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    before = rep["steps"][: rep["opened_at"]]
    assert rep["done"] == sorted(f"b{i}" for i in range(20)) and rep["scored"] == 21
    assert rep["mro"][1] == ("AsyncScheduler" if kind.endswith("async") else "Scheduler")
    if scoring == "background":
        assert all(ids == ["long"] for ids, _ in before), before  # decoding on; the burst still unscored
        assert max(took for _, took in before) < 0.9  # no step waited out the scorer's second
    else:
        assert before[0][1] >= 0.9 and any(i.startswith("b") for i in before[0][0])  # scored in the step
