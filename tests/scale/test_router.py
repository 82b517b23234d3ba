"""The gateway routes dispatched requests with headway.routers routers (``--router``)."""

from __future__ import annotations

import argparse
import threading

import httpx
import pytest

from headway.routers import UnknownRouterError
from headway.serve import BackendConfig, GatewayConfig, StubConfig, create_app, create_stub_app, serve_in_thread
from headway.serve._cli import add_serve_parser, build_config


def _fire(url: str, n: int, max_tokens: int) -> list[int]:
    codes: list[int] = []

    def go() -> None:
        codes.append(httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": max_tokens}).status_code)

    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return codes


@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "least-tokens"])
def test_router_spreads_requests_over_backends(router):
    stubs = [create_stub_app(StubConfig(token_delay_s=0.01)) for _ in range(2)]
    with serve_in_thread(stubs[0]) as u0, serve_in_thread(stubs[1]) as u1:
        config = GatewayConfig(
            backends=(BackendConfig(u0, max_concurrency=8), BackendConfig(u1, max_concurrency=8)), router=router
        )
        app = create_app(config)
        assert app.state.gateway.dispatcher.router.name == router
        with serve_in_thread(app) as url:
            assert _fire(url, 8, 30) == [200] * 8
        started = [s.state.stub.stats.started for s in stubs]
        assert started == [4, 4], started  # each router balances equal, concurrent requests
        assert app.state.gateway.dispatcher.tracker.num_open == 0  # every route was released


def test_router_option_and_validation():
    p = argparse.ArgumentParser()
    add_serve_parser(p.add_subparsers())
    args = p.parse_args(["serve", "--backend", "http://127.0.0.1:1", "--router", "power-of-two"])
    assert build_config(args).router == "power-of-two"
    with pytest.raises(UnknownRouterError):
        GatewayConfig(backends=(BackendConfig("http://127.0.0.1:1"),), router="nope")
