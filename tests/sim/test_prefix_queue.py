"""The prefix cache's free queue, kept by counts, against a queue of single blocks.

``PrefixCache`` merges the blocks no lookup finds (runs, and runs freed while no key is queued
into the blocks without a hash at the head), and a request without keyed blocks frees its
blocks through ``release_unkeyed``. ``BlockQueue`` keeps one entry per block, in vLLM's order,
with no merging and no shortcut: operation by operation they must hold the same keys with the
same number of blocks before each, and a simulation must decide every step alike with either.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Any
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from factories import unit_cost
from headway.policies import noisy_oracle_defaults
from headway.sim import CacheConfig, SchedulerConfig, _replica, simulate
from headway.sim._prefix import PrefixCache, _OwnRun
from headway.workload import RequestSpec, Workload


class BlockQueue:
    """vLLM's free-block queue one block at a time (None: a block no lookup finds)."""

    def __init__(self, num_blocks: int) -> None:
        self.q: deque[Hashable | None] = deque([None] * num_blocks)
        self.ref: dict[Hashable, int] = {}
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0

    @property
    def queued(self) -> int:
        return len(self.q)

    def settle(self, free: int) -> None:
        while len(self.q) > max(free, 0):
            self.q.popleft()

    def cached(self, key: Hashable) -> bool:
        return key in self.ref or key in self.q

    def uncached(self, keys: Iterable[Hashable]) -> list[Hashable]:
        return [key for key in keys if not self.cached(key)]

    def hit_length(self, keys: Sequence[Hashable], limit: int) -> tuple[int, int]:
        h = touched = 0
        for key in keys[:limit]:
            if key in self.ref:
                h += 1
            elif key in self.q:
                h += 1
                touched += 1
            else:
                break
        return h, touched

    def acquire(self, key: Hashable) -> bool:
        if key in self.ref:
            self.ref[key] += 1
            return False
        self.q.remove(key)
        self.ref[key] = 1
        return True

    def insert(self, key: Hashable) -> bool:
        if self.cached(key):
            return False
        self.ref[key] = 1
        return True

    def release(self, unhashed: int, own: Sequence[Hashable], hidden: int, keys: Sequence[Hashable]) -> int:
        before = len(self.q)
        self.q.extendleft([None] * unhashed)
        self.q.extend(own)
        self.q.extend([None] * hidden)
        for key in keys:
            self.ref[key] -= 1
            if not self.ref[key]:
                del self.ref[key]
                self.q.append(key)
        return len(self.q) - before

    # a request without block hashes: its own keys one by one, as the keyed path has them
    def own_hit(self, seq: int, limit: int) -> int:
        h, touched = self.hit_length([(seq, i, -1) for i in range(limit)], limit)
        assert touched == h
        return h

    def take_own(self, seq: int, h: int) -> None:
        for i in range(h):
            assert self.acquire((seq, i, -1))

    def release_own(self, seq: int, blocks: int, full: int, held: int, evicted: bool) -> int:
        own = self.uncached([(seq, i, -1) for i in range(held, full)]) if evicted else []
        own.reverse()
        hidden = max(min(full, blocks) - held - len(own), 0)
        kept = [(seq, i, -1) for i in reversed(range(held))]
        return self.release(blocks - held - len(own) - hidden, own, hidden, kept)

    def release_unkeyed(self, free: int, blocks: int, full: int) -> None:
        self.settle(free)
        hidden = min(full, blocks)
        self.release(blocks - hidden, (), hidden, ())

    def layout(self) -> list[tuple[Hashable, int]]:
        """Each queued key and the number of blocks before it."""
        return [(key, i) for i, key in enumerate(self.q) if key is not None]


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
            out.append((key, pos))
            pos += 1
    assert pos == cache.queued
    return out


_start = st.tuples(st.just("start"), st.lists(st.integers(0, 12), max_size=5), st.integers(0, 4))
_finish = st.tuples(st.just("finish"), st.integers(0, 50), st.integers(0, 3), st.integers(0, 4), st.booleans())
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
def test_the_queue_by_counts_holds_what_a_queue_of_blocks_holds(num_blocks: int, script: list[tuple[Any, ...]]) -> None:
    real, ref = PrefixCache(num_blocks), BlockQueue(num_blocks)
    both = (real, ref)
    free, reserved = num_blocks, 0
    live: list[tuple[list[Hashable], int]] = []  # requests: cached keys in use, other blocks
    own_ids = iter(range(13, 10**6))  # keys only an evicted request has (lookups draw them too)
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
            keys: list[Hashable] = []
            for key in dict.fromkeys(args[0]):
                for c in both:
                    c.settle(free)
                if real.cached(key):
                    if key in real.ref or free > 0:
                        took = [c.acquire(key) for c in both]
                        assert took[0] == took[1]
                        free -= took[0]
                        keys.append(key)
                elif free > 0:
                    free -= 1
                    for c in both:
                        c.settle(free)
                    assert [c.insert(key) for c in both] == [True, True]
                    keys.append(key)
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
                own = [k for k in (next(own_ids) for _ in range(min(args[1], plain))) if not real.cached(k)]
                hidden = min(args[2], plain - len(own))
                unhashed = plain - len(own) - hidden
                back = [c.release(unhashed, own, hidden, keys[::-1]) for c in both]
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
            assert real.hit_length(args[0], len(args[0])) == ref.hit_length(args[0], len(args[0]))
        assert real.queued == ref.queued
        assert layout(real) == ref.layout()
        assert real.ref == {k: n for k, n in ref.ref.items() if not isinstance(k, tuple)}  # own hits: counts
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
