"""A replica's KV blocks and prefix cache: the admission check, joining the batch, giving
blocks back.

**Prefix caching** (``CacheConfig.enable_prefix_caching``, as vLLM V1's): a request with
nothing computed looks up its block keys in :class:`~headway.sim._prefix.PrefixCache` and
starts after its cached whole blocks (at most ``num_tokens - 1`` tokens); its hashed prompt
blocks are entered when a step is planned that computes them, as vLLM caches a block when it
allocates it, so a request admitted later in the same step hits them (running requests'
chunks are entered after the step's evictions and displacements, before admission, the
requests a displacement check counted as admitted included: ``Preemption._count_fit``); those
filled by decoding are entered when it leaves the batch; freed blocks keep their keys in
the free queue until an allocation reuses them, and blocks freed without one go to its head.
Requests that finish in one step leave in vLLM's running-list order (decoders, then prefills,
each in the order they joined the batch), which orders their blocks in the free queue.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from headway.core import STALL_EVICTIONS, Request, RequestState
from headway.sim._cost import CostModel
from headway.sim._decode import DecodeClock
from headway.sim._prefix import PrefixCache
from headway.sim._running_keys import RunningKeys
from headway.sim._seq import Seq
from headway.sim._steps import StepRecord

__all__ = ["BLOCKS", "BUDGET", "SLOT", "KVBlocks", "SimulationStalled"]

_RUNNING = RequestState.RUNNING  # (a global: reading an Enum member off its class is slower)

# what keeps a waiting request out of the batch (KVBlocks._admission)
SLOT, BUDGET, BLOCKS = 1, 2, 3


class SimulationStalled(RuntimeError):
    """The run looks unable to end: a request keeps being evicted (recompute) without getting
    further than before, the displacements and the KV budget cycling through the same states. An
    engine making the same decisions would spin the same way; the simulator stops instead."""


class KVBlocks(DecodeClock):
    """Admission and the KV blocks of a :class:`~headway.sim.Replica` (which sets every
    attribute below)."""

    cost: CostModel
    num_blocks: int
    watermark_blocks: int  # vLLM's watermark: blocks an admission leaves free while another request runs
    active_seqs: int  # the running set's admission limit (max_num_active_seqs, else max_num_seqs)
    max_model_len: int
    cache: PrefixCache | None
    _keyed: bool  # some request here has block keys (prefix caching only)
    _join_ids: itertools.count[int]  # Seq.order
    seqs: dict[Request, Seq]
    prefilling: list[Seq]
    paused: dict[Seq, None]  # pause mode: waiting requests that keep their KV blocks
    _pkeys: RunningKeys[Seq] | None  # pause mode: the worst-keyed paused request, kept lazily
    _run_version: int
    swap_cost: float
    steps: list[StepRecord] | None
    _step_cached: list[tuple[str, int]]
    num_preemptions: int  # evictions (KV freed)
    _sitting: list[Seq]  # decoders sitting the step in flight out (Preemption._sit_out): running, without a token
    _finishing: list[Seq]  # async scheduling: finished in the step that just ended, still holding slot and blocks
    _chunk_cap: int  # the step's long_prefill_token_threshold in force (0: none; _set_chunk_cap)
    _touched: int  # the last admission's prefix-cache hit blocks in the free queue (_admission)
    _fits_free: set[Hashable]  # the cached free blocks a displacement check's counted requests take (_count_fit)
    # blocks the plan's running requests take that vLLM allocates only after a displacement check (the
    # plugin's runs before its schedule()): its free queue gives them up after the check's evictions
    _running_alloc: int

    @property
    def num_running(self) -> int:
        return len(self.decoders) + len(self.prefilling) + len(self._sitting) + len(self._finishing)

    def _set_chunk_cap(self) -> None:
        """vLLM's ``long_prefill_token_threshold`` for the step being planned: in force while more
        than one request is running or waiting, floored at a fair share of the budget if adaptive."""
        cfg = self.cfg
        cap = cfg.long_prefill_token_threshold
        if cap:
            eligible = self.num_running + len(self.waiting)
            if eligible <= 1:
                cap = 0
            elif cfg.long_prefill_token_threshold_adaptive:
                cap = max(cap, cfg.max_num_batched_tokens // eligible)
        self._chunk_cap = cap

    def _prefill_chunk(self, s: Seq, left: int) -> int:
        """The tokens vLLM's loop schedules for a running request with prompt (or recompute) tokens
        left, given ``left`` tokens of the step's budget."""
        req = s.req
        n = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
        cap = self._chunk_cap
        if 0 < cap < n:
            n = cap
        return n if n < left else left

    def _plan_running_prefills(self, budget: int) -> int:
        """The running partial prefills' chunks in the step being planned, in order, out of ``budget``
        (returns what is left). One without a chunk in the step before sat it out (the budget ran
        out, or a KV shortage ended vLLM's running loop): with async scheduling it has nothing in
        flight, as a decoder back from ``_sitting`` (``sat_g``; ``Preemption._displace_victim``)."""
        for s in self.prefilling:
            if not s.chunk:
                s.sat_g = self.g
            chunk = self._prefill_chunk(s, budget)
            self._reserve_chunk(s, chunk)
            budget -= chunk
        return budget

    def _blocks_for(self, s: Seq, chunk: int) -> int:
        return -(-(s.req.num_computed_tokens + chunk) // self.bs) - s.blocks

    def _reserve_chunk(self, s: Seq, chunk: int) -> None:
        """Schedule ``chunk`` tokens of ``s`` in the step being planned: the blocks they need come off
        ``free`` (:meth:`_release_step` gives them back)."""
        blocks = self._blocks_for(s, chunk)
        s.blocks += blocks
        self.free -= blocks
        s.chunk = chunk

    def _admission(self, s: Seq, budget: int, counted: int = 0, taken: int = 0) -> tuple[int, int]:
        """Tokens ``s`` would be scheduled now and 0, or 0 and what it lacks (SLOT, BUDGET,
        BLOCKS), checked in vLLM's order. A displacement check's requests counted as admitted
        take ``counted`` slots and ``taken`` free blocks besides (``Preemption._count_fit``).
        Sets ``_touched``: the hit's blocks in the free queue."""
        running = self.num_running + counted
        if running >= self.active_seqs:
            return 0, SLOT
        if budget <= 0:
            return 0, BUDGET
        req = s.req
        computed = req.num_computed_tokens
        total = req.num_prompt_tokens + req.num_output_tokens
        touched = 0
        if self.cache is not None and not computed:
            # vLLM looks up the prefix cache for a request with nothing computed; a hit is whole
            # blocks, at most num_tokens - 1 tokens (the last one is computed for its logits)
            keys = s.keys
            if keys:
                if s.own_end > len(keys):
                    keys = keys + [(req.seq, i, -1) for i in range(len(keys), s.own_end)]
                self.cache.settle(self.free + self._running_alloc)
                h, touched = self.cache.hit_length(keys, (total - 1) // self.bs, self._fits_free)
                s.hit = keys[:h]
                computed = h * self.bs
            elif s.own_end:  # only its own keys, as runs (_prefix.py): all the hit is free, touched
                self.cache.settle(self.free + self._running_alloc)
                limit = (total - 1) // self.bs
                s.own_hit = h = self.cache.own_hit(req.seq, s.own_end if s.own_end < limit else limit)
                computed = h * self.bs  # (- len(s.hit) + touched below: - h + h)
        num_new = total - computed
        cap = self._chunk_cap
        if 0 < cap < num_new:
            num_new = cap
        if num_new > budget:
            if not self.cfg.enable_chunked_prefill:
                return 0, BUDGET
            num_new = budget
        # vLLM's allocate_slots: new blocks (a hit's blocks in the free queue count too) for the
        # whole sequence (scheduler_reserve_full_isl), then for the tokens of this step, and the
        # watermark left free after them while anything runs (in vLLM's words, is scheduled)
        if self.cfg.scheduler_reserve_full_isl:  # (min(total, max_model_len), written out: it runs per check)
            end = self.max_model_len if self.max_model_len < total else total
        else:
            end = computed + num_new
        need = -(-end // self.bs) - s.blocks - len(s.hit) + touched
        if running and self.watermark_blocks:
            need += self.watermark_blocks
        if need + taken > self.free:
            return 0, BLOCKS
        self._touched = touched
        return num_new, 0

    def _register(self, s: Seq) -> None:
        """Enter ``s``'s keyed blocks that its scheduled chunk fills into the prefix cache: vLLM
        caches a block when it allocates it for a step, so a request admitted later in the same
        step already hits it."""
        keys = s.keys
        full = min((s.req.num_computed_tokens + s.chunk) // self.bs, len(keys))
        if full <= s.reg:
            return
        cache = self.cache
        assert cache is not None
        cache.settle(self.free)
        held = s.held
        for i in range(s.reg, full):
            held.append(cache.insert(keys[i]))
        s.reg = full

    def _register_prefills(self) -> None:
        if self._keyed:
            for s in self.prefilling:
                if s.keys:
                    self._register(s)

    def _start_running(self, s: Seq, chunk: int, now: float, *, register: bool = True) -> None:
        req = s.req
        if s in self.paused:
            del self.paused[s]
            if self._pkeys is not None:
                self._pkeys.drop(s)
        elif req.num_computed_tokens and self.cfg.preemption_mode == "swap":
            self.swap_cost += self.cost.swap_per_token * req.num_computed_tokens
        cache = self.cache
        if cache is not None and not req.num_computed_tokens:
            hit = s.hit
            if hit:  # take the cached blocks (admission just looked them up, the cache settled)
                blocks, touched = cache.take(hit)
                self.free -= touched
                s.held.extend(blocks)
                s.blocks += len(hit)
                s.reg = len(hit)
                req.num_computed_tokens = len(hit) * self.bs
                req.num_recomputed_tokens -= min(req.num_computed_tokens, s.lost)
                s.hit = []
            elif s.own_hit:  # the same for a request without block hashes (_prefix.py's own runs)
                h = s.own_hit
                cache.take_own(req.seq, h)
                self.free -= h
                s.blocks += h
                s.reg = h  # its hit in use: blocks 0 .. h-1
                req.num_computed_tokens = h * self.bs
                req.num_recomputed_tokens -= min(req.num_computed_tokens, s.lost)
                s.own_hit = 0
            # vLLM's PrefixCacheStats: new requests, and apart the resumed ones
            if self.steps is not None:
                self._step_cached.append((req.request_id, req.num_computed_tokens))
            if req.first_scheduled_time is None:
                cache.queries += req.num_prompt_tokens
                cache.hits += req.num_computed_tokens  # (0 without a hit)
                req.num_cached_tokens = req.num_computed_tokens
            else:
                cache.preempted_queries += req.num_prompt_tokens + req.num_output_tokens
                cache.preempted_hits += req.num_computed_tokens
            s.lost = 0
        self._reserve_chunk(s, chunk)
        if register and s.keys:  # (keys only with prefix caching)
            self._register(s)
        req.transition(_RUNNING)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = self.loop.now  # (now: the policy's time, an async plan's)
        s.order = next(self._join_ids)
        self.prefilling.append(s)
        self._run_version += 1
        if self._rkeys is not None:
            last = req.num_computed_tokens + chunk >= req.num_prompt_tokens + req.num_output_tokens
            self._rkeys.admit(s, req, now, last_chunk=last)

    def _admit(self, now: float, budget: int) -> None:
        if self.num_running >= self.active_seqs:
            return  # (_admission's first check, without a look at the queue: a full batch is common)
        waiting, seqs = self.waiting, self.seqs
        while waiting:
            req = waiting.peek()
            assert req is not None
            s = seqs[req]
            chunk, _ = self._admission(s, budget)
            if not chunk:
                break
            waiting.pop()
            self._start_running(s, chunk, now)
            budget -= chunk

    def _release_step(self, s: Seq) -> int:
        """Return what ``s`` reserved for the step being planned; gives back its budget."""
        if s in self.decoders:
            if s.phase == -self.g % self.bs:
                self.free += 1
            return 1
        blocks = self._blocks_for(s, 0)  # negative: the chunk's reservation
        s.blocks += blocks
        self.free -= blocks
        return s.chunk

    def _free_blocks(self, s: Seq, evicted: bool, lag: int = 0) -> None:
        """Give back all of ``s``'s blocks (with prefix caching: :meth:`_free_keyed`; the full blocks
        of all but its last ``lag`` computed tokens are cached)."""
        cache = self.cache
        if cache is None:
            self.free += s.blocks
        elif s.keys or s.held:
            self._free_keyed(cache, s, evicted, lag)
        elif evicted or s.reg:
            self._free_own(cache, s, evicted, lag)
        else:
            # What _free_keyed does with no workload keys (keys=[]), no cached blocks in use
            # (held=[], so reg=0) and no own keys to leave behind (not evicted: own=[]): its
            # full blocks (at most all of them) are a run no lookup finds, the rest go to the head.
            # tests/sim/test_prefix_queue.py runs both ways step by step.
            full = (s.req.num_computed_tokens - lag) // self.bs
            cache.release_unkeyed(self.free + self._running_alloc, s.blocks, full)
            self.free += s.blocks
        s.blocks = 0

    def _free_keyed(self, cache: PrefixCache, s: Seq, evicted: bool, lag: int) -> None:
        """Give back ``s``'s blocks to the prefix cache: its full blocks keep their keys in the
        free queue: its workload-keyed ones (those filled by decoding are keyed now), and its
        other computed full blocks too, under keys only it has (vLLM hashes every full block):
        an evicted request finds them again when it resumes, and a finished one's hold their
        place in the queue. A full block computed again while another block had its key is a
        copy under the key (vLLM keeps both under the hash). The rest (its partial last block)
        goes to the head of the queue."""
        cache.settle(self.free + self._running_alloc)
        req = s.req
        full = (req.num_computed_tokens - lag) // self.bs
        keys, held = s.keys, s.held
        for i in range(s.reg, min(full, len(keys))):
            held.append(cache.insert(keys[i]))
        own: list[Hashable] = []
        if evicted and full > len(keys):
            seq = req.seq
            own = [(seq, i, -1) for i in range(full - 1, max(s.reg, len(keys)) - 1, -1)]
            s.own_end = full
        held.reverse()
        # its other full blocks: a finished request's past its block hashes (hashed in vLLM, found by nobody here)
        full = min(full, s.blocks)
        hidden = max(full - len(held) - len(own), 0)
        # blocks shared with running requests stay in use
        unhashed = s.blocks - len(held) - len(own) - hidden
        self.free += cache.release(unhashed, own, hidden, held)
        s.held = []
        s.reg = 0

    def _free_own(self, cache: PrefixCache, s: Seq, evicted: bool, lag: int) -> None:
        """:meth:`_free_keyed` for a request without block hashes, whose own blocks the prefix
        cache keeps as runs (``s.reg``: its hit in use, blocks 0 .. reg-1)."""
        cache.settle(self.free + self._running_alloc)
        req = s.req
        full = (req.num_computed_tokens - lag) // self.bs
        self.free += cache.release_own(req.seq, s.blocks, full, s.reg, evicted)
        if evicted and full:
            s.own_end = full
        s.reg = 0

    def _evict_kv(self, s: Seq, lag: int = 0) -> None:
        """Free an evicted request's KV blocks: swapped out (charged at the swap cost) or dropped,
        its computed tokens to be recomputed on resume (``lag``: see :meth:`_free_blocks`)."""
        req = s.req
        self._free_blocks(s, self.cfg.preemption_mode == "recompute", lag)
        if self.cfg.preemption_mode == "swap":
            self.swap_cost += self.cost.swap_per_token * req.num_computed_tokens
        else:
            computed = req.num_computed_tokens
            if computed > s.peak:
                s.peak = computed
                s.stalls = 0
            else:
                s.stalls += 1
                if s.stalls >= STALL_EVICTIONS:
                    raise SimulationStalled(
                        f"request {req.request_id!r} was evicted {STALL_EVICTIONS:,} times in a row without "
                        f"computing more than {s.peak:,} tokens (preemption mode recompute): each turn it gets "
                        "is lost before it gets further, so the run would likely never end; more KV blocks "
                        "(--num-gpu-blocks), --preemption-mode swap or a policy that displaces less end it"
                    )
            req.num_recomputed_tokens += computed
            s.lost = computed
            req.num_computed_tokens = 0
        self.num_preemptions += 1
