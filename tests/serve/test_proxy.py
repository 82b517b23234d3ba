"""The gateway as a reverse proxy: what it tells its backends of the client (``X-Forwarded-*``),
hop-by-hop headers in both directions, one ``Server`` and ``Date`` in a passed-through answer, the
operator's bounds on what tenants may do (``min_priority``, ``passthrough``)."""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from headway.core import Tier
from headway.serve import BackendConfig, ConfigError, GatewayConfig, TenantConfig, hash_api_key, serve_in_thread
from headway.serve._config_load import config_from_env, load_config

from .test_dropin import _raw_request, _Recorder


@pytest.fixture
def recorder(servers) -> tuple[_Recorder, str]:
    rec = _Recorder()
    return rec, servers.enter_context(serve_in_thread(rec.app()))


def _sent(rec: _Recorder, path: str) -> list[dict[str, str]]:
    return [h for _, p, _, h, _ in rec.seen if p == path]


_CLAIMS = {
    "X-Forwarded-For": "203.0.113.66",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "bank.example",
    "Forwarded": "for=203.0.113.66;proto=https",
    "X-Real-IP": "203.0.113.66",
}
"""What a client may claim about itself: never passed on as the gateway's word."""


def test_a_client_cannot_claim_another_address_to_the_backends(recorder, make_gateway):
    """A client's X-Forwarded-For reached vLLM as sent (its uvicorn trusts it from 127.0.0.1, so the
    client chose the address in vLLM's logs); the backends now get the client's own address and
    scheme, from the gateway, on the scheduled path and the pass-through alike."""
    rec, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)])
    with gw.client(headers=_CLAIMS) as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "hi"}).status_code == 201
    for path in ("/v1/completions", "/v1/embeddings"):
        (h,) = _sent(rec, path)
        assert (h.get("x-forwarded-for"), h.get("x-forwarded-proto")) == ("127.0.0.1", "http"), (path, h)
        assert not {"x-forwarded-host", "forwarded", "x-real-ip"} & set(h), (path, h)


def test_a_trusted_proxy_names_the_client(recorder, make_gateway):
    """Behind a proxy named in forwarded_allow_ips, the client is the one that proxy forwards for."""
    rec, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)], forwarded_allow_ips=("127.0.0.1",))
    proxy = {"X-Forwarded-For": "198.51.100.9, 127.0.0.1", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "gw"}
    with gw.client(headers=proxy) as c:
        assert c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "hi"}).status_code == 201
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        (h,) = _sent(rec, path)
        assert (h.get("x-forwarded-for"), h.get("x-forwarded-proto")) == ("198.51.100.9", "https"), (path, h)
        assert "x-forwarded-host" not in h


def test_forwarded_allow_ips_is_a_list_of_addresses():
    backends = (BackendConfig("http://127.0.0.1:9", max_concurrency=1),)
    c = GatewayConfig(backends=backends, forwarded_allow_ips="10.0.0.0/8, ::1")  # type: ignore[arg-type]
    assert c.forwarded_allow_ips == ("10.0.0.0/8", "::1")
    assert GatewayConfig(backends=backends, forwarded_allow_ips=("*",)).forwarded_allow_ips == ("*",)
    with pytest.raises(ConfigError, match="forwarded_allow_ips must list IP addresses"):
        GatewayConfig(backends=backends, forwarded_allow_ips=("proxy.internal",))


def _hop_backend(servers) -> str:
    async def answer(request: HTTPRequest) -> Response:
        seen = sorted(k for k in request.headers if k.startswith("x-"))
        hop = {"Connection": "X-Hop", "X-Hop": "this connection's only", "X-Kept": "1"}
        return Response(json.dumps(seen), media_type="application/json", headers=hop)

    return servers.enter_context(serve_in_thread(Starlette(routes=[Route("/v1/{p:path}", answer, methods=["POST"])])))


