"""Approximate prefix hashes of prompt text, and prefix-aware routing at the gateway (stub backends)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.serve._prefix_hash import BLOCK_CHARS, HASH_BLOCK_TOKENS, prefix_block_hashes
from headway.serve._wire import estimate_tokens

from .conftest import wait_until

TEXT = st.text(alphabet="ab\u00e9\U0001f600\ud800", max_size=6 * BLOCK_CHARS)  # a lone surrogate: JSON allows it


@settings(max_examples=200, deadline=None)
@given(common=TEXT, a=TEXT, b=TEXT)
def test_two_texts_share_exactly_the_hashes_of_their_common_full_blocks(common: str, a: str, b: str) -> None:
    x, y = common + a, common + b
    hx, hy = prefix_block_hashes(x), prefix_block_hashes(y)
    assert len(hx) == len(x) // BLOCK_CHARS and len(hy) == len(y) // BLOCK_CHARS
    n = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    same = n // BLOCK_CHARS  # full blocks in common
    shared = next((i for i, (p, q) in enumerate(zip(hx, hy, strict=False)) if p != q), min(len(hx), len(hy)))
    assert shared == min(same, len(hx), len(hy))


def test_hashes_are_chained_deterministic_and_bounded() -> None:
    text = "x" * (3 * BLOCK_CHARS + 10)
    h = prefix_block_hashes(text)
    assert len(h) == 3 and h == prefix_block_hashes(text)  # the partial last block is not hashed
    assert len(set(h)) == 3  # equal blocks at other positions hash differently: chained
    assert prefix_block_hashes(text, max_blocks=2) == h[:2]
    assert prefix_block_hashes("y" * (BLOCK_CHARS - 1)) == ()
    assert h[0] == prefix_block_hashes("x" * BLOCK_CHARS)[0]
    assert all(0 <= v < 2**64 for v in h)
    # a block of BLOCK_CHARS characters is the gateway's estimate of HASH_BLOCK_TOKENS tokens
    assert estimate_tokens("x" * BLOCK_CHARS) == HASH_BLOCK_TOKENS
    with pytest.raises(ValueError, match="block_chars must be >= 1, got 0"):
        prefix_block_hashes(text, block_chars=0)
    with pytest.raises(ValueError, match="max_blocks must be >= 0, got -1"):
        prefix_block_hashes(text, max_blocks=-1)


SYSTEM = "You are a careful assistant for the ACME support desk. " * 40  # ~2,200 characters


def _send_all(gw, n: int) -> None:
    with gw.client() as c:
        for i in range(n):  # one after another: both backends idle at every decision
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}]
            body = {"model": "stub-model", "max_tokens": 2, "messages": messages}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("router", ["prefix-aware", "cache-aware"])
def test_prefix_routers_at_the_gateway_keep_a_shared_system_prompt_on_one_backend(
    make_stub, make_gateway, router: str
) -> None:
    stubs = [make_stub(), make_stub()]
    gw = make_gateway([s.url for s in stubs], router=router)
    _send_all(gw, 6)
    assert sorted(s.stub.stats.started for s in stubs) == [0, 6]
    # the contrast: without the hashes' pull, idle backends tie and the requests alternate
    stubs = [make_stub(), make_stub()]
    gw = make_gateway([s.url for s in stubs], router="least-tokens")
    _send_all(gw, 6)
    assert sorted(s.stub.stats.started for s in stubs) == [3, 3]


def test_prefix_aware_gateway_spreads_requests_without_a_shared_prefix(make_stub, make_gateway) -> None:
    stubs = [make_stub(), make_stub()]
    gw = make_gateway([s.url for s in stubs], router="prefix-aware")
    with gw.client() as c:
        for i in range(6):
            body = {"model": "stub-model", "max_tokens": 2, "prompt": f"{i} " + SYSTEM}  # differs in block 0
            assert c.post("/v1/completions", json=body).status_code == 200
    assert sorted(s.stub.stats.started for s in stubs) == [3, 3]


def test_prefix_aware_gateway_spills_over_when_the_cached_backend_is_loaded(make_stub, make_gateway) -> None:
    """Two requests in flight at once: the second would add to the first's backend more outstanding
    tokens (the first request's) than its cached prefix saves there, so it goes to the idle one."""
    stubs = [make_stub(token_delay_s=0.1), make_stub(token_delay_s=0.1)]
    gw = make_gateway([s.url for s in stubs], router="prefix-aware")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "question"}]
    codes: list[int] = []

    def send() -> None:
        with gw.client() as c:
            codes.append(c.post("/v1/chat/completions", json={"model": "stub-model", "max_tokens": 8,
                                                              "messages": messages}).status_code)  # fmt: skip

    first = threading.Thread(target=send)
    first.start()
    wait_until(lambda: sum(s.stub.stats.started for s in stubs) == 1, what="the first request to start")
    send()  # while the first is still generating (8 tokens, 0.1 s each)
    first.join()
    assert codes == [200, 200] and sorted(s.stub.stats.started for s in stubs) == [1, 1]


def test_the_gateway_hashes_prompts_only_for_a_router_that_reads_the_hashes(
    make_stub, make_gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    import headway.serve._intake as gateway_module

    calls: list[str] = []
    real = gateway_module.prefix_block_hashes
    monkeypatch.setattr(gateway_module, "prefix_block_hashes", lambda text: calls.append(text) or real(text))
    stub = make_stub()
    _send_all(make_gateway([stub.url], router="least-tokens"), 2)
    assert calls == []
    _send_all(make_gateway([stub.url], router="prefix-aware"), 2)
    assert len(calls) == 2
    _send_all(make_gateway([stub.url], router="cache-aware"), 2)
    assert len(calls) == 4
