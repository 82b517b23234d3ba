"""Simulator-side state of one request in a replica."""

from __future__ import annotations

from collections.abc import Hashable

from headway.core import Request

__all__ = ["Seq"]


class Seq:
    """Simulator-side state of one request (never shown to policies)."""

    __slots__ = (
        "blocks", "chunk", "fin_g", "gen", "held", "hit", "join", "keys", "lost", "order", "own_end", "own_hit",
        "peak", "phase", "prefilled_g", "reg", "rekey_g", "req", "sat_g", "since", "stalls", "true_len",
    )  # fmt: skip

    def __init__(self, req: Request, true_len: int, keys: list[Hashable]) -> None:
        self.req = req
        self.true_len = true_len
        # prefix caching (see _prefix.py): the request's block keys, the cached blocks it uses,
        # how many leading blocks are keyed or looked at, the end of its own keyed blocks left
        # behind by an eviction, and the hit found by the last admission check
        self.keys = keys
        self.held: list[Hashable] = []
        self.reg = 0
        self.own_end = 0
        self.hit: list[Hashable] = []
        self.own_hit = 0  # the same as a count, for a request without block hashes (its own keys)
        self.lost = 0  # tokens its last eviction dropped (a cache hit on resume is not recomputed)
        self.blocks = 0  # KV blocks held (prefilling / waiting-after-swap); decoders: derived
        self.chunk = 0  # tokens scheduled in the current step (prefilling only)
        self.join = 0  # global decode-step count when counters were last synced
        self.since = 0.0  # on_decode_progress: when its progress was reported at join (see _decode.py)
        self.phase = 0  # (computed - join) mod block_size, for decoders
        self.fin_g = 0  # global decode-step count at which it finishes
        self.rekey_g = -1  # global decode-step count of its next rekey hint (-1: none)
        self.prefilled_g = -1  # global decode-step count when its last prefill chunk (or recompute) ended
        self.sat_g = -2  # global decode-step count when it rejoined the batch after sitting a step out
        self.gen = 0  # bumps whenever it leaves the decode set (invalidates heap entries)
        self.order = 0  # when it (re)joined the batch: its place in vLLM's running list
        # recompute evictions (see KVBlocks._evict_kv): the most tokens it had computed at one, and
        # how many since then in a row found it with no more
        self.peak = 0
        self.stalls = 0
