"""Security: tenant isolation, API keys never logged, request size limits."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest

from harness.cluster import Cluster, wait_for
from headway.core import Tier
from headway.serve import (
    BackendConfig,
    GatewayConfig,
    StubConfig,
    TenantConfig,
    create_app,
    create_stub_app,
    hash_api_key,
    serve_in_thread,
)

ACME, BULK, ADMIN = "sk-acme-7f3a9c", "sk-bulk-2b8e41", "sk-admin-c0ffee"
H_ACME = {"Authorization": f"Bearer {ACME}"}
H_BULK = {"Authorization": f"Bearer {BULK}"}
TENANTS = (
    TenantConfig("acme", Tier.PREMIUM, (hash_api_key(ACME),)),
    TenantConfig("bulk", Tier.BATCH, (hash_api_key(BULK),)),
)


@pytest.fixture
def gw() -> Iterator[tuple[str, object]]:
    stub = create_stub_app(StubConfig(token_delay_s=0.01))
    with serve_in_thread(stub) as stub_url:
        config = GatewayConfig(
            backends=(BackendConfig(stub_url, max_concurrency=1),),
            tenants=TENANTS,
            admin_api_key_sha256=(hash_api_key(ADMIN),),
            max_body_bytes=4096,
            max_tokens_limit=5000,
        )
        app = create_app(config)
        with serve_in_thread(app) as url:
            yield url, app.state.gateway


def _post_thread(url: str, body: dict, headers: dict, out: list) -> threading.Thread:
    def go() -> None:
        out.append(httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30))

    t = threading.Thread(target=go)
    t.start()
    return t


def test_a_tenant_cannot_see_or_cancel_another_tenants_requests(gw):
    url, gateway = gw
    with (
        httpx.Client(base_url=url, timeout=30) as c,
        c.stream(
            "POST", "/v1/completions", json={"prompt": "a", "max_tokens": 3000, "stream": True}, headers=H_ACME
        ) as running,
    ):
        acme_running = running.headers["x-request-id"]
        out: list[httpx.Response] = []
        t = _post_thread(url, {"prompt": "q", "max_tokens": 2}, H_ACME, out)
        wait_until_queued = [None]

        def queued_id() -> bool:
            ids = [k for k, a in gateway.active.items() if k != acme_running]
            wait_until_queued[0] = ids[0] if ids else None
            return bool(ids)

        wait_for(queued_id, what="acme request queued")
        acme_queued = wait_until_queued[0]
        missing = c.get("/v1/requests/hw-999999", headers=H_BULK)
        assert missing.status_code == 404
        for rid in (acme_running, acme_queued):
            seen = c.get(f"/v1/requests/{rid}", headers=H_BULK)
            assert seen.status_code == 404 and seen.json()["error"]["code"] == missing.json()["error"]["code"]
            assert "acme" not in seen.text
            assert c.delete(f"/v1/requests/{rid}", headers=H_BULK).status_code == 404
            assert c.get(f"/v1/requests/{rid}").status_code == 401  # no key
        # the owner sees and cancels its own
        assert c.get(f"/v1/requests/{acme_running}", headers=H_ACME).json()["status"] == "running"
        assert c.get(f"/v1/requests/{acme_queued}", headers=H_ACME).json()["status"] == "queued"
        assert c.delete(f"/v1/requests/{acme_queued}", headers=H_ACME).json()["cancelled"] is True
        t.join(10)
        assert out[0].status_code == 499 and out[0].json()["error"]["code"] == "cancelled"
        assert c.get(f"/v1/requests/{acme_queued}", headers=H_ACME).json()["status"] == "cancelled"
        assert c.delete(f"/v1/requests/{acme_queued}", headers=H_ACME).status_code == 409
        assert c.get(f"/v1/requests/{acme_queued}", headers=H_BULK).status_code == 404
        # cancelling a running stream ends it with an error event
        assert c.delete(f"/v1/requests/{acme_running}", headers=H_ACME).status_code == 200
        lines = [ln for ln in running.iter_lines() if ln.startswith("data: ")]
        err = json.loads(lines[-2][6:])["error"]
        assert (err["type"], err["code"]) == ("cancelled", "cancelled") and lines[-1] == "data: [DONE]"


def test_metrics_show_a_tenant_only_its_own_labels(gw):
    url, gateway = gw
    out: list[httpx.Response] = []
    threads = [_post_thread(url, {"prompt": "x", "max_tokens": 300}, H_BULK, out)]
    wait_for(lambda: gateway.backends[0].in_flight == 1, what="one running")
    threads += [_post_thread(url, {"prompt": "x", "max_tokens": 300}, h, out) for h in (H_ACME, H_BULK)]
    wait_for(lambda: len(gateway.dispatcher.queue) == 2, what="one queued per tenant")
    with httpx.Client(base_url=url, timeout=10) as c:
        bulk = c.get("/metrics", headers=H_BULK)
        acme = c.get("/metrics", headers=H_ACME)
        admin = c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
        anonymous = c.get("/metrics")
        wrong = c.get("/metrics", headers={"Authorization": "Bearer sk-wrong"})
    for t in threads:
        t.join(30)
    assert anonymous.status_code == wrong.status_code == 401
    assert 'headway_queue_length{tenant="bulk",tier="batch"} 1.0' in bulk.text
    assert 'headway_queue_length{tenant="acme",tier="premium"} 1.0' in acme.text
    for text, own, other in ((bulk.text, "bulk", "acme"), (acme.text, "acme", "bulk")):
        assert other not in text
        for line in text.splitlines():
            if not line.startswith("#"):
                assert f'tenant="{own}"' in line, line  # nothing without its own tenant label
    assert 'tenant="acme"' in admin.text and 'tenant="bulk"' in admin.text and "headway_backend_in_flight" in admin.text
    # once served, a tenant also reads its own waits and completions, and nothing of the other's
    after = httpx.get(url + "/metrics", headers=H_BULK, timeout=10).text
    assert 'headway_requests_finished_total{tenant="bulk",tier="batch"} 2.0' in after
    assert 'headway_queue_wait_seconds_count{tenant="bulk",tier="batch"} 2.0' in after
    assert "acme" not in after


def test_health_counts_the_queue_only_for_the_admin(gw):
    url, gateway = gw
    out: list[httpx.Response] = []
    threads = [_post_thread(url, {"prompt": "x", "max_tokens": 300}, H_BULK, out)]
    wait_for(lambda: gateway.backends[0].in_flight == 1, what="one running")
    threads.append(_post_thread(url, {"prompt": "x", "max_tokens": 300}, H_ACME, out))
    wait_for(lambda: len(gateway.dispatcher.queue) == 1, what="one queued")
    with httpx.Client(base_url=url, timeout=10) as c:
        anonymous = c.get("/health")
        tenant = c.get("/health", headers=H_ACME)
        admin = c.get("/health", headers={"Authorization": f"Bearer {ADMIN}"})
    for t in threads:
        t.join(30)
    assert anonymous.status_code == tenant.status_code == admin.status_code == 200  # probes need no key
    assert anonymous.json() == tenant.json() == {"status": "ok"}
    assert admin.json() == {"status": "ok", "queued": 1}


def test_api_keys_never_logged(tmp_path, caplog):
    """In-process (caplog at DEBUG) and a gateway process with the uvicorn access log on."""
    caplog.set_level(logging.DEBUG)
    stub = create_stub_app(StubConfig())
    keys = [ACME, BULK, ADMIN, "sk-wrong-5d1e0f"]
    with serve_in_thread(stub) as stub_url:
        cluster = Cluster(tmp_path)
        try:
            dead = "http://127.0.0.1:9"  # refused: the retry warning path logs too
            conf = {
                "backends": [{"url": dead, "max_concurrency": 1}, {"url": stub_url, "max_concurrency": 2}],
                "tenants": [{"name": t.name, "tier": "standard", "api_key_sha256": list(t.api_key_sha256)}
                            for t in TENANTS],
                "admin_api_key_sha256": [hash_api_key(ADMIN)],
                "max_body_bytes": 4096,
            }  # fmt: skip
            proc = cluster.gateway([], "--access-log", "--log-level", "debug", config=conf)
            in_proc = create_app(
                GatewayConfig(
                    backends=(BackendConfig(dead, max_concurrency=1), BackendConfig(stub_url, max_concurrency=2)),
                    tenants=TENANTS,
                    admin_api_key_sha256=(hash_api_key(ADMIN),),
                    max_body_bytes=4096,
                )
            )
            with serve_in_thread(in_proc, log_level="debug") as in_url:
                for base in (proc.url, in_url):
                    with httpx.Client(base_url=base, timeout=20) as c:
                        for k in keys:
                            h = {"Authorization": f"Bearer {k}"}
                            c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=h)
                            c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True}, headers=h)
                            c.post("/v1/completions", content=b"{not json", headers=h)
                            c.post("/v1/completions", content=b"x" * 5000, headers=h)
                            c.get("/metrics", headers=h)
                            c.get("/v1/models", headers=h)
                            c.get("/v1/requests/hw-1", headers=h)
                            c.delete("/v1/requests/hw-1", headers=h)
                            c.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": k})  # no scheme
            proc.stop()
            logs = proc.log_text()
        finally:
            cluster.close()
    assert '"POST /v1/completions HTTP/1.1" 200' in logs  # the access log was on
    captured = caplog.text + "\n".join(str(r.args) for r in caplog.records)
    for k in keys:
        assert k not in logs
        assert k not in captured


def test_request_size_limits(gw):
    url, _ = gw
    h = H_ACME
    with httpx.Client(base_url=url, timeout=20) as c:
        # declared too large: refused before reading
        r = c.post("/v1/completions", content=b"x" * 5000, headers={**h, "Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        # chunked, no Content-Length: refused once the limit is crossed
        def chunks() -> Iterator[bytes]:
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = c.post("/v1/completions", content=chunks(), headers=h)
        assert r.status_code == 413
        # an oversized header block is refused by the HTTP server, not a 5xx
        try:
            r = c.post("/v1/completions", json={"prompt": "x"}, headers={**h, "X-Big": "z" * 200_000})
            assert 400 <= r.status_code < 500
        except httpx.RemoteProtocolError:
            pass  # h11 closes the connection: also a refusal
        # within the byte limit but absurd: deep nesting, huge max_tokens
        r = c.post("/v1/completions", content=b"[" * 4000, headers=h)
        assert r.status_code == 400
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 10**9}, headers=h)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=h)
        assert r.status_code == 200  # still serving
