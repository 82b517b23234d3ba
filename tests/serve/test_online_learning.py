"""The gateway's online learning (``online_learning``): finished requests feed the learner, a model's
requests are scored with its own head once it has one, and replicas on Redis share the windows."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from headway.serve import BackendConfig, GatewayConfig
from headway.serve._config import ConfigError

from .conftest import wait_until

PROMPTS = [f"Question {i}: " + ("please explain in detail " * (i % 5)) + "what a tide is." for i in range(25)]


@pytest.fixture(autouse=True)
def _shipped_predictor(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing trained in the cache: ``default`` is the shipped predictor."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "headway-cache"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, "got scorer ''"),
        ({"scorer": "headway.serve._stub:prompt_length_scores"}, "got scorer 'headway.serve._stub:prompt_length"),
        ({"scorer": "default", "scorer_process": True}, "got scorer 'default' with scorer_process"),
    ],
)
def test_online_learning_needs_the_predictor_scored_in_process(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^online_learning refits on the features .*{message}"):
        GatewayConfig(backends=(BackendConfig("http://a"),), online_learning=True, **settings)  # type: ignore[arg-type]
    assert not GatewayConfig(backends=(BackendConfig("http://a"),), scorer="default").online_learning  # off by default


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"online_learning": False}, "online_state is the file online learning saves its windows to"),
        ({"online_learning": True, "redis_url": "redis://127.0.0.1:1"}, "no redis_url \\(Redis keeps them\\)"),
    ],
)
def test_online_state_needs_learning_in_memory(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GatewayConfig(backends=(BackendConfig("http://a"),), scorer="default", online_state="s.npz", **settings)  # type: ignore[arg-type]


def test_the_serve_flag_turns_it_on() -> None:
    import argparse

    from headway.serve._cli import add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    argv = ["serve", "--backend", "http://127.0.0.1:1", "--scorer", "default"]
    assert build_config(parser.parse_args([*argv, "--online-learning"])).online_learning
    assert not build_config(parser.parse_args(argv)).online_learning
    config = build_config(parser.parse_args([*argv, "--online-learning", "--online-state", "/var/lib/hw.npz"]))
    assert config.online_state == "/var/lib/hw.npz"


def _send(url: str, model: str, prompts: list[str], stream: bool = False) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        for i, p in enumerate(prompts):
            body = {"model": model, "prompt": p, "max_tokens": 2 + 3 * (p.count("detail") + i % 2), "stream": stream}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            r.read()


def _all_scored(gw) -> None:
    """Requests answered before their score (the scorer's fast path) are scored in the background."""
    fin = gw.gateway.finished_requests
    wait_until(lambda: all(r.score is not None for r in fin), what="every finished request scored")


def test_finished_requests_teach_the_scorer_of_their_model(make_stub, make_gateway) -> None:
    # the float graph: int8 scores move with the batch a prompt lands in (Scorer's docstring), and a
    # request finished before its score (the scorer's fast path) may be embedded twice, by the
    # gateway's scoring and by the learner's thread, in different batches
    gw = make_gateway([make_stub().url], policy="pars", scorer="default", online_learning=True)
    online = gw.gateway.online
    learner = online.learner
    _send(gw.url, "m", PROMPTS[:12])
    _send(gw.url, "m", PROMPTS[12:24], stream=True)
    _all_scored(gw)
    learner.flush()
    assert learner.observed("m") == 24 and not learner.fitted("m")
    before = gw.gateway.finished_requests[-1].score
    prior = float(learner.score([PROMPTS[23]], "m")[0])
    assert before == pytest.approx(prior, abs=1e-6)  # the shipped predictor's score until a head is fitted
    _send(gw.url, "m", PROMPTS[24:])  # the 25th: the model's head is fitted (OnlineConfig.min_observations)
    learner.flush()
    assert learner.observed("m") == 25 and learner.fitted("m") and not learner.fitted("other")
    assert online.scorer_for("m") is not online.default and online.scorer_for("other") is online.default
    probe = "Write a long essay about the moon."
    _send(gw.url, "m", [probe])
    _send(gw.url, "other", [probe])
    _all_scored(gw)
    learned, plain = gw.gateway.finished_requests[-2:]
    assert learned.score == pytest.approx(float(learner.score([probe], "m")[0]), abs=1e-6)
    assert plain.score == pytest.approx(float(learner.score([probe], "other")[0]), abs=1e-6)
    assert not np.isclose(learned.score, plain.score)
    learner.flush()
    assert learner.observed("m") == 26 and learner.observed("other") == 1


def test_a_request_the_backend_refuses_is_not_learned(make_gateway, make_raw_backend) -> None:
    url, _ = make_raw_backend("drop")
    gw = make_gateway([url], scorer="default:onnx-int8", online_learning=True, max_attempts=1)
    with httpx.Client(base_url=gw.url, timeout=30) as c:
        assert c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}).status_code >= 500
    gw.gateway.online.learner.flush()
    assert gw.gateway.online.learner.observed("m") == 0


def test_replicas_on_redis_share_the_windows(redis_url, make_stub, make_gateway) -> None:
    import redis

    prefix = f"t{uuid.uuid4().hex[:6]}:"
    stub = make_stub()
    settings = {"scorer": "default:onnx-int8", "online_learning": True, "redis_url": redis_url, "redis_prefix": prefix}
    one, two = make_gateway([stub.url], **settings), make_gateway([stub.url], **settings)
    _send(one.url, "m", PROMPTS[:3])
    _send(two.url, "m", PROMPTS[3:5])
    for gw in (one, two):
        gw.gateway.online.learner.flush()
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.llen(f"{prefix}online:m") == 5, what="5 rows in the shared window")
    assert one.gateway.online.learner.observed("m") == two.gateway.online.learner.observed("m") == 5


