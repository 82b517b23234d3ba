"""The prefix cache's free queue, kept by counts, against a queue of single blocks.

``PrefixCache`` merges the blocks no lookup finds (runs, and runs freed while no key is queued
into the blocks without a hash at the head), and a request without keyed blocks frees its
blocks through ``release_unkeyed``. ``BlockQueue`` keeps one entry per block, in vLLM's order,
with no merging and no shortcut: operation by operation they must hold the same keys with the
same number of blocks before each, and a simulation must decide every step alike with either.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Hashable, Iterable, Sequence, Set
from typing import Any
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from factories import unit_cost
from headway.policies import noisy_oracle_defaults
from headway.sim import CacheConfig, SchedulerConfig, _replica, simulate
from headway.sim._prefix import PrefixCache, _Copy, _OwnRun
from headway.workload import RequestSpec, Workload


class Block:
    """One KV block with a hash (vLLM's ``KVCacheBlock``): blocks cached under one key are told apart."""

    __slots__ = ("key",)

    def __init__(self, key: Hashable) -> None:
        self.key = key


class BlockQueue:
    """vLLM's free-block queue one block at a time (None: a block no lookup finds), and its map of
    cached blocks: every block cached under a key, in the order they were cached (a lookup takes
    the first)."""

    def __init__(self, num_blocks: int) -> None:
        self.q: deque[Block | None] = deque([None] * num_blocks)
        self.map: dict[Hashable, list[Block]] = {}
        self.ref: dict[Block, int] = {}
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0

    @property
    def queued(self) -> int:
        return len(self.q)

    def settle(self, free: int) -> None:
        while len(self.q) > max(free, 0):
            block = self.q.popleft()
            if block is not None:  # evicted: its key no longer finds it
                self.map[block.key].remove(block)
                if not self.map[block.key]:
                    del self.map[block.key]

    def cached(self, key: Hashable) -> bool:
        return key in self.map

    def uncached(self, keys: Iterable[Hashable]) -> list[Hashable]:
        return [key for key in keys if not self.cached(key)]

    def hit_length(self, keys: Sequence[Hashable], limit: int, taken: Set[Hashable] = frozenset()) -> tuple[int, int]:
        h = touched = 0
        for key in keys[:limit]:
            if key not in self.map:
                break
            h += 1
            block = self.map[key][0]
            touched += block not in self.ref and block not in taken
        return h, touched

    def free_blocks(self, keys: Iterable[Hashable]) -> list[Hashable]:
        return [block for block in (self.map[key][0] for key in keys) if block not in self.ref]

    def take(self, keys: Iterable[Hashable]) -> tuple[list[Block], int]:
        blocks, touched = [], 0
        for key in keys:
            block = self.map[key][0]
            if block in self.ref:
                self.ref[block] += 1
            else:
                self.q.remove(block)
                self.ref[block] = 1
                touched += 1
            blocks.append(block)
        return blocks, touched

    def _cache(self, key: Hashable) -> Block:
        block = Block(key)
        self.map.setdefault(key, []).append(block)
        return block

    def insert(self, key: Hashable) -> Block:
        block = self._cache(key)
        self.ref[block] = 1
        return block

    def release(self, unhashed: int, own: Sequence[Hashable], hidden: int, keys: Sequence[Block]) -> int:
        before = len(self.q)
        self.q.extendleft([None] * unhashed)
        self.q.extend(self._cache(key) for key in own)
        self.q.extend([None] * hidden)
        for block in keys:
            self.ref[block] -= 1
            if not self.ref[block]:
                del self.ref[block]
                self.q.append(block)
        return len(self.q) - before

    # a request without block hashes: its own keys one by one, as the keyed path has them
    def own_hit(self, seq: int, limit: int) -> int:
        h, touched = self.hit_length([(seq, i, -1) for i in range(limit)], limit)
        assert touched == h
        return h

    def take_own(self, seq: int, h: int) -> None:
        assert self.take([(seq, i, -1) for i in range(h)])[1] == h

    def release_own(self, seq: int, blocks: int, full: int, held: int, evicted: bool) -> int:
        # (its runs keep one copy of a block: one still queued is not cached again, _prefix.py)
        own = self.uncached([(seq, i, -1) for i in range(held, full)]) if evicted else []
        own.reverse()
        hidden = max(min(full, blocks) - held - len(own), 0)
        kept = [next(b for b in self.map[(seq, i, -1)] if b in self.ref) for i in reversed(range(held))]
        return self.release(blocks - held - len(own) - hidden, own, hidden, kept)

    def release_unkeyed(self, free: int, blocks: int, full: int) -> None:
        self.settle(free)
        hidden = min(full, blocks)
        self.release(blocks - hidden, (), hidden, ())

    def layout(self) -> list[tuple[Hashable, int]]:
        """Each queued block's key and the number of blocks before it."""
        return [(block.key, i) for i, block in enumerate(self.q) if block is not None]


def layout(cache: PrefixCache) -> list[tuple[Hashable, int]]:
    out = []
    pos = cache.fresh
    for key in cache.lru:
        if isinstance(key, _OwnRun):  # its keys, tail first
            for i in reversed(range(key.base, key.base + key.n)):
                out.append(((key.seq, i, -1), pos))
                pos += 1
        elif key in cache.runs:
            pos += cache.runs[key]
        else:
            out.append((key.key if isinstance(key, _Copy) else key, pos))
            pos += 1
    assert pos == cache.queued
    return out


# a request's cached blocks (a key each; True: computed again though cached, a copy), its other blocks
def _copies(cache: PrefixCache) -> Counter[Hashable]:
    """How many blocks are cached under each key (an own run's keys aside)."""
    n = Counter(k for k in (*cache.ref, *cache.lru) if not isinstance(k, (_Copy, _OwnRun)) and k not in cache.runs)
    for key, copies in cache.dups.items():
        assert copies
        n[key] += len(copies)
    return n


_start = st.tuples(st.just("start"), st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=5),
                   st.integers(0, 4))  # fmt: skip