def test_headers_a_connection_header_names_stay_on_that_connection(servers, make_gateway):
    """RFC 9110 section 7.6.1: the headers that ``Connection`` names are hop-by-hop. The pass-through
    forwarded them, both ways."""
    gw = make_gateway([BackendConfig(_hop_backend(servers), max_concurrency=1)])
    head = b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 2\r\nX-Secret: proxy-token\r\nX-Other: 1"
    out = _raw_request(gw.url, head.replace(b"\r\nX-Secret", b"\r\nConnection: X-Secret\r\nX-Secret"), b"{}")
    status, _, rest = out.partition(b"\r\n")
    head_out, _, body = rest.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200"), out
    assert b'["x-forwarded-for", "x-forwarded-proto", "x-other"]' in body, out  # x-secret stayed
    lines = head_out.lower().split(b"\r\n")
    assert b"x-kept: 1" in lines and not [h for h in lines if h.startswith(b"x-hop")], out


def test_a_passed_through_answer_has_one_server_and_one_date(recorder, make_gateway):
    """The backend's Server and Date came back beside the gateway's own: two of each."""
    _, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)])
    with gw.client() as c:
        r = c.post("/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 201 and r.headers["x-backend"] == "yes"
    assert len(r.headers.get_list("server")) == 1 and len(r.headers.get_list("date")) == 1, r.headers


# ------------------------------------------------------------------ min_priority
def _keyed(name: str, **kw: object) -> TenantConfig:
    return TenantConfig(name, api_key_sha256=(hash_api_key(f"k-{name}"),), **kw)  # type: ignore[arg-type]


def test_min_priority_bounds_what_a_tenant_may_ask_for(recorder, make_gateway):
    """With the priority policy any tenant could send priority -1000000 and run ahead of all others:
    a tenant's min_priority refuses anything more urgent (400 naming the field), and a request that
    gives none is queued at it."""
    rec, url = recorder
    tenants = (_keyed("low", min_priority=10), _keyed("free"), _keyed("vip", min_priority=-5))
    gw = make_gateway([BackendConfig(url, max_concurrency=1)], policy="priority", tenants=tenants, min_priority=0)

    def post(tenant: str, **body: object) -> httpx.Response:
        body = {"prompt": "hi", "max_tokens": 2, **body}
        return httpx.post(gw.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer k-{tenant}"})

    r = post("low", priority=-1_000_000)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "priority" and r.json()["error"]["code"] == "invalid_value"
    assert "at least 10" in r.json()["error"]["message"]
    assert post("low", priority=9).status_code == 400
    assert post("free", priority=-1).status_code == 400  # the gateway's min_priority, 0
    assert post("low", priority=10).status_code == 200
    assert post("low").status_code == 200  # none given: queued at 10
    assert post("free").status_code == 200  # none given: 0
    assert post("vip", priority=-5).status_code == 200
    assert [(q.tenant_id, q.priority) for q in gw.gateway.finished_requests] == [
        ("low", 10), ("low", 10), ("free", 0), ("vip", -5)
    ]  # fmt: skip
    # the body went upstream as it came (no priority added)
    assert [b for b in rec.generations() if b"priority" not in b] == [b'{"prompt":"hi","max_tokens":2}'] * 2


def test_min_priority_without_tenants(recorder, make_gateway):
    _, url = recorder
    gw = make_gateway([BackendConfig(url, max_concurrency=1)], policy="priority", min_priority=-3)
    with gw.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "priority": -4})
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
        assert c.post("/v1/completions", json={"prompt": "x", "priority": -3}).status_code == 200


def test_min_priority_in_the_config_the_environment_and_redis_records():
    c = load_config(None, env={
        "HEADWAY_BACKENDS": "http://127.0.0.1:9",
        "HEADWAY_MIN_PRIORITY": "2",
        "HEADWAY_TENANTS": json.dumps([{"name": "a", "api_key_sha256": [hash_api_key("k")], "min_priority": -1}]),
    }, backends=[BackendConfig("http://127.0.0.1:9", max_concurrency=1)])  # fmt: skip
    assert c.min_priority == 2 and c.tenants[0].min_priority == -1
    assert config_from_env({"HEADWAY_MIN_PRIORITY": "-7"}) == {"min_priority": -7}
    for bad in ("1.5", True, 2**60):
        with pytest.raises(ConfigError, match=r"min_priority.? must be an integer"):
            load_config(None, backends=["http://127.0.0.1:9"], tenants=[{"name": "a", "min_priority": bad}])

    from headway.serve._tenants import Identity, TenantDirectory

    records = {
        hash_api_key("r1"): b'{"tenant": "r1", "min_priority": 4}',
        hash_api_key("r2"): b'{"tenant": "r2", "tier": "batch"}',
        hash_api_key("r3"): b'{"tenant": "r3", "min_priority": "high"}',
    }

    class _Redis:
        async def hget(self, name: str, key: str) -> bytes | None:
            return records.get(key)

    backends = (BackendConfig("http://127.0.0.1:9", max_concurrency=1),)
    config = GatewayConfig(backends=backends, api_keys="required", redis_url="redis://x", min_priority=1,
                           tenants=(_keyed("t"),))  # fmt: skip
    tenants = TenantDirectory(config, _Redis())

    async def main() -> list[Identity | None]:
        return [await tenants.resolve(f"Bearer {k}") for k in ("r1", "r2", "r3", "k-t")]

    assert asyncio.run(main()) == [
        Identity("r1", Tier.STANDARD, 4), Identity("r2", Tier.BATCH, 1), None, Identity("t", Tier.STANDARD, 1)
    ]  # fmt: skip


