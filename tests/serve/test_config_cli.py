"""Config files, validation messages, the CLI and SIGTERM draining."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from headway.core import Tier, UnknownPolicyError
from headway.serve import (
    BackendConfig,
    ConfigError,
    GatewayConfig,
    StubConfig,
    create_stub_app,
    free_port,
    hash_api_key,
    load_config,
    serve_in_thread,
)
from headway.serve._cli import main

TOML = """
policy = "sjf-oracle"
max_queue_len = 50
queue_ttl_s = 5.5

[[backends]]
url = "http://127.0.0.1:9001/v1"
max_concurrency = 3

[[backends]]
url = "http://127.0.0.1:9002"
max_concurrency = 0
metrics_poll_s = 0.5

[[tenants]]
name = "acme"
tier = "premium"
api_key_sha256 = "{h}"
"""


def test_load_toml_and_json(tmp_path):
    p = tmp_path / "gw.toml"
    p.write_text(TOML.format(h=hash_api_key("sk-1")))
    c = load_config(p)
    assert c.policy == "sjf-oracle" and c.max_queue_len == 50 and c.queue_ttl_s == 5.5
    assert [b.url for b in c.backends] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert c.tenants[0].tier is Tier.PREMIUM and c.tenants[0].api_key_sha256 == (hash_api_key("sk-1"),)
    assert c.auth_enabled
    # CLI overrides win; --backend replaces the file's backends
    c2 = load_config(p, policy="fcfs", backends=[BackendConfig("http://127.0.0.1:9003")])
    assert c2.policy == "fcfs" and [b.url for b in c2.backends] == ["http://127.0.0.1:9003"]
    j = tmp_path / "gw.json"
    j.write_text(json.dumps({"backends": ["http://127.0.0.1:9001"], "policy": "fcfs"}))
    # by default admission follows the backend's own /metrics, with no fixed in-flight cap
    b = load_config(j).backends[0]
    assert (b.max_concurrency, b.metrics_poll_s, b.api_key) == (0, 0.5, "")
    # a fixed limit is the other mode: no polling unless asked for too
    assert BackendConfig("http://a", max_concurrency=3).metrics_poll_s == 0
    assert BackendConfig("http://a", max_concurrency=3, metrics_poll_s=0.2).metrics_poll_s == 0.2


def test_https_backend_and_api_key_not_in_repr():
    b = BackendConfig("https://llm.example:8443/v1", api_key="sk-upstream")
    assert b.url == "https://llm.example:8443" and b.api_key == "sk-upstream"
    assert "sk-upstream" not in repr(b)
    with pytest.raises(ConfigError, match="line breaks"):
        BackendConfig("http://a", api_key="k\r\nX-Evil: 1")


def test_transparent_defaults():
    c = GatewayConfig(backends=(BackendConfig("http://a"),))
    assert (c.default_max_tokens, c.add_stream_usage, c.assumed_output_tokens) == (0, False, 256)
    with pytest.raises(ConfigError, match="assumed_output_tokens must be >= 1, got 0"):
        GatewayConfig(backends=(BackendConfig("http://a"),), assumed_output_tokens=0)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"backends": []}, "at least one backend"),
        ({"backends": ["ftp://x"]}, "'ftp://x'"),
        ({"backends": [{"url": "http://a", "max_concurrency": -1}]}, "max_concurrency must be >= 0, got -1"),
        ({"backends": [{"url": "http://a", "max_concurrency": 0, "metrics_poll_s": 0}]}, "needs max_concurrency > 0"),
        ({"backends": ["http://a"], "queue_ttl_s": 0}, "queue_ttl_s must be > 0, got 0"),
        ({"backends": ["http://a"], "max_queue_len": 0}, "max_queue_len must be >= 1, got 0"),
        ({"backends": ["http://a"], "scorer_hold_s": -1}, "scorer_hold_s must be >= 0, got -1"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_threads": 0}, "scorer_threads must be >= 1, got 0"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_threads": "2"}, "'scorer_threads' must be an integer"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_max_length": 4}, "must be >= 8 tokens, got 4"),
        ({"backends": ["http://a"], "scorer": "m:f", "scorer_max_length": 64}, "only to a trained predictor"),
        ({"backends": ["http://a"], "scorer": "defaults:f", "scorer_threads": 1}, "only to a trained predictor"),
        ({"backends": ["http://a"], "scorer": "no-such-dir"}, "a predictor checkpoint directory or 'module:callable'"),
        ({"backends": ["http://a"], "scorer": "defualt"}, "got 'defualt'; did you mean 'default'?"),
        ({"backends": ["http://a"], "scorer": "no-such-dir"}, "there is no checkpoint directory 'no-such-dir' in "),
        ({"backends": ["http://a"], "bogus": 1}, "unknown gateway setting(s) ['bogus']"),
        ({"backends": ["http://a"], "redis_url": "http://r"}, "redis_url must start with"),
        ({"backends": ["http://a"], "tenants": [{"name": "t", "api_key_sha256": ["abc"]}]}, "64 hex digits"),
        ({"backends": ["http://a"], "tenants": [{"name": "t", "tier": "gold"}]}, "unknown tier 'gold'"),
        ({"backends": ["ws://a"]}, "backends.url must be an http:// or https:// URL, got 'ws://a'"),
        ({"backends": ["http://127.0.0.1:999999"]}, "backends.url has a port out of range 0-65535: 'http"),
        ({"backends": ["http://a"], "headers_timeout_s": -1}, "headers_timeout_s must be >= 0, got -1"),
        ({"backends": ["http://a"], "api_keys": "required"}, "every request would get 401"),
        ({"backends": ["http://a"], "tenants": [{"name": "t"}]}, "no tenant has an api_key_sha256"),
        (
            {"backends": ["http://a"], "router": "cache-aware", "router_args": {"cache_threshold": 2}},
            "router_args: cache-aware: cache_threshold must be a number in [0, 1], got 2",
        ),
        ({"backends": ["http://a"], "router_args": {"seed": 1}}, "router_args: router 'least-outstanding' has no"),
        (  # it was ignored: the Redis dispatcher picks the least-loaded backend
            {"backends": ["http://a"], "router": "cache-aware", "redis_url": "redis://r"},
            "router 'cache-aware' (and router_args) applies without redis_url only",
        ),
    ]
    + [
        ({"backends": ["http://a"], "policy": p}, f"policy {p!r} ranks requests by a predicted length score")
        for p in ("pars", "sjf-score", "trail", "ltr", "rank-boost")
    ]
    + [
        (
            {"backends": ["http://a"], "policy": "bands", "policy_args": {"inner": "pars"}},
            "policy 'bands' ranks requests by a predicted length score",
        )
    ],
)
def test_validation_names_the_bad_value(tmp_path, data, needle):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_config(p)
    assert needle in str(info.value)


def test_score_ranked_policy_needs_a_scorer_and_says_how():
    with pytest.raises(ConfigError) as info:
        GatewayConfig(backends=(BackendConfig("http://a"),), policy="pars")
    assert "--scorer default:onnx-int8" in str(info.value) and "--policy-arg scorer=noisy-oracle" in str(info.value)
    # either scorer will do
    GatewayConfig(backends=(BackendConfig("http://a"),), policy="pars", scorer="default:onnx-int8")
    GatewayConfig(
        backends=(BackendConfig("http://a"),), policy="pars", policy_args={"scorer": "noisy-oracle", "tau": 0.8}
    )


def test_required_keys_may_come_from_redis():
    c = GatewayConfig(backends=(BackendConfig("http://a"),), api_keys="required", redis_url="redis://127.0.0.1:1")
    assert c.auth_enabled


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0])
def test_timeouts_must_be_finite_and_positive(value):
    for name in ("connect_timeout_s", "read_timeout_s", "body_timeout_s"):
        with pytest.raises(ConfigError, match=f"{name} must be > 0 and finite"):
            GatewayConfig(backends=(BackendConfig("http://a"),), **{name: value})
    if value:
        with pytest.raises(ConfigError, match="drain_timeout_s must be >= 0 and finite"):
            GatewayConfig(backends=(BackendConfig("http://a"),), drain_timeout_s=value)


def test_unknown_policy_lists_valid_ones():
    with pytest.raises(UnknownPolicyError, match="Valid policies"):
        GatewayConfig(backends=(BackendConfig("http://a"),), policy="fcfsx")


def test_bad_config_file_is_a_config_error(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("policy = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)


def test_cli_rejects_bad_settings(capsys):
    assert main(["serve", "--backend", "http://127.0.0.1:1", "--policy", "nope"]) == 2
    assert capsys.readouterr().err.startswith("headway: error: Unknown policy 'nope'")
    for port in ("99999", "-1"):
        assert main(["serve", "--backend", "http://127.0.0.1:1", "--port", port]) == 2
        assert capsys.readouterr().err == f"headway: error: --port must be in 0..65535, got {port}\n"
        assert main(["stub", "--port", port]) == 2
        assert "--port must be in 0..65535" in capsys.readouterr().err
    assert main(["serve", "--backend", "http://127.0.0.1:1", "--policy", "pars"]) == 2
    assert "headway: error: policy 'pars' ranks requests" in capsys.readouterr().err
    assert main(["serve", "--backend", "http://127.0.0.1:1", "--log-level", "loud"]) == 2
    assert capsys.readouterr().err == (
        "headway: error: the log level must be debug, info, warning, error or critical, got 'loud'\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-queue", "0"], "--max-queue must be >= 1, got 0"),
        (["--queue-ttl", "nan"], "--queue-ttl must be a finite number, got float nan"),
        (["--redis-lease", "-1"], "--redis-lease must be > 0, got -1.0"),
        (["--backend-concurrency", "-1"], "--backend-concurrency must be >= 0, got -1"),
        (["--saturation-poll", "-1"], "--saturation-poll must be a finite number of seconds >= 0, got -1.0"),
        (["--scorer-threads", "0"], "--scorer-threads must be >= 1, got 0"),
    ],
)
def test_a_bad_flag_is_named_as_the_flag(flags, message, capsys, monkeypatch):
    monkeypatch.setattr("headway.serve._runner.run_app", lambda *a, **k: pytest.fail("the gateway started"))
    assert main(["serve", "--backend", "http://127.0.0.1:1", "--port", "0", *flags]) == 2
    assert capsys.readouterr().err == f"headway: error: {message}\n"


def test_a_bad_config_file_setting_keeps_its_name(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_queue_len": 0}))
    assert main(["serve", "--backend", "http://127.0.0.1:1", "--port", "0", "--config", str(cfg)]) == 2
    assert capsys.readouterr().err == "headway: error: max_queue_len must be >= 1, got 0\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--token-delay", "-1"], "--token-delay must be a finite number of seconds >= 0, got -1.0"),
        (["--token-delay", "inf"], "--token-delay must be a finite number of seconds >= 0, got inf"),
        (["--first-token-delay", "nan"], "--first-token-delay must be a finite number of seconds >= 0, got nan"),
        (["--max-num-seqs", "-1"], "--max-num-seqs must be >= 0 (0: no limit), got -1"),
    ],
)
def test_stub_refuses_bad_timings_before_listening(flags, message, capsys, monkeypatch):
    monkeypatch.setattr("headway.serve._runner.run_app", lambda *a, **k: pytest.fail("the stub started"))
    assert main(["stub", "--port", "0", *flags]) == 2
    assert capsys.readouterr().err == f"headway: error: {message}\n"


def test_unreachable_redis_at_startup_is_one_clear_line(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"redis_retry_s": 0.2}))
    dead = f"redis://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "headway.serve", "serve", "--backend", "http://127.0.0.1:1", "--port", str(free_port()),
         "--redis", dead, "--config", str(cfg)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "cannot start the gateway: redis unreachable for 0.2 s" in proc.stderr


@pytest.mark.redis
def test_a_taken_port_with_redis_exits_at_once(redis_url):
    """The gateway used to hang for good: its Redis grant listener never finished its cancellation."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "headway.serve", "serve", "--backend", "http://127.0.0.1:1", "--port", str(port),
             "--redis", redis_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2 and f"port {port} is already in use" in proc.stderr
    assert time.monotonic() - t0 < 20 and "did not stop" not in proc.stderr


