"""Config files, validation messages, the CLI and SIGTERM draining."""

from __future__ import annotations

import json
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
    assert load_config(j).backends[0].max_concurrency == 8


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"backends": []}, "at least one backend"),
        ({"backends": ["ftp://x"]}, "'ftp://x'"),
        ({"backends": [{"url": "http://a", "max_concurrency": -1}]}, "max_concurrency must be >= 0, got -1"),
        ({"backends": [{"url": "http://a", "max_concurrency": 0}]}, "needs max_concurrency > 0"),
        ({"backends": ["http://a"], "queue_ttl_s": 0}, "queue_ttl_s must be > 0, got 0"),
        ({"backends": ["http://a"], "max_queue_len": 0}, "max_queue_len must be >= 1, got 0"),
        ({"backends": ["http://a"], "scorer_hold_s": -1}, "scorer_hold_s must be >= 0, got -1"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_threads": 0}, "scorer_threads must be >= 1, got 0"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_threads": "2"}, "'scorer_threads' must be an integer"),
        ({"backends": ["http://a"], "scorer": "default", "scorer_max_length": 4}, "must be >= 8 tokens, got 4"),
        ({"backends": ["http://a"], "scorer": "m:f", "scorer_max_length": 64}, "only to a trained predictor"),
        ({"backends": ["http://a"], "scorer": "defaults:f", "scorer_threads": 1}, "only to a trained predictor"),
        ({"backends": ["http://a"], "scorer": "no-such-dir"}, "a predictor checkpoint directory or 'module:callable'"),
        ({"backends": ["http://a"], "bogus": 1}, "unknown gateway setting(s) ['bogus']"),
        ({"backends": ["http://a"], "redis_url": "http://r"}, "redis_url must start with"),
        ({"backends": ["http://a"], "tenants": [{"name": "t", "api_key_sha256": ["abc"]}]}, "64 hex digits"),
        ({"backends": ["http://a"], "tenants": [{"name": "t", "tier": "gold"}]}, "unknown tier 'gold'"),
    ],
)
def test_validation_names_the_bad_value(tmp_path, data, needle):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_config(p)
    assert needle in str(info.value)


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
    assert "Unknown policy 'nope'" in capsys.readouterr().err


def test_sigterm_drains_inflight_and_queued_work():
    """SIGTERM: stop accepting, finish running and queued requests, exit."""
    stub_app = create_stub_app(StubConfig(token_delay_s=0.02))
    with serve_in_thread(stub_app) as stub_url:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway.serve", "serve", "--backend", stub_url, "--port", str(port),
             "--backend-concurrency", "1", "--drain-timeout", "10", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.05)
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
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_cli_parsers_build_and_map_to_config():
    import argparse

    from headway.serve._cli import add_bench_parser, add_serve_parser, build_config

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_serve_parser(sub)
    add_bench_parser(sub)
    args = parser.parse_args(
        ["serve", "--backend", "http://127.0.0.1:1", "--backend", "http://127.0.0.1:2", "--policy", "pars",
         "--policy-arg", "tau=0.9", "--policy-arg", "scorer=noisy-oracle", "--backend-concurrency", "3",
         "--queue-ttl", "7", "--api-keys", "off", "--scorer-hold", "0.25", "--scorer", "default:onnx-int8",
         "--scorer-threads", "2", "--scorer-max-length", "64", "--scorer-batch-size", "8", "--scorer-process"]
    )  # fmt: skip
    c = build_config(args)
    assert c.scorer_hold_s == 0.25
    assert (c.scorer, c.scorer_threads, c.scorer_max_length) == ("default:onnx-int8", 2, 64)
    assert c.scorer_batch_size == 8 and c.scorer_process
    plain = build_config(parser.parse_args(["serve", "--backend", "http://127.0.0.1:1"]))
    assert not plain.scorer_process  # off unless asked for
    assert [b.max_concurrency for b in c.backends] == [3, 3]
    assert c.policy_args == {"tau": 0.9, "scorer": "noisy-oracle"} and c.queue_ttl_s == 7
    assert not c.auth_enabled
    b = parser.parse_args(["bench", "serve", "--endpoint", "http://x", "--workload", "burst", "--tenant-key", "a=k"])
    assert b.tenant_key == [("a", "k")] and callable(b.func)