# ------------------------------------------------------------------ passthrough
def test_the_operator_limits_or_turns_off_the_pass_through(recorder, make_gateway):
    """Every other /v1 endpoint went to the backends unscheduled, with no way to turn it off."""
    rec, url = recorder
    off = make_gateway([BackendConfig(url, max_concurrency=1)], passthrough=("none",))
    with off.client() as c:
        r = c.post("/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    assert not _sent(rec, "/v1/embeddings")
    some = make_gateway([BackendConfig(url, max_concurrency=1)], passthrough="/v1/embeddings,/v1/files/")  # type: ignore[arg-type]
    with some.client() as c:
        paths = ("/v1/embeddings", "/v1/files/f1", "/v1/files", "/v1/filesystem", "/v1/responses", "/v1/embed")
        codes = {p: c.post(p, json={}).status_code for p in paths}
    assert codes == {"/v1/embeddings": 201, "/v1/files/f1": 201, "/v1/files": 201, "/v1/filesystem": 404,
                     "/v1/responses": 404, "/v1/embed": 404}  # fmt: skip


def test_passthrough_setting_and_flag():
    from headway.serve._cli import add_serve_parser, build_config

    backends = (BackendConfig("http://127.0.0.1:9", max_concurrency=1),)
    assert GatewayConfig(backends=backends).passthrough == ("all",)
    assert GatewayConfig(backends=backends, passthrough=()).passthrough == ("none",)
    for bad in ("/v2/embeddings", "embeddings", "/v1/../sleep", "all,/v1/embeddings"):
        with pytest.raises(ConfigError, match="passthrough must be 'all', 'none' or paths under /v1"):
            GatewayConfig(backends=backends, passthrough=bad)  # type: ignore[arg-type]
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--backend", "http://127.0.0.1:1", "--passthrough", "/v1/embeddings",
                              "--forwarded-allow-ips", "10.0.0.1,10.0.1.0/24"])  # fmt: skip
    c = build_config(args, env={})
    assert c.passthrough == ("/v1/embeddings",) and c.forwarded_allow_ips == ("10.0.0.1", "10.0.1.0/24")
    assert build_config(parser.parse_args(["serve", "--backend", "http://127.0.0.1:1", "--passthrough", "none"]),
                        env={"HEADWAY_PASSTHROUGH": "/v1/files"}).passthrough == ("none",)  # fmt: skip
    for flag in ("--passthrough", "--forwarded-allow-ips"):  # ('' turned the pass-through off, silently)
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--backend", "http://127.0.0.1:1", flag, " "])


@pytest.mark.redis
def test_min_priority_of_a_key_kept_in_redis(redis_url, make_stub, make_gateway):
    import uuid

    import redis

    key = f"sk-{uuid.uuid4().hex}"
    record = {"tenant": "blue", "tier": "batch", "min_priority": 5}
    redis.Redis.from_url(redis_url).hset("headway:apikeys", hash_api_key(key), json.dumps(record))
    gw = make_gateway([make_stub().url], policy="priority", redis_url=redis_url, api_keys="required",
                      redis_prefix=f"t{uuid.uuid4().hex[:6]}:")  # fmt: skip
    with gw.client(headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "priority": -1_000_000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    assert [(q.tenant_id, q.priority) for q in gw.gateway.finished_requests] == [("blue", 5)]