def test_a_restarted_gateway_resumes_what_it_learned(make_stub, tmp_path, caplog) -> None:
    """``online_state``: the windows are saved when the gateway stops and resumed by the next one,
    which scores the model's requests with its head from the first."""
    from headway.serve import create_app
    from headway.serve._runner import serve_in_thread

    state = tmp_path / "online.npz"
    stub = make_stub()
    config = GatewayConfig(
        backends=(BackendConfig(stub.url, max_concurrency=4),),
        policy="pars",
        scorer="default",
        online_learning=True,
        online_state=str(state),
    )
    caplog.set_level("INFO", logger="headway.serve.scorer")
    first = create_app(config)
    assert f"online learning state {state}: nothing saved there yet, learning from the first completion" in caplog.text
    caplog.clear()
    with serve_in_thread(first) as url:
        _send(url, "m", PROMPTS[:24])  # one short of a head: nothing saved before the stop
        learner = first.state.gateway.online.learner
        learner.flush()
        assert learner.observed("m") == 24 and not learner.fitted("m") and not state.exists()
    caplog.set_level("INFO", logger="headway.serve.scorer")
    second = create_app(config)
    assert f"online learning state {state}: resumed 24 completions of m" in caplog.text
    with serve_in_thread(second) as url:
        learner = second.state.gateway.online.learner
        assert learner.observed("m") == 24 and not learner.fitted("m")
        _send(url, "m", PROMPTS[24:])
        learner.flush()
        assert learner.fitted("m")
    third = create_app(config)
    with serve_in_thread(third) as url:
        online = third.state.gateway.online
        assert online.learner.observed("m") == 25 and online.learner.fitted("m")
        assert online.scorer_for("m") is not online.default


def test_one_answer_is_learned_from_a_request_for_several(make_stub, make_gateway) -> None:
    """Usage counts the tokens of all ``n`` answers: the learner gets one answer's length; a list of
    prompts (scored as one joined text) is not learned from."""
    gw = make_gateway([make_stub().url], scorer="default:onnx-int8", online_learning=True)
    learner = gw.gateway.online.learner
    with httpx.Client(base_url=gw.url, timeout=30) as c:
        for body in (
            {"model": "m", "prompt": "Name a river.", "max_tokens": 6, "n": 3},
            {"model": "m", "messages": [{"role": "user", "content": "Name a sea."}], "max_tokens": 4, "n": 2,
             "stream": True, "stream_options": {"include_usage": True}},
            {"model": "m", "prompt": ["Name a lake.", "Name a hill."], "max_tokens": 5},
            {"model": "m", "prompt": ["Name a bay."], "max_tokens": 7},
        ):  # fmt: skip
            r = c.post("/v1/chat/completions" if "messages" in body else "/v1/completions", json=body)
            assert r.status_code == 200, r.text
    wait_until(lambda: len(gw.gateway.finished_requests) == 4, what="4 requests finished")
    learner.flush()
    assert sorted(learner.store.rows("m")[:, -1]) == [4.0, 6.0, 7.0]


def test_headway_serve_says_what_state_it_resumed(make_stub, tmp_path) -> None:
    """The line is logged while the app is made, so logging is set up before it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from headway.predict.online import MemoryStore
    from headway.serve._runner import free_port

    state = tmp_path / "online.npz"
    store = MemoryStore()
    store.append("m", np.zeros(389), 500)
    store.save(state)  # (no predictor recorded: checked by its width)
    port = free_port()
    argv = [sys.executable, "-m", "headway.serve", "serve", "--backend", make_stub().url, "--port", str(port),
            "--scorer", "default", "--online-learning", "--online-state", str(state)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1]
    assert f"online learning state {state}: resumed 1 completion of m" in err


@pytest.mark.parametrize("workload_models", [False, True])
def test_bench_serve_replays_a_prompt_log_under_its_own_models(  # type: ignore[no-untyped-def]
    make_stub, make_gateway, tmp_path, workload_models: bool
) -> None:
    """A prompt log of two models replayed through the gateway: with ``--workload-models`` each request
    goes under its log's model and the gateway learns each model's lengths apart; without, all go
    under the served model's name."""
    import json

    from headway.serve import BenchConfig, run_bench_sync
    from headway.workload import load_workload

    log = tmp_path / "log.jsonl"
    lines = [{"prompt": p, "output_tokens": 3 + i % 4, "model": "a" if i % 3 else "b"} for i, p in enumerate(PROMPTS)]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    workload = load_workload(str(log), arrivals="burst")
    assert [s.model for s in workload][:4] == ["b", "a", "a", "b"]
    stub = make_stub()
    gw = make_gateway([stub.url], policy="pars", scorer="default", online_learning=True)
    cfg = BenchConfig(gw.url, workload_models=workload_models, max_concurrency=4)
    reqs = run_bench_sync(workload, cfg)
    assert all(r.state.name == "FINISHED" for r in reqs)
    learner = gw.gateway.online.learner
    want = {"a": 16, "b": 9} if workload_models else {"stub-model": 25}

    def observed() -> dict[str, int]:  # (the gateway observes a completion as its answer ends: a moment after)
        learner.flush()
        return learner.observed_by_model()

    # (the learner embeds each prompt on a background thread: seconds on a loaded 2-core machine)
    wait_until(lambda: sum(observed().values()) == 25, timeout=60.0, what="every completion observed")
    assert observed() == want
    assert [r.extra["model"] for r in reqs][:2] == (["b", "a"] if workload_models else ["stub-model"] * 2)
