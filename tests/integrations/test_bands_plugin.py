"""``bands`` in the vLLM plugin's queue (PolicyAdapter driven by the fake engine, no vLLM):
the same composition as in the simulator and the gateway."""

from __future__ import annotations

from types import SimpleNamespace

from headway.core import make_policy
from integrations._fake import FakeEngine, FakeRequest


def test_bands_order_in_the_plugin() -> None:
    eng = FakeEngine(make_policy("bands", inner="sjf-oracle"), max_num_seqs=1, oracle="max_tokens")
    sends = [("block", "a", 0, 50), ("a5", "a", 1, 5), ("a30", "a", 0, 30), ("a20", "a", 0, 20),
             ("a10", "a", 0, 10), ("b40", "b", 0, 40), ("b2", "b", 1, 2)]  # fmt: skip
    for i, (rid, tenant, priority, n) in enumerate(sends):
        req = FakeRequest(rid, 1000.0 + i * 1e-6, 16, n, priority=priority)
        req.sampling_params = SimpleNamespace(extra_args={"headway_tenant": tenant}, ignore_eos=True)
        eng.add(req)
    eng.run()
    # all queued at once: band 0 first, tenants taking turns (a, then b), shortest first in each flow
    assert eng.started == ["a10", "b40", "a20", "a30", "block", "b2", "a5"]
