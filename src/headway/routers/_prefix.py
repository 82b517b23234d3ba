"""Routers that read what each target has cached: ``prefix-aware`` and ``cache-aware``.

Both keep the same approximate index of each target's prefix cache (:class:`PrefixIndex`), as
SGLang's model gateway and llm-d's prefix-cache scorer do: the block hashes
(:attr:`~headway.core.Request.block_hashes`) of the requests sent there, in LRU order. They differ
in how they weigh a cached prefix against load: ``prefix-aware`` prices both in tokens,
``cache-aware`` follows SGLang's rule (the cached target while the fleet is balanced).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from headway.core import Request
from headway.routers._base import Estimator, Router, TargetLoad, register_router
from headway.routers._builtin import LeastTokensRouter

__all__ = ["CacheAwareRouter", "PrefixAwareRouter", "PrefixIndex"]

DEFAULT_CACHE_TOKENS = 470_000
"""Tokens indexed per target by default: what Llama-3-8B on an A100 holds in KV."""


class PrefixIndex:
    """Per target, the block hashes of the requests routed there: LRU, at most ``cache_tokens``
    tokens' worth each (a replica's KV capacity)."""

    __slots__ = ("_index", "cache_tokens")

    def __init__(self, cache_tokens: int, owner: str) -> None:
        if isinstance(cache_tokens, bool) or not isinstance(cache_tokens, int) or cache_tokens < 1:
            raise ValueError(f"{owner}: cache_tokens must be an int >= 1, got {cache_tokens!r}")
        self.cache_tokens = cache_tokens
        self._index: dict[int, OrderedDict[int, None]] = {}

    def clear(self) -> None:
        self._index = {}

    def hit_tokens(self, request: Request, target: int) -> int:
        """Tokens of ``request``'s prompt believed cached on ``target``: its longest run of leading
        hashes found there, at most the prompt less one token (as vLLM's hits)."""
        index = self._index.get(target)
        hashes = request.block_hashes
        if not index or not hashes:
            return 0
        n = 0
        for h in hashes:
            if h not in index:
                break
            n += 1
        return min(n * request.hash_block_size, request.num_prompt_tokens - 1)

    def add(self, request: Request, target: int) -> None:
        """``request`` went to ``target``: its blocks are cached there now (most recently used)."""
        hashes = request.block_hashes
        if not hashes:
            return
        index = self._index.setdefault(target, OrderedDict())
        for h in hashes:
            index[h] = None
            index.move_to_end(h)
        limit = max(self.cache_tokens // request.hash_block_size, 1)
        while len(index) > limit:
            index.popitem(last=False)


class _PrefixIndexed(Router):
    """A router with a :class:`PrefixIndex` (``self._index``), which it forgets on :meth:`reset`."""

    _index: PrefixIndex

    def reset(self) -> None:
        super().reset()
        self._index.clear()

    def hit_tokens(self, request: Request, target: int) -> int:
        """Tokens of ``request``'s prompt the router believes ``target`` has cached."""
        return self._index.hit_tokens(request, target)


@register_router("prefix-aware")
class PrefixAwareRouter(_PrefixIndexed, LeastTokensRouter):
    """The target where the request's cached prefix saves the most, balanced against load.

    It keeps an approximate index of what each target has cached (:class:`PrefixIndex`: the
    block hashes of the requests it sent there, at most ``cache_tokens`` tokens' worth per
    target). A request's *hit* on a target is the longest run of its leading hashes in that
    index, in tokens. It goes to the target with the least ``(outstanding tokens + prompt - hit
    + expected output) / speed``: the work it adds there is what the cache does not save, so a
    long shared prefix draws it to the target that holds it unless that target is already
    loaded by more than the prefix saves. Outstanding tokens are whole requests (prompt and
    expected output), each counted like a prompt token the hit saves. Ties: fewer outstanding
    requests, then rotating. Without hashes this is ``least-tokens``. The index learns from
    every decision (:meth:`choose` too) and forgets on :meth:`reset`.
    """

    uses_estimate = True
    uses_block_hashes = True

    def __init__(self, *, cache_tokens: int = DEFAULT_CACHE_TOKENS, estimate_fn: Estimator | None = None) -> None:
        super().__init__(estimate_fn=estimate_fn)
        self._index = PrefixIndex(cache_tokens, "prefix-aware")

    def _saved_tokens(self, request: Request, target: int) -> float:
        return self._index.hit_tokens(request, target)

    def _sent(self, request: Request, target: int) -> None:
        self._index.add(request, target)

    def describe(self) -> dict[str, Any]:
        return {"cache_tokens": self._index.cache_tokens}


@register_router("cache-aware")
class CacheAwareRouter(_PrefixIndexed):
    """SGLang's cache-aware rule: the target holding the prompt's prefix while the fleet is balanced.

    As SGLang's model gateway (``--policy cache_aware``, its defaults): a target's load is its
    outstanding requests. The fleet is *imbalanced* when the most and the least loaded targets
    differ by more than ``balance_abs_threshold`` requests and the most loaded has more than
    ``balance_rel_threshold`` times the least; a request then goes to the least loaded. While
    balanced it goes to the target with the longest cached prefix (the index of
    :class:`PrefixIndex`, as ``prefix-aware``) if that prefix covers more than
    ``cache_threshold`` of its prompt, else to the least loaded. The index learns every
    decision (:meth:`choose` too) and forgets on :meth:`reset`.

    Where it differs from SGLang's: the index holds block hashes (tokens) where SGLang's radix
    tree holds the prompt's characters; among targets with the same longest prefix the least
    loaded is taken (then rotating ties, as everywhere), where SGLang's tree names one; on a
    fleet of different speeds a load is requests over speed.
    """

    uses_block_hashes = True

    def __init__(
        self,
        *,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.0001,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        estimate_fn: Estimator | None = None,
    ) -> None:
        super().__init__(estimate_fn=estimate_fn)
        if (
            isinstance(cache_threshold, bool)
            or not isinstance(cache_threshold, int | float)
            or not (0.0 <= cache_threshold <= 1.0)
        ):
            raise ValueError(f"cache-aware: cache_threshold must be a number in [0, 1], got {cache_threshold!r}")
        abs_t: object = balance_abs_threshold
        if isinstance(abs_t, bool) or not isinstance(abs_t, int) or abs_t < 0:
            raise ValueError(f"cache-aware: balance_abs_threshold must be an int >= 0, got {balance_abs_threshold!r}")
        if (
            isinstance(balance_rel_threshold, bool)
            or not isinstance(balance_rel_threshold, int | float)
            or not (1.0 <= balance_rel_threshold < math.inf)
        ):
            raise ValueError(
                f"cache-aware: balance_rel_threshold must be a finite number >= 1, got {balance_rel_threshold!r}"
            )
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = float(balance_rel_threshold)
        self._index = PrefixIndex(cache_tokens, "cache-aware")

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        order = self._rotated(candidates)
        if uniform:
            loads: list[float] = [targets[i].outstanding_requests for i in order]
        else:
            loads = [targets[i].outstanding_requests / targets[i].speed for i in order]
        most, least = max(loads), min(loads)
        pos = -1
        balanced = not (most - least > self.balance_abs_threshold and most > least * self.balance_rel_threshold)
        if balanced and request.block_hashes:
            best_hit = 0
            for j, i in enumerate(order):
                hit = self._index.hit_tokens(request, i)
                if hit > best_hit or (hit == best_hit and hit and loads[j] < loads[pos]):
                    best_hit, pos = hit, j
            if best_hit <= self.cache_threshold * request.num_prompt_tokens:
                pos = -1  # too little cached anywhere: by load
        if pos < 0:
            pos = loads.index(least)  # the first of the least loaded after the last pick
        self._picked(pos)
        best = order[pos]
        self._index.add(request, best)
        return best

    def describe(self) -> dict[str, Any]:
        return {
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
            "cache_tokens": self._index.cache_tokens,
        }