# which request frees its blocks; keys its other blocks get as they go back (copies of those cached);
# how many of the rest are hashed blocks no lookup finds; all through release_unkeyed (without keys)
_finish = st.tuples(st.just("finish"), st.integers(0, 50), st.lists(st.integers(0, 30), max_size=3, unique=True),
                    st.integers(0, 4), st.booleans())  # fmt: skip
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 6)),  # a step reserves blocks
        st.tuples(st.just("unreserve"), st.integers(0, 4)),  # and gives some back (not to the queue)
        st.tuples(st.just("settle"), st.just(0)),
        _start,
        _finish,
        _start,
        _finish,
        st.tuples(st.just("look"), st.lists(st.integers(0, 30), max_size=6)),
        # a request without block hashes (one of three): resumes with its own hit (capped), or
        # frees its blocks, this many of them computed beyond its hit, evicted or not
        st.tuples(st.just("own_in"), st.integers(0, 2), st.integers(0, 12), st.integers(0, 6)),
        st.tuples(st.just("own_out"), st.integers(0, 2), st.integers(0, 8), st.booleans()),
        st.tuples(st.just("own_out"), st.integers(0, 2), st.integers(0, 8), st.booleans()),
    ),
    min_size=20,
    max_size=80,
)


@settings(max_examples=300)
@given(num_blocks=st.integers(0, 40), script=ops)
# an own block below a queued run of them is gone: freed again, the run's blocks are duplicates
@example(num_blocks=12, script=[
    ("own_in", 0, 0, 5), ("own_out", 0, 1, True), ("own_in", 0, 0, 5), ("own_out", 0, 5, True), ("alloc", 6),
    ("alloc", 1), ("settle", 0), ("unreserve", 4), ("unreserve", 3), ("own_in", 0, 12, 5), ("own_out", 0, 8, True),
    ("own_in", 0, 12, 0)])
# three blocks under key 1: the first is evicted, the second freed, the third in use: a hit takes the second
@example(num_blocks=3, script=[
    ("start", [(1, False)], 0), ("start", [(1, True)], 0), ("start", [(1, True)], 0), ("finish", 0, [], 0, False),
    ("alloc", 1), ("settle", 0), ("finish", 0, [], 0, False), ("unreserve", 1), ("start", [(1, False)], 0),
    ("finish", 1, [], 0, False), ("look", [1])])
