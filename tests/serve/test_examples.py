"""The operator's examples: examples/gateway.toml loads, and every query of
examples/grafana-dashboard.json names a metric the gateway exports; TTFT/E2E histograms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from headway.serve import BackendConfig, GatewayConfig, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_METRIC = re.compile(r"\b(headway_[a-z0-9_]+)\b")


def test_example_config_loads_and_lists_every_setting():
    c = load_config(EXAMPLES / "gateway.toml")
    assert [b.url for b in c.backends] == ["http://127.0.0.1:8001", "https://vllm-2.internal:8443"]
    assert (c.backends[0].max_concurrency, c.backends[0].metrics_poll_s) == (0, 0.5)
    assert c.backends[1].api_key == "change-me" and c.auth_enabled
    text = (EXAMPLES / "gateway.toml").read_text()
    shown = set(re.findall(r"^(?:# )?([a-z_0-9]+) =", text, re.M))  # commented out: no value by default
    top = set(GatewayConfig.__dataclass_fields__) - {"backends", "tenants"}
    assert top <= shown, sorted(top - shown)  # every top-level setting is in the file
    # the values the file gives are the defaults (its backends and tenants are the examples)
    defaults = GatewayConfig(backends=(BackendConfig("http://x"),))
    for name in top:
        assert getattr(c, name) == getattr(defaults, name), name

def _exported(url: str) -> set[str]:
    """The sample names of every metric the gateway's /metrics declares (also one with no series
    yet, such as an empty queue's length or a retry counter before any retry)."""
    suffixes = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    fams = list(text_string_to_metric_families(httpx.get(url + "/metrics").text))
    declared = {f.name + end for f in fams for end in suffixes.get(f.type, ("",))}
    return declared | {s.name for f in fams for s in f.samples}


def test_every_dashboard_query_names_an_exported_metric(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)], scorer="headway.serve._stub:prompt_length_scores")
    with gw.client() as c:  # one streamed and one plain request, so that every labelled series exists
        assert c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}).status_code == 200
        body = {"model": "m", "prompt": "y", "max_tokens": 3, "stream": True, "priority": 2}
        assert c.post("/v1/completions", json=body).status_code == 200
        assert c.post("/v1/completions", content=b"{nope").status_code == 400  # a rejection
    exported = _exported(gw.url)
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 9
    named: set[str] = set()
    for expr in exprs:
        metrics = set(_METRIC.findall(expr))
        assert metrics, f"query names no headway metric: {expr}"
        assert metrics <= exported, (expr, sorted(metrics - exported))
        named |= metrics
    assert {"headway_time_to_first_token_seconds_bucket", "headway_e2e_request_latency_seconds_bucket"} <= named


def test_every_metric_the_documentation_names_is_exported(make_stub, make_gateway):
    # a series as the docs spell it in code: a counter with its _total, a histogram by its name
    # or one of its samples' (a DriftSched policy, for its runtime bias)
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)], policy="tenant-sjf")
    with gw.client() as c:
        assert c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}).status_code == 200
    fams = list(text_string_to_metric_families(httpx.get(gw.url + "/metrics").text))
    names = {
        "gauge": ("",), "counter": ("_total",), "histogram": ("", "_bucket", "_sum", "_count")
    }  # fmt: skip
    exported = {f.name + end for f in fams for end in names.get(f.type, ("",))}
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = [docs.parent / "README.md", *docs.glob("*.md"), *docs.glob("policies/*.md")]
    named = {
        (page.name, m)
        for page in pages
        if page.name != "changelog.md"  # the changelog keeps the names of its time
        for m in re.findall(r"`(headway_[a-z0-9_]+)", page.read_text(encoding="utf-8"))
    }
    assert len(named) >= 10
    assert sorted((page, m) for page, m in named if m not in exported) == []


def test_ttft_and_e2e_histograms_by_model_and_priority(make_stub, make_gateway):
    stub = make_stub()
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)])
    with gw.client() as c:
        for model, prio, stream in [("m1", 0, True), ("m1", 0, False), ("m2", 5, True)]:
            body = {"model": model, "prompt": "x", "max_tokens": 2, "stream": stream, "priority": prio}
            assert c.post("/v1/completions", json=body).status_code == 200
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(gw.url + "/metrics").text)}
    counts = {
        (name, s.labels["model"], s.labels["priority"]): s.value
        for name in ("headway_time_to_first_token_seconds", "headway_e2e_request_latency_seconds")
        for s in fams[name].samples
        if s.name.endswith("_count")
    }
    assert counts == {
        ("headway_time_to_first_token_seconds", "m1", "0"): 1.0,  # the plain answer has no TTFT
        ("headway_time_to_first_token_seconds", "m2", "5"): 1.0,
        ("headway_e2e_request_latency_seconds", "m1", "0"): 2.0,
        ("headway_e2e_request_latency_seconds", "m2", "5"): 1.0,
    }


def test_latency_histograms_by_tenant_and_tier_and_a_tenant_reads_its_own(make_stub, make_gateway):
    """Per-tier latency is what a multi-tenant SLO is judged on; a tenant's key reads its own latency."""
    from headway.core import Tier
    from headway.serve import TenantConfig, hash_api_key

    stub = make_stub()
    tenants = (TenantConfig("acme", Tier.PREMIUM, (hash_api_key("ka"),)),
               TenantConfig("bulk", Tier.BATCH, (hash_api_key("kb"),)))  # fmt: skip
    gw = make_gateway([BackendConfig(stub.url, max_concurrency=2)], tenants=tenants,
                      admin_api_key_sha256=(hash_api_key("adm"),))  # fmt: skip
    with gw.client() as c:
        for key, n in (("ka", 2), ("kb", 1)):
            for _ in range(n):
                body = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True}
                r = c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200

    def counts(key: str) -> dict[tuple[str, str, str], float]:
        text = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {key}"}).text
        return {
            (f.name, s.labels["tenant"], s.labels["tier"]): s.value
            for f in text_string_to_metric_families(text)
            if f.name in ("headway_time_to_first_token_seconds", "headway_e2e_request_latency_seconds")
            for s in f.samples
            if s.name.endswith("_count")
        }

    acme = {(name, "acme", "premium"): 2.0 for name in ("headway_time_to_first_token_seconds",
                                                          "headway_e2e_request_latency_seconds")}  # fmt: skip
    bulk = {(name, "bulk", "batch"): 1.0 for name in ("headway_time_to_first_token_seconds",
                                                        "headway_e2e_request_latency_seconds")}  # fmt: skip
    assert counts("adm") == {**acme, **bulk}
    assert counts("ka") == acme and counts("kb") == bulk


def test_client_chosen_label_values_are_bounded():
    from headway.serve._metrics import MAX_LABEL_VALUES, GatewayMetrics

    m = GatewayMetrics(list, list)
    for i in range(MAX_LABEL_VALUES + 10):
        m.observe_latency(f"model-{i}", i, 1.0, None)
    models = {s.labels["model"] for s in m.e2e.collect()[0].samples if s.name.endswith("_count")}
    assert len(models) == MAX_LABEL_VALUES + 1 and "other" in models
