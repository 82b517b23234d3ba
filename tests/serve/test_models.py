"""The gateway warns when its backends serve different models (``headway.serve._models``): it
sends a request to any backend, so one there for a model that backend lacks gets a 404."""

from __future__ import annotations

import time

import pytest

from headway.serve import BackendConfig

from .conftest import wait_until


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "different models" in r.getMessage()]


def test_backends_serving_different_models_are_named_in_one_warning(make_stub, make_gateway, caplog):
    a, b = make_stub(model="llama"), make_stub(model="qwen")
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(a.url, metrics_poll_s=0.05), BackendConfig(b.url, metrics_poll_s=0.05)])
    wait_until(lambda: _warnings(caplog), what="the warning")
    time.sleep(0.3)  # later polls say it no more
    (warning,) = _warnings(caplog)
    assert f"{a.url}: llama" in warning and f"{b.url}: qwen" in warning
    assert "--served-model-name" in warning
    assert [bk.models for bk in gw.gateway.backends] == [("llama",), ("qwen",)]


def test_backends_serving_the_same_model_get_no_warning(make_stub, make_gateway, caplog):
    a, b = make_stub(model="llama"), make_stub(model="llama")
    caplog.set_level("INFO", logger="headway.serve")
    gw = make_gateway([BackendConfig(a.url, metrics_poll_s=0.05), BackendConfig(b.url, metrics_poll_s=0.05)])
    wait_until(lambda: all(bk.models == ("llama",) for bk in gw.gateway.backends), what="both read")
    time.sleep(0.2)
    assert _warnings(caplog) == []
