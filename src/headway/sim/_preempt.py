"""Taking requests out of a replica's batch: evictions for KV blocks and the displacement modes."""

from __future__ import annotations

from collections.abc import Callable

from headway.core import Request, RequestState
from headway.sim._api_server import ApiServerLimits
from headway.sim._blocks import BLOCKS, KVBlocks
from headway.sim._seq import Seq

__all__ = ["CLIENT_TIMEOUT", "Preemption"]

CLIENT_TIMEOUT = "client timeout"
"""The abort reason of a request whose client gave up (its ``RequestSpec.timeout``)."""


def _join_order(s: Seq) -> int:
    return s.order


class Preemption(KVBlocks):
    """Evicting, pausing and resuming the requests of a :class:`~headway.sim.Replica` (which
    sets every attribute below)."""

    num_pauses: int  # pause mode: requests taken out of the batch with their KV kept
    _step_preempted: list[str]
    _arm_timer: Callable[[Request, float], None]  # the replica's: a requeued request's re-key timer
    _sync_all: bool  # a displacement check syncs every running request (see the replica)
    _victim_from_heaps: bool  # a KV shortage's victim is the lazy heaps' top (see _heap_victim)
    _async: bool  # the replica's SchedulerConfig.async_scheduling
    _leave: Callable[[Seq], None]  # the replica's: a finished request gives back its blocks and slot
    _held: list[tuple[float, Request]]  # arrived, not yet seen by a plan (async scheduling; an arrival hook)
    _stale: list[Request]  # async scheduling: displaced with a token in flight, skipped by this plan
    _drained: bool  # async scheduling: a plan made with no step in flight (_async.py)
    _fits: list[tuple[Seq, int, int]]  # counted as admitted by a displacement check: (seq, blocks, tokens)
    _fits_taken: int  # the free KV blocks they take
    on_done: Callable[[Request], None] | None  # the simulator's: a request finished or was aborted
    api: ApiServerLimits | None  # vLLM's API server's admission limits, if any is set

    def _leave_batch(self, s: Seq, now: float) -> Request:
        """Take a running request out of the batch (evicted or paused): its counters synced, its
        step chunk dropped (its step reservations must already be returned)."""
        if self.steps is not None:
            self._step_preempted.append(s.req.request_id)
        if self._rkeys is not None:
            self._rkeys.drop(s)
        if s in self.decoders:
            self._sync(s, now)
            self._remove_decoder(s)
        else:
            self.prefilling.remove(s)
            s.chunk = 0
        return s.req

    def _requeue(self, req: Request, now: float) -> None:
        """A request taken out of the batch waits again (a preemption of it)."""
        req.num_preemptions += 1
        self._run_version += 1
        req.transition(RequestState.PREEMPTED)
        self.waiting.add(req, now)
        self._arm_timer(req, now)

    def _preempt(self, s: Seq, now: float, scheduled: int = 0) -> None:
        """Evict a running request (its step reservations must already be returned, but for the
        chunk of a prefill ``scheduled`` this step). vLLM caches a block as it allocates it for a
        step, once the tokens in it are known. With async scheduling a decoder's last computed
        token was sampled by the step before it, still in flight as that token's step was planned:
        its block is not cached (a request whose prefill or recompute ended in the step just ended
        computed known tokens only). A victim vLLM's running loop had ``scheduled`` this step,
        before the request it is evicted for, leaves the blocks that step's tokens fill cached,
        computed or not (the decoder's token in flight is not known: none with async scheduling)."""
        if scheduled:
            lag = 0 if self._async and s in self.decoders else -scheduled
        else:
            lag = self._unknown_tail(s) if self._async else 0
        req = self._leave_batch(s, now)
        self._evict_kv(s, lag)
        self._requeue(req, now)

    def _unknown_tail(self, s: Seq) -> int:
        """Async scheduling: 1 for a decoder whose last computed token was sampled by a step still
        in flight when its own step was planned (its block was not cached); else 0: its prefill or
        recompute ended in the step just ended (all its tokens known), or it sat out the step just
        ended or the one before (vLLM's running loop did not reach it: its last token was known
        when its last step was planned, or that step's output, processed with it running, cached
        the block)."""
        return self._last_token_unknown(s) if s in self.decoders else 0

    def _last_token_unknown(self, s: Seq) -> int:
        """:meth:`_unknown_tail`'s rule for a request that ran in the step just ended, as a decoder
        or finishing in it (:meth:`_drop_finishing`)."""
        g = self.g
        return 1 if s.prefilled_g != g and s.sat_g < g - 1 else 0

    def _async_lag(self, s: Seq) -> int:
        """What :meth:`_preempt` caches of a running request's blocks with async scheduling, before the
        step it ran in is processed: a decoder's as :meth:`_unknown_tail` says, a prefill's chunk's
        blocks too (vLLM cached them as it allocated)."""
        if s in self.prefilling:
            return -s.chunk
        return self._unknown_tail(s)

    def _abort(self, s: Seq, now: float, lag: int = 0) -> None:
        """The client aborted ``s`` (between steps, or waiting): it leaves the queue or the batch and
        frees its KV blocks as a finished request does (vLLM's ``finish_requests``; ``lag``: see
        :meth:`_free_blocks`); it is not a preemption, and the policy is not told (no
        ``on_finish``: its length is not observed)."""
        req = s.req
        if self._rkeys is not None:
            self._rkeys.drop(s)
        if s in self.decoders:
            self._sync(s, now)
            self._remove_decoder(s)
        elif s in self.prefilling:
            self.prefilling.remove(s)
            s.chunk = 0
        elif s in self._sitting:
            self._sitting.remove(s)
        elif not self.waiting.remove(req):  # (arrived, not yet seen by a plan: _held)
            self._held = [(t, r) for t, r in self._held if r is not req]
        if s in self.paused:
            del self.paused[s]
            if self._pkeys is not None:
                self._pkeys.drop(s)
        if s.blocks:
            self._free_blocks(s, False, lag)
        del self.seqs[req]
        self._run_version += 1
        if self.api is not None:
            self.api.engine_took_abort(req)
        self._end_aborted(req, now, CLIENT_TIMEOUT)

    def _end_aborted(self, req: Request, now: float, reason: str) -> None:
        """``req`` ends now, aborted for ``reason`` (its client's timeout, or its server turning it
        away before the engine saw it), and the simulator is told."""
        req.transition(RequestState.ABORTED)
        req.finish_time = now
        req.extra["abort_reason"] = reason
        if self.on_done is not None:
            self.on_done(req)

    def _pause(self, s: Seq, now: float) -> None:
        """Pause mode: take a running request out of the batch; it keeps its KV blocks and waits
        (its step reservations must already be returned). Counts as a preemption of the request."""
        req = self._leave_batch(s, now)
        self.paused[s] = None
        req.num_pauses += 1
        self.num_pauses += 1
        self._requeue(req, now)
        if self._pkeys is not None:  # keyed as the queue keys it, after the preemption
            self._pkeys.push(s, req, now)

    def _drop_paused(self, s: Seq) -> None:
        """A KV shortage evicts a paused request: its blocks are freed, it recomputes on resume."""
        if self.steps is not None:
            self._step_preempted.append(s.req.request_id)
        del self.paused[s]
        if self._pkeys is not None:
            self._pkeys.drop(s)
        self._evict_kv(s)
        self._run_version += 1

    def _drop_finishing(self, s: Seq, scheduled: int = 0) -> None:
        """Async scheduling: a KV shortage or a displacement evicts a request that finished in the
        step that just ended (vLLM preempts it while its last token is in flight; it finishes as
        that token arrives): its blocks are freed now, a preemption of it. Its last full block is
        cached only if vLLM knew the block's last token when it allocated it: a decoder's, sampled
        by the step before its last one, was in flight then (:meth:`_unknown_tail`), unless vLLM's
        running loop allocated for it in this step (``scheduled``), after that token came."""
        if self.steps is not None:
            self._step_preempted.append(s.req.request_id)
        self._finishing.remove(s)
        if self._rkeys is not None:
            self._rkeys.drop(s)
        s.req.num_preemptions += 1
        self.num_preemptions += 1
        self._free_blocks(s, False, 0 if scheduled else self._last_token_unknown(s))
        del self.seqs[s.req]
        self._run_version += 1

    def _take_victim(self, s: Seq, evict: bool, now: float, scheduled: int = 0) -> int:
        """Displace ``s``: a paused request loses its KV blocks; a running one returns its step
        reservations and is evicted (``evict``) or paused. ``scheduled``: the tokens vLLM's running
        loop had scheduled for it this step (:meth:`_preempt`; a prefill's chunk keeps its blocks
        until they are freed with the rest). Returns the token budget it gave back."""
        if s in self.paused:
            self._drop_paused(s)
            return 0
        if self._finishing and s in self._finishing:
            freed = self._release_step(s) if s.chunk else 0  # (its token after a stop)
            self._drop_finishing(s, scheduled)
            return freed
        if scheduled and evict and s not in self.decoders:
            self._preempt(s, now, scheduled)
            return scheduled
        freed = self._release_step(s)
        if evict:
            self._preempt(s, now, scheduled)
        else:
            self._pause(s, now)
        return freed

    def _displace_victim(self, s: Seq, evict: bool, now: float) -> int:
        """:meth:`_take_victim` for a displacement. With async scheduling a running request taken out
        of the batch for a waiting one has its token of the step in flight still to come, and vLLM's
        admission skips a preempted request with output in flight (``num_stale_output_tokens``) for
        the rest of that plan, without stopping at it: it waits aside until the plan is made. Not in a
        plan made again after an empty one: the engine waited for the step in flight, whose output
        came, so nothing is in flight (vLLM's admission stops at it as at any request); nor for a
        decoder or a partial prefill that sat the step in flight out (``sat_g``: vLLM's running loop
        had not reached it, and its ``num_in_flight_tokens`` is 0)."""
        stale = (
            self._async and not self._drained and s not in self.paused and s not in self._finishing
            and s.sat_g != self.g
        )  # fmt: skip
        if s not in self.paused:  # its blocks of the step are not allocated (vLLM's running loop comes after)
            self._running_alloc -= self._step_blocks(s)
        freed = self._take_victim(s, evict, now)
        if stale and self.waiting.remove(s.req):
            self._stale.append(s.req)
        return freed

    def _sync_now(self, s: Seq) -> None:
        if s in self.decoders:
            self._sync(s, self.loop.now)

    def _running_items(self) -> list[tuple[Seq, Request, int | None]]:
        """Running requests for RunningKeys.push: decoders with the decode clock, then prefills (and with
        async scheduling the requests finishing in the step just ended: vLLM still runs them)."""
        items = [(s, s.req, self.seen_g) for s in self.decoders]
        return items + [(s, s.req, None) for s in (*self.prefilling, *self._finishing)]

    def _paused_items(self) -> list[tuple[Seq, Request, int | None]]:
        return [(s, s.req, None) for s in self.paused]

    def _running(self, now: float) -> list[Request]:
        """The running requests, synced (with async scheduling, those finishing in the step just ended too)."""
        self._sync_decoders(now)
        if self._decode_runs:  # the keys read the counters
            self._materialize_decoders()
        return [s.req for s in (*self.decoders, *self.prefilling, *self._finishing)]

    def _evict_for_memory(self, now: float, budget: int) -> int:
        """Evict the policy's victims until the running requests' blocks fit, as vLLM's running
        loop does: in running-list order (``Seq.order``), a request short of blocks evicts victims
        until it fits; when the victim is that request itself, the loop stops there, and every
        running request after it sits the step out (:meth:`_sit_out`). The step's blocks are
        already taken off ``free`` for every running request; at a request, ``free`` plus what the
        requests after it reserved is what vLLM would find free. A victim the loop had scheduled
        gives its tokens back, and a partial prefill after it gets them, as vLLM sizes a chunk at
        its turn (partial prefills are the running list's tail: see the module docstring). In
        pause mode the paused requests hold blocks too and are candidates (they rank below the
        running ones)."""
        running = sorted([*self.decoders, *self.prefilling, *[s for s in self._finishing if s.chunk]], key=_join_order)
        needs = [self._step_blocks(s) for s in running]
        place = {s: i for i, s in enumerate(running)}
        gone: set[Seq] = set()
        spent: dict[Seq, int] = {}  # tokens of the requests the loop scheduled and still holds
        after = sum(needs)
        for i, s in enumerate(running):
            after -= needs[i]
            if s in gone:
                continue
            if s in self.decoders:
                tokens = 1
            else:
                tokens = self._resize_chunk(s, self.cfg.max_num_batched_tokens - sum(spent.values()))
                needs[i] = self._step_blocks(s)
            while needs[i] and self.free + after < 0 and (self.num_running or self.paused):
                v = self._heap_victim(now) if self._victim_from_heaps else self._scan_victim(now)
                budget += self._take_victim(v, True, now, spent.get(v, 0))
                if v is s:  # vLLM: "Cannot schedule this request", and its loop ends
                    self._sit_out([r for r in running[i + 1 :] if r not in gone], now)
                    return budget
                k = place.get(v)
                if k is not None:
                    gone.add(v)
                    spent.pop(v, None)  # (scheduled before s: its tokens go back to the budget)
                    if k > i:  # its reservation was counted as still to come (and is not, at its turn)
                        after -= needs[k]
                        needs[k] = 0
            spent[s] = tokens
        return budget

    def _resize_chunk(self, s: Seq, left: int) -> int:
        """A running partial prefill's chunk as vLLM's loop sizes it at its turn, with ``left`` tokens
        of the step's budget (more than planned when a victim gave tokens back); its reservation moves
        with it (async scheduling: a request finishing in the step just ended has its token after a
        stop: AsyncScheduling._plan_after_stop). Returns the chunk."""
        chunk = max(0, min(1, left) if s in self._finishing else self._prefill_chunk(s, left))
        if chunk != s.chunk:
            self._release_step(s)
            self._reserve_chunk(s, chunk)
        return chunk

    def _step_blocks(self, s: Seq) -> int:
        """The KV blocks the step being planned took for a running request."""
        if s in self.decoders:
            return 1 if s.phase == -self.g % self.bs else 0
        return -self._blocks_for(s, 0)

    def _sit_out(self, seqs: list[Seq], now: float) -> None:
        """Running requests that vLLM's running loop did not reach this step: they return what
        the step reserved and get no token, keeping their blocks and their place in the running
        list; decoders leave the decode set until the next step starts (``_sitting``)."""
        for s in seqs:
            self._release_step(s)
            if s in self.decoders:
                self._sync(s, now)
                self._remove_decoder(s)
                self._sitting.append(s)
            else:
                s.chunk = 0

    def _scan_victim(self, now: float) -> Seq:
        """The policy's ``choose_victim`` among the running and paused requests."""
        pool = self._running(now)
        if self.paused:
            pool += [s.req for s in self.paused]
        return self.seqs[self.policy.choose_victim(pool, now)]

    def _heap_victim(self, now: float) -> Seq:
        """:meth:`_scan_victim` for a policy with the default ``choose_victim`` (the largest
        ``(key, seq)``) and ``can_preempt`` (always True): the lazy heaps hold every running and
        paused request (none is set aside for ``can_preempt``), so the larger of their tops is
        that victim, without re-keying everyone. Progress is reported as a displacement check
        reports it (the whole batch where the policy needs every step's, ``_sync_all``; else
        late, as ``progress_at_hints`` or no progress hook allow)."""
        rkeys, pkeys = self._rkeys, self._pkeys
        assert rkeys is not None
        rkeys.forget()
        if pkeys is not None:
            pkeys.forget()
        if self._sync_all:
            self._sync_decoders(now)
        found = rkeys.worst(None, now, self._sync_now, self._running_items, self.seen_g)
        if self.paused:
            assert pkeys is not None
            held = pkeys.worst(None, now, self._sync_now, self._paused_items)
            if held is not None and (found is None or held[1] > found[1]):
                found = held
        assert found is not None
        return found[0]

    def _displace(self, now: float, budget: int) -> int:
        """Preemptive policies: a better-keyed waiting request that cannot be admitted displaces the
        worst-keyed running one, in the policy's ``displacement`` mode: ``pause`` takes a slot or
        token budget from it (it keeps its KV), and evicts the worst-keyed block holder for KV
        blocks; ``evict`` evicts for KV blocks only. Nobody is displaced for the token budget
        alone when chunked prefill is on (any budget admits a chunk)."""
        rkeys = self._rkeys
        if rkeys is None:
            return self._displace_scan(now, budget)
        # the running keys' lazy heap (_running_keys.py); with it, the paused requests' heap
        pause = self.policy.displacement == "pause"
        waiting, seqs, pkeys = self.waiting, self.seqs, self._pkeys
        rkeys.forget()
        if pkeys is not None:
            pkeys.forget()
        if self._sync_all:
            self._sync_decoders(now)
        while budget > 0:  # an exhausted token budget is no reason to evict
            head = waiting.head()
            if head is None:
                break
            cand, cand_key = head
            s = seqs[cand]
            chunk, short = self._admission(s, budget, len(self._fits), self._fits_taken)
            if chunk:
                waiting.pop()
                budget -= self._count_fit(s, chunk)
                continue
            if short != BLOCKS and not pause:
                break  # evict mode: a full batch or budget displaces nobody
            above = (cand_key, cand.seq)
            found = rkeys.worst(above, now, self._sync_now, self._running_items, self.seen_g)
            if short == BLOCKS and self.paused:  # (pause mode: pkeys is kept)
                assert pkeys is not None
                held = pkeys.worst(above, now, self._sync_now, self._paused_items, skip=cand)
                if held is not None and (found is None or held[1] > found[1]):
                    found = held
            if found is None:
                break
            budget += self._displace_victim(found[0], short == BLOCKS, now)
        return budget

    def _displace_scan(self, now: float, budget: int) -> int:
        """:meth:`_displace` re-keying every running (and paused) request at each check: for policies
        with a progress hook that do not declare how their running keys evolve, and the reference
        the lazy heaps are tested against (``_running_keys.EXACT_SCAN``)."""
        policy = self.policy
        pause = policy.displacement == "pause"
        keys = {r: (policy.key(r, now), r.seq) for r in self._running(now)}
        while self.waiting and budget > 0:  # an exhausted token budget is no reason to evict
            cand = self.waiting.peek()
            assert cand is not None
            chunk, short = self._admission(self.seqs[cand], budget, len(self._fits), self._fits_taken)
            if chunk:
                self.waiting.pop()
                budget -= self._count_fit(self.seqs[cand], chunk)
                continue
            ckey = (self.waiting.peek_key(), cand.seq)
            if short != BLOCKS and not pause:
                break  # evict mode: a full batch or budget displaces nobody
            pool = {r: k for r, k in keys.items() if k > ckey and policy.can_preempt(r, now)}
            if short == BLOCKS and self.paused:
                for p in self.paused:
                    if p.req is not cand:
                        key = (policy.key(p.req, now), p.req.seq)
                        if key > ckey:
                            pool[p.req] = key
            if not pool:
                break
            worst = max(pool, key=pool.__getitem__)
            keys.pop(worst, None)  # (a paused victim has no running key)
            budget += self._displace_victim(self.seqs[worst], short == BLOCKS, now)
        return budget

    def _count_fit(self, s: Seq, chunk: int) -> int:
        """A displacement check counts a waiting request that fits as admitted: its slot, its
        ``chunk`` tokens and the KV blocks it takes, as the plugin's check does before vLLM's
        ``schedule()``. It is admitted by :meth:`_admit_fits`, once the running requests' blocks of
        the step are in the prefix cache, where vLLM's waiting loop looks its hit up (after its
        running loop allocated, and so cached, those blocks). Returns ``chunk``."""
        req = s.req
        if self.cache is not None and not req.num_computed_tokens:  # (_admission looked its hit up)
            computed, hit = (len(s.hit) or s.own_hit) * self.bs, len(s.hit)
        else:
            computed, hit = req.num_computed_tokens, 0
        blocks = -(-(computed + chunk) // self.bs) - s.blocks - hit + (self._touched if s.hit else 0)
        self._fits.append((s, blocks, chunk))
        self._fits_taken += blocks
        if s.hit and self._touched:  # a request counted after it that hits them finds them out of the free queue
            assert self.cache is not None
            self._fits_free.update(self.cache.free_blocks(s.hit))
        if s.keys:  # (one without block hashes keeps its own hit: _admit_fits reads it, below)
            s.hit, s.own_hit = [], 0
        return chunk

    def _admit_fits(self, now: float, budget: int) -> tuple[int, bool]:
        """Admit the requests a displacement check counted (:meth:`_count_fit`), in its order, as
        vLLM's waiting loop takes them: each looks its prefix-cache hit up again, now that the
        running requests' blocks of the step are cached (it may hit more and schedule fewer
        tokens). One that no longer fits waits again with those after it (head-of-line). Returns
        the token budget left and whether all were admitted."""
        fits = self._fits
        self._fits_free.clear()  # (each takes its hit now: the blocks of those before it are in use)
        # without block hashes a request hits its own blocks alone, which the running loop's new
        # blocks may take from the free queue's head (the hit only shrinks): when none has hashes or
        # a counted hit, each keeps the chunk it was counted with (any() of a generator, written as
        # this loop: it runs at most plans of a displacing policy)
        again = False
        for s, _, chunk in fits:
            budget += chunk
            if s.keys or s.own_hit:
                again = True
        for i, (s, _, counted) in enumerate(fits):
            chunk = self._admission(s, budget)[0] if again else counted
            if not chunk:
                for rest, _, _ in fits[i:]:
                    rest.hit, rest.own_hit = [], 0
                    self.waiting.add(rest.req, now)
                fits.clear()
                self._fits_taken = 0
                return budget, False
            self._start_running(s, chunk, now)
            budget -= chunk
        fits.clear()
        self._fits_taken = 0
        return budget, True