def test_a_port_in_use_is_one_clear_line_and_exit_status_2():
    """Not uvicorn's multi-line ``ERROR: [Errno 98] ...`` and exit status 3: the bind's own failure, said
    once, before anything slow starts."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for argv in (["serve", "--backend", "http://127.0.0.1:1", "--port", str(port)], ["stub", "--port", str(port)]):
            proc = subprocess.run([sys.executable, "-m", "headway.serve", *argv], capture_output=True, text=True,
                                  timeout=60)  # fmt: skip
            assert proc.returncode == 2, proc.stderr
            assert proc.stderr == (
                f"headway: error: port {port} is already in use (on 127.0.0.1): stop what listens there or "
                "choose another --port\n"
            )


def test_a_backend_without_a_scheme_is_named_with_its_fix(capsys):
    assert main(["serve", "--backend", "127.0.0.1:8000"]) == 2
    assert capsys.readouterr().err == (
        "headway: error: --backend must be an http:// or https:// URL, got '127.0.0.1:8000' "
        "(did you mean --backend http://127.0.0.1:8000?)\n"
    )
    assert main(["serve", "--backend", "ws://a"]) == 2  # another scheme: nothing to guess
    assert capsys.readouterr().err == "headway: error: --backend must be an http:// or https:// URL, got 'ws://a'\n"
    with pytest.raises(ConfigError, match=re.escape("got 'localhost:8000' (did you mean 'http://localhost:8000'?)")):
        BackendConfig("localhost:8000")  # a config file's or HEADWAY_BACKENDS' backends.url


class _Stderr:
    """A process's stderr read line by line in a thread (its lines wait in a queue)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import queue

        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def line_with(self, needle: str, timeout: float = 30) -> str:
        """The first line that holds ``needle`` (fails if the process exits or takes too long)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"exited with {self.proc.wait()} before saying {needle!r}"
            if needle in line:
                return line

    def stop(self) -> None:
        """SIGTERM, wait (kill after 15 s), and close the pipe once read to its end."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def test_stub_and_gateway_each_say_where_they_listen_once_they_do():
    def start(*argv: str) -> _Stderr:
        cmd = [sys.executable, "-m", "headway.serve", *argv]
        running.append(_Stderr(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        return running[-1]

    running: list[_Stderr] = []
    try:
        line = start("stub", "--port", "0").line_with("headway stub on ")
        assert "a fake OpenAI-compatible backend answering as model 'stub-model'" in line
        found = re.search(r"on (http://127\.0\.0\.1:(\d+)):", line)
        assert found is not None and found[2] != "0", line  # the port it got
        stub_url = found[1]
        assert httpx.get(stub_url + "/health", timeout=5).status_code == 200  # listening when it says so
        line = start("serve", "--backend", stub_url, "--port", "0").line_with("headway gateway listening on ")
        found = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
        assert found is not None and not found[1].endswith(":0"), line
        assert httpx.get(found[1] + "/v1/models", timeout=5).status_code == 200
    finally:
        for proc in running:
            proc.stop()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str) -> None:
    """Until a gateway process answers /health with 200 (fails if it exits or takes over 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)


def test_sigterm_drains_inflight_and_queued_work():
    """SIGTERM: stop accepting, finish running and queued requests, exit."""
    stub_app = create_stub_app(StubConfig(token_delay_s=0.02))
    with serve_in_thread(stub_app) as stub_url:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway.serve", "serve", "--backend", stub_url, "--port", str(port),
             "--backend-concurrency", "1", "--drain-timeout", "10", "--log-level", "info"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url)
            results: list[int] = []

            def send() -> None:
                body = {"model": "m", "prompt": "x", "max_tokens": 60}
                results.append(httpx.post(url + "/v1/completions", json=body, timeout=20).status_code)

            threads = [threading.Thread(target=send) for _ in range(3)]  # 1 running + 2 queued
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while httpx.get(url + "/health", timeout=2).json().get("queued") != 2:
                assert time.monotonic() < deadline, "requests did not queue"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            with pytest.raises(httpx.ConnectError):  # no longer accepting
                httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=2)
            for t in threads:
                t.join(timeout=20)
            assert results == [200, 200, 200]
            assert proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
            # the gateway says what it drains (uvicorn's lines said only that it shuts down)
            assert proc.stderr is not None
            said = proc.stderr.read()
            assert "headway gateway draining (up to 10 s): 3 requests open, new connections refused" in said
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def test_sigterm_past_the_drain_timeout_ends_open_requests_cleanly(tmp_path):
    """Past the drain timeout: a 503 with Retry-After for a queued and an in-flight non-streamed
    request, a final error event and [DONE] for a stream; no traceback."""
    stub_app = create_stub_app(StubConfig(token_delay_s=0.02))
    log = tmp_path / "gateway.log"
    with serve_in_thread(stub_app) as stub_url, open(log, "w") as out:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway.serve", "serve", "--backend", stub_url, "--port", str(port),
             "--backend-concurrency", "2", "--drain-timeout", "1", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url)
            body = {"model": "m", "prompt": "x", "max_tokens": 500}  # 10 s each
            plain: list[httpx.Response] = []
            stream: list[str] = []

            def send() -> None:
                plain.append(httpx.post(url + "/v1/completions", json=body, timeout=20))

            def read_stream() -> None:
                with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=20) as r:
                    stream.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))

            threads = [threading.Thread(target=read_stream)]
            threads[0].start()
            time.sleep(0.3)
            threads += [threading.Thread(target=send) for _ in range(2)]  # 1 running + 1 queued
            for t in threads[1:]:
                t.start()
            deadline = time.monotonic() + 10
            while httpx.get(url + "/health", timeout=2).json().get("queued") != 1:
                assert time.monotonic() < deadline, "request did not queue"
                time.sleep(0.02)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(timeout=20)
            assert time.monotonic() - t0 < 1 + 2
            assert [r.status_code for r in plain] == [503, 503]
            for r in plain:
                assert r.json()["error"]["code"] == "drain_timeout" and r.headers["retry-after"] == "1"
            assert stream[-1] == "[DONE]" and json.loads(stream[-2])["error"]["code"] == "drain_timeout"
            assert len(stream) > 3  # tokens came before the cut
            assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "Internal Server Error" not in text, text


def test_cli_parsers_build_and_map_to_config():
    import argparse

    from headway.serve._bench_cli import add_bench_parser
    from headway.serve._cli import add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_serve_parser(sub)
    add_bench_parser(sub)
    args = parser.parse_args(
        ["serve", "--backend", "http://127.0.0.1:1", "--backend", "http://127.0.0.1:2", "--policy", "pars",
         "--policy-arg", "tau=0.9", "--policy-arg", "scorer=noisy-oracle", "--backend-concurrency", "3",
         "--queue-ttl", "7", "--api-keys", "off", "--scorer-hold", "0.25", "--scorer", "default:onnx-int8",
         "--scorer-threads", "2", "--scorer-max-length", "64", "--scorer-batch-size", "8", "--scorer-process",
         "--read-timeout", "120", "--headers-timeout", "7.5", "--max-tokens-limit", "100", "--min-priority", "-5"]
    )  # fmt: skip
    c = build_config(args)
    assert c.min_priority == -5
    assert (c.read_timeout_s, c.headers_timeout_s, c.max_tokens_limit) == (120, 7.5, 100)
    assert c.scorer_hold_s == 0.25
    assert (c.scorer, c.scorer_threads, c.scorer_max_length) == ("default:onnx-int8", 2, 64)
    assert c.scorer_batch_size == 8 and c.scorer_process
    plain = build_config(parser.parse_args(["serve", "--backend", "http://127.0.0.1:1"]))
    assert not plain.scorer_process  # off unless asked for
    assert plain.min_priority is None  # no bound unless asked for
    assert [b.max_concurrency for b in c.backends] == [3, 3]
    assert c.policy_args == {"tau": 0.9, "scorer": "noisy-oracle"} and c.queue_ttl_s == 7
    assert not c.auth_enabled
    b = parser.parse_args(["bench", "serve", "--base-url", "http://x", "--workload", "burst", "--tenant-key", "a=k"])
    assert b.tenant_key == [("a", "k")] and callable(b.func)


# ------------------------------------------------------------- drop-in: flags, environment, logs
def test_serve_help_states_the_configs_defaults():
    from headway.serve import _cli
    from headway.serve._config import DEFAULT_METRICS_POLL_S

    fields = GatewayConfig.__dataclass_fields__
    for name, stated in _cli._D.items():
        assert fields[name].default == stated, name
    assert _cli._DEFAULT_POLL == DEFAULT_METRICS_POLL_S
    parser = argparse.ArgumentParser()
    _cli.add_serve_parser(parser.add_subparsers())
    text = " ".join(parser._subparsers._group_actions[0].choices["serve"].format_help().split())  # type: ignore[union-attr]
    for needle in ("(default fcfs;", "(default 10000)", "default 0: add nothing", "(default 0.5 without",
                   "default 60)", "(default 8000; HEADWAY_PORT)"):  # fmt: skip
        assert needle in text, needle


def test_policy_arg_takes_simulates_syntax_and_the_short_one(capsys):
    from headway.serve._cli import add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    base = ["serve", "--backend", "http://127.0.0.1:1", "--policy", "bands"]
    c = build_config(parser.parse_args([*base, "--policy-arg", "bands.inner=pars", "--policy-arg",
                                        "bands.scorer=noisy-oracle", "--policy-arg", "tau=0.9"]), env={})  # fmt: skip
    assert c.policy_args == {"inner": "pars", "scorer": "noisy-oracle", "tau": 0.9}
    with pytest.raises(ConfigError, match="names policy 'pars', but --policy is 'bands'"):
        build_config(parser.parse_args([*base, "--policy-arg", "pars.tau=0.9"]), env={})
    assert main([*base, "--policy-arg", "fcfs.x=1"]) == 2
    assert "but --policy is 'bands'" in capsys.readouterr().err


def test_every_setting_from_headway_environment_variables(tmp_path):
    from headway.serve._cli import add_serve_parser, build_config
    from headway.serve._config_load import config_from_env

    env = {
        "HEADWAY_POLICY": "priority", "HEADWAY_MAX_QUEUE_LEN": "7", "HEADWAY_QUEUE_TTL_S": "2.5",
        "HEADWAY_ADD_STREAM_USAGE": "true", "HEADWAY_POLICY_ARGS": "{}", "HEADWAY_BACKENDS": "http://b1, https://b2",
        "HEADWAY_BACKEND_API_KEY": "sk-up", "HEADWAY_VLLM_CPUS": "1",  # not a setting: ignored
    }  # fmt: skip
    assert config_from_env(env) == {
        "policy": "priority", "max_queue_len": 7, "queue_ttl_s": 2.5, "add_stream_usage": True, "policy_args": {},
        "backends": ["http://b1", "https://b2"],
    }  # fmt: skip
    # file < environment < flags
    p = tmp_path / "c.toml"
    p.write_text('policy = "fcfs"\nmax_queue_len = 3\nretry_after_s = 4\n')
    c = load_config(p, env=env, queue_ttl_s=9.0)
    assert (c.policy, c.max_queue_len, c.retry_after_s, c.queue_ttl_s, c.add_stream_usage) == (
        "priority", 7, 4, 9.0, True
    )  # fmt: skip
    assert [(b.url, b.api_key) for b in c.backends] == [("http://b1", "sk-up"), ("https://b2", "sk-up")]
    for bad, needle in [({"HEADWAY_MAX_QUEUE_LEN": "many"}, "HEADWAY_MAX_QUEUE_LEN='many' is not a valid int"),
                        ({"HEADWAY_ADD_STREAM_USAGE": "perhaps"}, "not a valid bool"),
                        ({"HEADWAY_BACKENDS": "[1,"}, "HEADWAY_BACKENDS is not a valid JSON list")]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(needle)):
            config_from_env(bad)
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    c = build_config(parser.parse_args(["serve", "--backend", "http://x"]), env={"HEADWAY_BACKEND_API_KEY": "k"})
    assert c.backends[0].api_key == "k" and c.backends[0].max_concurrency == 0 and c.backends[0].metrics_poll_s == 0.5


def test_startup_line_states_the_effective_config_as_json_logs(make_stub):
    stub = make_stub()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "headway.serve", "serve", "--backend", stub.url, "--port", str(port),
         "--log-format", "json", "--redis-lease", "3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**__import__("os").environ, "HEADWAY_BACKEND_API_KEY": "sk-secret", "HEADWAY_POLICY": "priority"},
    )  # fmt: skip
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1]
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line is a JSON object
    first = next(r for r in lines if "effective configuration" in r["message"])
    assert first["logger"] == "headway.serve" and first["level"] == "INFO"
    config = json.loads(first["message"].split("effective configuration: ", 1)[1])
    assert config["policy"] == "priority" and config["redis_lease_s"] == 3.0 and config["default_max_tokens"] == 0
    assert config["backends"] == [{"url": stub.url, "api_key": "set", "admission": "metrics every 0.5s",
                                   "max_waiting": 0, "max_kv_usage": 0.95}]  # fmt: skip
    assert "sk-secret" not in err
    assert any(r["logger"].startswith("uvicorn") for r in lines)  # uvicorn's own lines are JSON too


def test_headway_stub_subcommand():
    from headway.cli import build_parser

    args = build_parser().parse_args(["stub", "--port", "0", "--model", "m", "--token-delay", "0.01"])
    assert (args.port, args.model, args.token_delay) == (0, "m", 0.01) and callable(args.func)


def test_client_libraries_log_each_request_only_at_debug():
    """httpx logs every request at INFO: the backends' /metrics polls, twice a second each."""
    import logging

    from headway.serve._logging import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for level, shown in (("info", False), ("warning", False), ("debug", True)):
            setup_logging(level)
            for name in ("httpx", "httpcore"):
                chatty = logging.getLogger(name)
                assert chatty.isEnabledFor(logging.INFO) is shown, (level, name)
                assert chatty.isEnabledFor(logging.WARNING) is (level != "error")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_router_arg_sets_the_routers_settings(capsys):
    from headway.serve._cli import add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    base = ["serve", "--backend", "http://127.0.0.1:1", "--router", "cache-aware"]
    c = build_config(parser.parse_args([*base, "--router-arg", "balance_abs_threshold=16", "--router-arg",
                                        "cache_threshold=0.3"]), env={})  # fmt: skip
    assert c.router_args == {"balance_abs_threshold": 16, "cache_threshold": 0.3}
    assert main([*base, "--router-arg", "balance_abs_threshold=-1"]) == 2
    assert "router_args: cache-aware: balance_abs_threshold must be an int >= 0, got -1" in capsys.readouterr().err


def test_tenants_and_key_lists_from_the_environment_are_not_ignored():
    """HEADWAY_TENANTS was dropped without a word, and with it the API keys it turns on: every
    request went through as tenant 'default'. A list of hashes may be given bare, as in a file."""
    from headway.serve._config_load import config_from_env

    gold, admin = hash_api_key("sk-gold"), hash_api_key("sk-admin")
    env = {
        "HEADWAY_BACKENDS": "http://b1",
        "HEADWAY_TENANTS": json.dumps([{"name": "gold", "tier": "premium", "api_key_sha256": [gold]}]),
        "HEADWAY_ADMIN_API_KEY_SHA256": admin,
    }
    c = load_config(None, env=env)
    assert [(t.name, t.tier, t.api_key_sha256) for t in c.tenants] == [("gold", Tier.PREMIUM, (gold,))]
    assert c.auth_enabled and c.admin_api_key_sha256 == (admin,)
    assert config_from_env({"HEADWAY_ADMIN_API_KEY_SHA256": f"{admin}, {gold}"}) == {
        "admin_api_key_sha256": [admin, gold]
    }
    with pytest.raises(ConfigError, match=re.escape("HEADWAY_TENANTS is not a valid JSON list")):
        config_from_env({"HEADWAY_TENANTS": "gold"})
    with pytest.raises(ConfigError, match=re.escape("unknown tenant setting(s) ['weight']")):
        load_config(None, env={**env, "HEADWAY_TENANTS": '[{"name": "gold", "weight": 3}]'})


def test_client_send_timeout_comes_from_its_flag_or_the_environment():
    from headway.serve._cli import add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    base = ["serve", "--backend", "http://127.0.0.1:1"]
    assert build_config(parser.parse_args(base), env={}).client_send_timeout_s == 60.0
    assert build_config(parser.parse_args(base), env={"HEADWAY_CLIENT_SEND_TIMEOUT_S": "5"}).client_send_timeout_s == 5
    args = parser.parse_args([*base, "--client-send-timeout", "2.5"])
    assert build_config(args, env={"HEADWAY_CLIENT_SEND_TIMEOUT_S": "5"}).client_send_timeout_s == 2.5
