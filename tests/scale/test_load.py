"""Bounded load: requests at a fixed rate through a gateway process to a stub process;
every request gets exactly one terminal answer and none is lost.

``benchmarks/bench_load.py`` runs the full 10,000-request version."""

from __future__ import annotations

import httpx
import pytest

from harness.cluster import Cluster
from harness.loadtest import LoadConfig, gateway_counters, run_load_sync
from headway.serve import hash_api_key

KEYS = ("sk-load-a", "sk-load-b")
ADMIN = "sk-load-admin"


def load_gateway_config(stub_url: str) -> dict:
    return {
        "policy": "sjf-oracle",
        "max_queue_len": 30,
        "queue_ttl_s": 3.0,
        "max_body_bytes": 65536,
        "backends": [{"url": stub_url, "max_concurrency": 2}],
        "tenants": [
            {"name": "a", "tier": "premium", "api_key_sha256": [hash_api_key(KEYS[0])]},
            {"name": "b", "tier": "batch", "api_key_sha256": [hash_api_key(KEYS[1])]},
        ],
        "admin_api_key_sha256": [hash_api_key(ADMIN)],
    }


def check_every_request_answered_once(cluster: Cluster, stub_url: str, gw_url: str, res) -> dict:
    assert res.sent == res.answered + res.lost
    assert res.lost == 0, res.to_dict()
    # the gateway recorded exactly one terminal outcome per request
    c = gateway_counters(httpx.get(gw_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text)
    finished = sum(c["finished"].values())
    rejected = sum(c["rejections"].values())
    assert finished + rejected == res.sent, (c, res.to_dict())
    assert finished == res.outcomes["completed"]
    # the backend generated each completed request once (nothing dispatched twice)
    stats = httpx.get(stub_url + "/stub/stats").json()
    assert stats["completed"] == res.outcomes["completed"]
    assert stats["started"] == stats["completed"] + stats["aborted"]
    assert res.outcomes["http_400"] == res.kinds["invalid"]
    assert res.outcomes["http_401"] == res.kinds["bad_key"]
    assert res.outcomes["http_413"] == res.kinds["oversize"]
    return c


@pytest.mark.slow
def test_fixed_rate_load_every_request_gets_one_answer(cluster: Cluster):
    # the backend serves ~45 requests/s, under the arrival rate: the queue fills (429) and
    # requests time out in it (408) as well as completing
    stub = cluster.stub(token_delay_s=0.01)
    gw = cluster.gateway([], config=load_gateway_config(stub.url))
    cfg = LoadConfig(gw.url, num_requests=2000, rate=100.0, api_keys=KEYS, oversize_bytes=65536, seed=1)
    res = run_load_sync(cfg)
    print(res.to_dict())
    check_every_request_answered_once(cluster, stub.url, gw.url, res)
    assert res.outcomes["completed"] > 0.2 * res.sent
    assert res.outcomes["http_429"] > 0  # overload is refused, not lost


def test_gateway_counters_sum_over_tenants() -> None:
    text = "\n".join([
        "# HELP headway_requests_finished_total Requests completed successfully",
        'headway_requests_finished_total{tenant="a",tier="standard"} 3.0',
        'headway_requests_finished_total{tenant="b",tier="standard"} 4.0',
        'headway_requests_finished_total{tenant="c",tier="batch"} 1.0',
        'headway_rejections_total{reason="queue_full",tenant="a",tier="standard"} 2.0',
        'headway_rejections_total{reason="queue_full",tenant="c",tier="batch"} 1.0',
        'headway_rejections_total{reason="unauthorized",tenant="",tier=""} 1.0',
    ])
    assert gateway_counters(text) == {
        "finished": {"standard": 7.0, "batch": 1.0},
        "rejections": {"queue_full": 3.0, "unauthorized": 1.0},
    }


def test_a_load_run_cut_short_leaves_no_request_failing_on_a_closed_pool(cluster: Cluster) -> None:
    # Ctrl-C cancels run_load (asyncio.run): the requests still out are cancelled with it, not left to
    # fail on the closed client pool and be logged as "Task exception was never retrieved", once each
    import asyncio
    import gc

    from harness.loadtest import run_load

    stub = cluster.stub(token_delay_s=0.05)
    unretrieved: list[str] = []

    async def cut_short() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx["message"]))
        load = asyncio.create_task(run_load(LoadConfig(stub.url, num_requests=400, rate=200.0, seed=1)))
        await asyncio.sleep(1.0)  # requests are out, each streaming for a while
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load
        await asyncio.sleep(0.5)  # any request task left behind runs into the closed pool meanwhile
        gc.collect()  # an unretrieved task exception is reported when the task is collected

    asyncio.run(cut_short())
    assert unretrieved == []