def test_the_queue_by_counts_holds_what_a_queue_of_blocks_holds(num_blocks: int, script: list[tuple[Any, ...]]) -> None:
    real, ref = PrefixCache(num_blocks), BlockQueue(num_blocks)
    both = (real, ref)
    free, reserved = num_blocks, 0
    live: list[tuple[list[tuple[Hashable, Block]], int]] = []  # requests: cached blocks in use, other blocks
    running: dict[int, tuple[int, int]] = {}  # requests without block hashes: own hit in use, other blocks
    for op, *args in script:
        if op == "alloc":
            k = min(args[0], max(free, 0))
            free, reserved = free - k, reserved + k
        elif op == "unreserve":
            k = min(args[0], reserved)
            free, reserved = free + k, reserved - k
        elif op == "settle":
            for c in both:
                c.settle(free)
        elif op == "start":
            keys: list[tuple[Hashable, Block]] = []  # the blocks it uses, as each queue names them
            for key, again in dict(args[0]).items():
                for c in both:
                    c.settle(free)
                if real.cached(key) and not again:
                    h, touched = real.hit_length([key], 1)
                    assert (h, touched) == ref.hit_length([key], 1)
                    if not touched or free > 0:
                        (a,), took = real.take([key])
                        (b,), took_ref = ref.take([key])
                        assert took == took_ref == touched
                        free -= took
                        keys.append((a, b))
                elif free > 0:
                    free -= 1
                    for c in both:
                        c.settle(free)
                    keys.append((real.insert(key), ref.insert(key)))
            plain = min(args[1], max(free, 0))
            free -= plain
            live.append((keys, plain))
        elif op == "finish" and live:
            keys, plain = live.pop(args[0] % len(live))
            if args[3] and not keys:
                for c in both:
                    c.release_unkeyed(free, plain, args[2])
                free += plain
            else:
                for c in both:
                    c.settle(free)
                own = args[1][:plain]
                hidden = min(args[2], plain - len(own))
                unhashed = plain - len(own) - hidden
                back = [real.release(unhashed, own, hidden, [a for a, _ in reversed(keys)]),
                        ref.release(unhashed, own, hidden, [b for _, b in reversed(keys)])]  # fmt: skip
                assert back[0] == back[1]
                free += back[0]
        elif op == "own_in" and args[0] not in running:
            for c in both:
                c.settle(free)
            h = real.own_hit(args[0], args[1])
            assert h == ref.own_hit(args[0], args[1])
            for c in both:
                if h:  # (as the engine calls it)
                    c.take_own(args[0], h)
            free -= h
            plain = min(args[2], max(free, 0))
            free -= plain
            running[args[0]] = (h, plain)
        elif op == "own_out" and args[0] in running:
            h, plain = running.pop(args[0])
            for c in both:
                c.settle(free)
            back = [c.release_own(args[0], h + plain, h + min(args[1], plain), h, args[2]) for c in both]
            assert back[0] == back[1]
            free += back[0]
        elif op == "look":
            for c in both:
                c.settle(free)
            assert [real.cached(k) for k in args[0]] == [ref.cached(k) for k in args[0]]
            h, touched = real.hit_length(args[0], len(args[0]))
            assert (h, touched) == ref.hit_length(args[0], len(args[0]))
            # the blocks that hit takes out of the free queue, as each queue names them; a lookup after
            # a request counted with them took them finds none of them free
            gone, gone_ref = real.free_blocks(args[0][:h]), ref.free_blocks(args[0][:h])
            assert [getattr(k, "key", k) for k in gone] == [b.key for b in gone_ref] and len(gone) == touched
            assert real.hit_length(args[0], h, set(gone)) == ref.hit_length(args[0], h, set(gone_ref)) == (h, 0)
        assert real.queued == ref.queued
        assert layout(real) == ref.layout()
        # the blocks in use (own hits: counts in ``real``), each named by its key
        assert Counter((getattr(k, "key", k), n) for k, n in real.ref.items()) == Counter(
            (b.key, n) for b, n in ref.ref.items() if not isinstance(b.key, tuple)
        )
        assert _copies(real) == Counter({k: len(v) for k, v in ref.map.items() if not isinstance(k, tuple)})
        # blocks are conserved: free ones, those of live requests, cached ones in use, reserved ones
        in_use = sum(p for _, p in live) + sum(h + p for h, p in running.values())
        assert free + in_use + len(real.ref) + reserved == num_blocks


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Requests without block hashes, or (``keyed``) some with hashes from a few shared prefixes."""
    keyed = draw(st.booleans())
    specs = []
    t = 0.0
    for i in range(draw(st.integers(1, 16))):
        t += draw(st.sampled_from([0.0, 0.01, 0.2, 1.0]))
        prompt = draw(st.integers(1, 120))
        hashes: tuple[int, ...] = ()
        if keyed and draw(st.booleans()):
            g = draw(st.integers(0, 2))
            hashes = tuple(1000 * g + j for j in range(-(-prompt // 16)))
        specs.append(RequestSpec(f"r{i}", t, prompt, draw(st.integers(1, 60)), block_hashes=hashes))
    return Workload.from_specs("w", specs)


def _full_path(replica: Any, s: Any, evicted: bool, lag: int = 0) -> None:
    """``Replica._free_blocks`` with every request through the general path (a request without
    block hashes through ``release_own``, which ``BlockQueue`` keeps key by key)."""
    if replica.cache is None:
        replica.free += s.blocks
    elif s.keys or s.held:
        replica._free_keyed(replica.cache, s, evicted, lag)
    else:
        replica._free_own(replica.cache, s, evicted, lag)
    s.blocks = 0


@settings(max_examples=60, deadline=None)
@given(wl=workloads(), blocks=st.integers(6, 40), seqs=st.integers(1, 6),
       name=st.sampled_from(["fcfs", "sjf-oracle", "srpt-oracle", "uniboost", "ltr"]),
       mode=st.sampled_from(["recompute", "swap"]), exact=st.booleans(),
       displacement=st.sampled_from([None, "pause", "evict"]), async_scheduling=st.booleans())  # fmt: skip
def test_the_shortcuts_decide_every_step_as_the_full_path(
    wl: Workload, blocks: int, seqs: int, name: str, mode: str, exact: bool, displacement: str | None,
    async_scheduling: bool,
) -> None:
    sched = SchedulerConfig(
        max_num_seqs=seqs, max_num_batched_tokens=128, preemption_mode=mode,  # type: ignore[arg-type]
        async_scheduling=async_scheduling,
    )
    if exact:
        sched = dataclasses.replace(sched, max_steps_per_event=1)

    kwargs = dict(noisy_oracle_defaults(name, None, tau=0.75, seed=0) or {})
    if displacement is not None and name in ("srpt-oracle", "uniboost", "ltr"):  # the preemptive ones
        kwargs["displacement"] = displacement

    def run() -> Any:
        return simulate(wl, name, preset=unit_cost(0.01, 1e-4, 1e-6), scheduler=sched, policy_kwargs=kwargs or None,
                        cache=CacheConfig(num_gpu_blocks=blocks), record_steps=True)  # fmt: skip

    fast = run()
    with mock.patch.object(_replica, "PrefixCache", BlockQueue), mock.patch.object(
        _replica.Replica, "_free_blocks", _full_path
    ):
        full = run()
    assert fast.replicas[0].steps == full.replicas[0].steps
    for a, b in zip(fast.requests, full.requests, strict=True):
        assert (a.state, a.finish_time, a.num_preemptions, a.num_recomputed_tokens, a.num_cached_tokens) == (
            b.state, b.finish_time, b.num_preemptions, b.num_recomputed_tokens, b.num_cached_tokens)
    assert (fast.replicas[0].prefix_cache_queries, fast.replicas[0].prefix_cache_hits) == (
        full.replicas[0].prefix_cache_queries, full.replicas[0].prefix_cache_hits)
