"""Fuzzing: the gateway's HTTP API from its OpenAPI schema (schemathesis) and the
config/trace loaders (hypothesis). No 5xx, no crash, clear 4xx errors."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway.core import Tier
from headway.serve import (
    BackendConfig,
    ConfigError,
    GatewayConfig,
    StubConfig,
    TenantConfig,
    create_app,
    create_stub_app,
    hash_api_key,
    load_config,
    serve_in_thread,
)
from headway.serve._config_load import config_from_dict
from headway.serve._openapi import openapi_schema

KEY = "sk-fuzz-1"


def fuzz_config(stub_url: str = "http://127.0.0.1:9") -> GatewayConfig:
    return GatewayConfig(
        backends=(BackendConfig(stub_url, max_concurrency=8),),
        tenants=(TenantConfig("fuzz", Tier.STANDARD, (hash_api_key(KEY),)),),
        max_tokens_limit=64,
        max_body_bytes=65536,
        queue_ttl_s=10.0,
    )


schema = schemathesis.openapi.from_dict(openapi_schema(fuzz_config()))


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    stub = create_stub_app(StubConfig())
    with serve_in_thread(stub) as stub_url:
        app = create_app(fuzz_config(stub_url))
        with serve_in_thread(app) as url:
            yield url


def test_openapi_document_is_served(gateway_url):
    doc = httpx.get(gateway_url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/v1/completions" in doc["paths"]


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_fuzz_no_server_errors(case, gateway_url):
    # half the cases carry the tenant's key, so generation gets past authentication
    headers = {"Authorization": f"Bearer {KEY}"} if hash(repr(case.body)) % 2 == 0 else None
    response = case.call(base_url=gateway_url, headers=headers, timeout=30)
    assert response.status_code < 500, (case.operation.label, case.body, response.status_code, response.text[:300])
    if (response.status_code >= 400 and response.status_code != 404) or (
        response.status_code == 404 and case.operation.path.startswith("/v1/requests")
    ):
        err = response.json()["error"]  # a clear OpenAI-style error body
        assert err["message"] and err["type"]
    case.validate_response(
        response,
        checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.specs.openapi.checks.status_code_conformance,
            schemathesis.specs.openapi.checks.content_type_conformance,
        ],
    )


# --------------------------------------------------------------------- loaders
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(string.ascii_lowercase + "_", max_size=12), children, max_size=4),
    ),
    max_leaves=20,
)
_gateway_fields = sorted(set(GatewayConfig.__dataclass_fields__) - {"backends", "tenants"})
_backend = st.dictionaries(st.sampled_from(sorted(BackendConfig.__dataclass_fields__)), _json, max_size=4).map(
    lambda d: {"url": "http://127.0.0.1:1", **d}
)
_tenant = st.dictionaries(st.sampled_from(sorted(TenantConfig.__dataclass_fields__)), _json, max_size=3)
_config_dicts = st.fixed_dictionaries(
    {"backends": st.one_of(st.lists(_backend, min_size=1, max_size=2), _json)},
    optional={"tenants": st.one_of(st.lists(_tenant, max_size=2), _json)},
).flatmap(
    lambda base: st.dictionaries(st.sampled_from(_gateway_fields), _json, max_size=5).map(lambda d: {**base, **d})
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_config_dicts)
def test_config_from_dict_fuzz_raises_only_config_errors(data):
    try:
        config_from_dict(data)
    except ConfigError as exc:
        assert str(exc)  # a message naming the problem
    except ValueError as exc:  # UnknownPolicyError / UnknownRouterError are ValueErrors with a clear message
        assert str(exc)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    raw=st.one_of(st.binary(max_size=200), _config_dicts.map(lambda d: json.dumps(d).encode())),
    suffix=st.sampled_from([".toml", ".json"]),
)
def test_load_config_file_fuzz(tmp_path: Path, raw: bytes, suffix: str):
    p = tmp_path / f"gw{suffix}"
    p.write_bytes(raw)
    try:
        load_config(p)
    except ValueError as exc:  # ConfigError and friends
        assert str(exc)


# ------------------------------------------------------------------ trace readers
_cells = st.one_of(st.integers(-5, 10**6).map(str), st.floats().map(str), st.text(max_size=6))


def _csv(header: list[str]) -> st.SearchStrategy[bytes]:
    row = st.lists(_cells, min_size=len(header) - 1, max_size=len(header) + 1).map(lambda r: ",".join(r))
    return st.lists(row, max_size=6).map(lambda rows: "\n".join([",".join(header), *rows]).encode())


_jsonl = st.lists(
    st.dictionaries(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]), _json, max_size=4),
    max_size=5,
).map(lambda recs: "\n".join(json.dumps(r) for r in recs).encode())
_speaker = st.sampled_from(["human", "gpt", "x"])
_sharegpt = st.lists(
    st.dictionaries(
        st.sampled_from(["id", "conversations"]),
        st.one_of(
            _json,
            st.lists(
                st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "x"]), "value": _json}), max_size=3
            ),
        ),
        max_size=2,
    ),
    max_size=3,
).map(lambda recs: json.dumps(recs).encode())


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    which=st.sampled_from(["azure", "vidur", "mooncake", "sharegpt"]),
    raw=st.one_of(
        st.binary(max_size=120),
        _csv(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
        _csv(["arrived_at", "num_prefill_tokens", "num_decode_tokens"]),
        _jsonl,
        _sharegpt,
    ),
)
def test_trace_readers_fuzz_raise_only_format_errors(tmp_path: Path, which: str, raw: bytes):
    from headway.workload import read_azure_trace, read_mooncake_trace, read_sharegpt, read_vidur_trace

    reader, suffix = {
        "azure": (read_azure_trace, ".csv"),
        "vidur": (read_vidur_trace, ".csv"),
        "mooncake": (read_mooncake_trace, ".jsonl"),
        "sharegpt": (read_sharegpt, ".json"),
    }[which]
    p = tmp_path / f"trace{suffix}"
    p.write_bytes(raw)
    try:
        w = reader(p)
    except ValueError as exc:  # WorkloadFormatError names the file, line and field
        assert str(exc)
    else:
        assert all(r.num_prompt_tokens >= 0 and r.num_output_tokens >= 0 for r in w.requests)
