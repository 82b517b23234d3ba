"""One client's requests must not cost the others inside vLLM's engine: the in-process scorer reads a
bounded prefix of each prompt, and a prompt the scorer fails on costs only its own request its score."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from headway.core import make_policy
from headway.integrations._server import headway_src_dir
from headway.integrations.vllm import PolicyAdapter, word_count_scorer
from headway.integrations.vllm._scoring import SCORED_CHARS
from integrations._fake import FakeRequest


def _recording(seen: list[str]):  # type: ignore[no-untyped-def]
    def scorer(prompts: list[str]) -> list[float]:
        seen.extend(prompts)
        return word_count_scorer(prompts)

    return scorer


def test_a_huge_prompt_reaches_the_scorer_as_a_bounded_prefix() -> None:
    """A 1 MB prompt (detokenized, or kept as text by the engine) reached the scorer whole: the
    shipped predictor tokenizes all of it before truncating to its 96 tokens, 1.2 s on the engine
    thread, every other request's steps waiting. The scorer now reads the prompt's first
    ``SCORED_CHARS`` characters (lone surrogates replaced, which the predictor's tokenizer refuses),
    and the request keeps only those."""
    seen: list[str] = []
    huge = "word " * 200_000
    a = PolicyAdapter(
        make_policy("pars"), score_batch=_recording(seen), decode=lambda batch: [huge for _ in batch],
        clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    q.add_request(FakeRequest("ids", 0.5, 200_000, 10, prompt_token_ids=[1] * 200_000))
    text = FakeRequest("text", 0.6, 200_000, 10)
    text.prompt = "\ud800" + huge  # type: ignore[attr-defined]
    q.add_request(text)
    q.add_request(FakeRequest("short", 0.7, 4, 10, prompt_token_ids=[1, 2, 3, 4]))
    a.flush()
    assert len(seen) == 3 and max(len(p) for p in seen) <= SCORED_CHARS
    assert seen[0] == huge[:SCORED_CHARS] and seen[1] == "\ufffd" + huge[: SCORED_CHARS - 1]
    assert all(len(h.prompt or "") <= SCORED_CHARS for h in a.reqs.values())
    assert a.num_scored == 3 and a.num_score_failures == 0


def _raises_on_boom(prompts: list[str]) -> list[float]:
    if any("boom" in p for p in prompts):
        raise ValueError("cannot score this prompt")
    return [float(len(p)) for p in prompts]


def test_a_prompt_the_scorer_fails_on_costs_only_its_own_request_its_score() -> None:
    """The arrivals of a step are scored in one batch: a prompt the scorer raised on gave every request
    of the batch the missing score, so a client could blind the scheduler to everyone's lengths with
    one prompt each step. The batch is now retried one prompt at a time: the others keep their scores."""
    texts = {1: "boom", 2: "ab", 3: "abc"}
    a = PolicyAdapter(
        make_policy("pars"), score_batch=_raises_on_boom, missing_score=99.0,
        decode=lambda batch: [texts[len(i)] for i in batch], clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    for rid, n in (("boom", 1), ("b", 2), ("c", 3)):
        q.add_request(FakeRequest(rid, 0.5, n, 10, prompt_token_ids=list(range(n))))
    assert [r.request_id for r in q] == ["b", "c", "boom"]
    assert [a.reqs[r].score for r in ("b", "c", "boom")] == [2.0, 3.0, 99.0]
    assert a.num_score_failures == 1 and a.num_scored == 2 and a.num_missing_scores == 1


def test_a_scorer_that_fails_on_every_prompt_gives_each_the_missing_score() -> None:
    a = PolicyAdapter(
        make_policy("pars"), score_batch=lambda prompts: ["x"] * len(prompts), missing_score=5.0,
        decode=lambda batch: ["p"] * len(batch), clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    for i in range(3):
        q.add_request(
            FakeRequest(f"r{i}", 0.5, 4, 10, sampling_params=SimpleNamespace(extra_args=None), prompt_token_ids=[1])
        )
    a.flush()
    assert [h.score for h in a.reqs.values()] == [5.0] * 3
    assert a.num_score_failures == 3 and a.num_scored == 0


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_a_prompt_embeds_request_takes_the_missing_score_path(background: bool) -> None:
    """vLLM's engine request for a ``prompt_embeds`` prompt has no token ids and no text (vLLM
    0.32, ``vllm/v1/request.py``: ``prompt_token_ids`` None, ``prompt_embeds`` a tensor). The plugin
    scored it as a blank prompt, which the shipped predictor scores below 88 % of alpaca_eval's
    instructions, so such a request jumped ahead of most under ``pars``; nothing of its prompt can be
    read, so it now takes the missing-score path, as a request of token ids does at the gateway, and
    the scorer never sees it."""
    seen: list[str] = []
    a = PolicyAdapter(
        make_policy("pars"), score_batch=_recording(seen), missing_score=5.0, background=background,
        decode=lambda batch: ["three words here" for _ in batch], clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    q.add_request(FakeRequest("embeds", 0.5, 8, 10))
    q.add_request(FakeRequest("ids", 0.6, 3, 10, prompt_token_ids=[1, 2, 3]))
    end = time.monotonic() + 10
    while len(list(q)) < 2:  # (background: until the scorer's thread hands both back)
        assert time.monotonic() < end, "timed out"
    assert (a.reqs["embeds"].score, a.reqs["ids"].score) == (5.0, word_count_scorer(["three words here"])[0])
    assert seen == ["three words here"]
    assert (a.num_scored, a.num_missing_scores, a.num_score_failures) == (1, 1, 0)
    a.close()


def test_the_plugin_decodes_a_bounded_window_of_a_huge_prompt(vllm_paths: tuple[Path, Path]) -> None:
    """``HeadwayScheduler._hw_decode`` in vLLM's venv on the tiny Llama's tokenizer and chat template:
    it decoded every token of every prompt (twice for a prompt that is no chat: with and without special
    tokens). Now a 100,000-token plain prompt is decoded from its first ``SCORED_CHARS`` tokens and the
    chat check from its last ones; a chat prompt's long system prompt is still skipped, and a last
    message longer than the window is found by one whole decode."""
    python, model = vllm_paths
    code = textwrap.dedent(f"""
        import json, types
        from transformers import AutoTokenizer
        from headway.integrations.vllm import HeadwayScheduler
        from headway.integrations.vllm._scoring import SCORED_CHARS
        from headway.integrations.vllm._chat import chat_markers
        tok = AutoTokenizer.from_pretrained({str(model)!r})
        decoded = []
        class Recording:
            def __init__(self, inner):
                self.inner = inner
            def decode_batch(self, ids, skip_special_tokens):
                decoded.append(max(map(len, ids)))
                return self.inner.decode_batch(ids, skip_special_tokens=skip_special_tokens)
        me = types.SimpleNamespace(_hw_tokenizer=Recording(tok.backend_tokenizer), _hw_chat=chat_markers(tok))
        assert me._hw_chat is not None
        plain = tok("word " * 100_000, add_special_tokens=False)["input_ids"]
        def chat(system, user):
            msgs = [{{"role": "system", "content": system}}, {{"role": "user", "content": user}}]
            return list(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False))
        out = HeadwayScheduler._hw_decode(me, [plain, chat("Rules. " * 30_000, "Name a color.")])
        print(json.dumps([len(plain), max(decoded), len(out[0]), out[0][:10], out[1]]))
        decoded.clear()
        long_user = chat("Rules.", "Tell " * 30_000)
        out = HeadwayScheduler._hw_decode(me, [long_user])
        print(json.dumps([len(long_user), len(decoded), len(out[0]), out[0][:10]]))
    """)
    env = {**os.environ, "PYTHONPATH": str(headway_src_dir())}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    n_plain, most, n_out, start, message = json.loads(first)
    assert n_plain > 50_000 and most <= SCORED_CHARS + 256
    assert n_out <= SCORED_CHARS and start == "word word " and message == "Name a color."
    n_long, calls, n_out, start = json.loads(second)
    assert n_long > SCORED_CHARS + 256 and calls == 2  # the window, then the whole prompt
    assert 0 < n_out <= SCORED_CHARS and start == "Tell Tell "


def test_request_hints_limit_what_a_request_may_say_of_itself() -> None:
    """Any client of the vLLM server may send ``vllm_xargs``: a ``headway_score`` of -1e30 ran first
    under pars even with a scorer set (the request's score won), and a ``headway_tier`` of premium
    first under the tier policies. With ``request_hints`` listing none, the scorer scores it and its
    tenant and tier are the defaults; ``headway_request_id`` (the step log's) is still kept."""
    from headway.core import Tier
    from headway.integrations.vllm import PluginConfig
    from headway.integrations.vllm._errors import PluginConfigError
    from headway.integrations.vllm._settings import check_settings

    def arrive(hints: list[str]) -> PolicyAdapter:
        a = PolicyAdapter(
            make_policy("pars"), score_batch=lambda prompts: [float(len(p)) for p in prompts],
            decode=lambda batch: ["x" * len(i) for i in batch], clock=lambda: 1.0, epoch=0.0, request_hints=hints,
        )  # fmt: skip
        q = a.make_queue()
        for rid, n in (("honest", 2), ("jumper", 50)):
            r = FakeRequest(rid, 0.5, n, 10, prompt_token_ids=list(range(n)))
            if rid == "jumper":
                r.sampling_params = SimpleNamespace(ignore_eos=True, extra_args={
                    "headway_score": -1e30, "headway_tier": "premium", "headway_tenant": "vip",
                    "headway_request_id": "c-1"})  # fmt: skip
            q.add_request(r)
        a.flush()  # (arrivals are scored in a batch)
        return a

    trusting = arrive(list(PluginConfig().request_hints))
    jumper = trusting.reqs["jumper"]
    assert (jumper.score, jumper.tier, jumper.tenant_id) == (-1e30, Tier.PREMIUM, "vip")
    guarded = arrive([])
    jumper = guarded.reqs["jumper"]
    assert (jumper.score, jumper.tier, jumper.tenant_id) == (50.0, Tier.STANDARD, "default")
    assert jumper.extra["headway.client_id"] == "c-1"
    assert guarded.reqs["honest"].score == 2.0
    with pytest.raises(PluginConfigError, match="request_hints must be a list"):
        PluginConfig(request_hints=["score", "budget"])
    with pytest.raises(PluginConfigError, match="leaves out 'score'"):
        check_settings(PluginConfig(policy="pars", request_hints=["tier"]))
