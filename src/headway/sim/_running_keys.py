"""The worst-keyed running request, without re-keying every running request each step.

A displacement check needs the running request with the largest ``(key, seq)`` that the
policy lets go (``can_preempt``). The Policy contract says a running request's key may only
stay or improve between its ``rekey_after_tokens`` hints, so a key computed earlier is an
upper bound of its key now. :class:`RunningKeys` keeps those bounds in a max-heap: the top
is re-keyed; if its key improved it goes back down with the new key, else it is the worst
(an exact answer, as a scan of every running request gives). Each request is re-keyed when
it starts running and at each hint (the key may worsen there), for a policy with a progress
hook also at each report of a prefill chunk, and all of them when the policy's ``key_epoch`` changes.

Policies that declare how their running keys evolve (``Policy.running_keys``) get more:

* ``"countdown"``: a decoding request's first key component falls by exactly one per output
  token, and each decode step gives every decoder one token, so ``key[0] + clock`` (the
  engine's decode-step count) stays fixed while it decodes. Decoders are kept in a second heap
  under that anchor; its order is theirs at every step, and its top's key now is the anchor
  minus the clock: bounds that stay exact as every decoder's key falls, where plain upper
  bounds would have every decoder re-keyed at each check. A request is re-keyed into it when
  it starts decoding. The first component is held as an
  integer and a fraction in ``[0, 1)`` (both exact), so the anchors order as the keys do.
* ``can_preempt``, once False, stays False until the request's next key point: such a request
  leaves the heap until it is re-keyed, instead of being set aside at every check.

A push of the priority that the item's live entry already holds files nothing (the entry is that
priority, exactly): a bounded key is pushed as a request is admitted and again as its prefill ends,
most often unchanged (LTR's), and each such entry would only be dead weight for the heap's sifts,
stale-top pops and compactions.

Within one displacement check (one instant, one decode clock) a found answer is remembered
until the next push or drop: a check that takes a paused request's blocks, or that compares the
running and the paused heaps' answers, asks the other heap again with nothing in it changed
(the answer is the same item, or None if the new bound is at or above it). The replica calls
:meth:`RunningKeys.forget` as each check starts.

``EXACT_SCAN`` (for tests) makes the simulator scan every running request's key at each
check instead, as it does for policies with a progress hook that declare nothing: the
reference the lazy heap must agree with, decision for decision.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from headway.core import RUNNING_KEYS, Policy, PolicyKey, Request

__all__ = ["EXACT_SCAN", "RunningKeys"]

EXACT_SCAN = False
"""True: the simulator keeps no heap and re-keys every running request at each displacement
check (read when a replica is built; tests compare both paths)."""

T = TypeVar("T")
_Prio = tuple[float | int, ...]


def _neg(key: PolicyKey) -> _Prio:
    return tuple(-x for x in key)


class RunningKeys(Generic[T]):
    """Running items (each with a request) by their policy key, largest first, lazily."""

    __slots__ = (
        "_countdown", "_counter", "_drift", "_epoch", "_fixed", "_kept", "_lapse", "_live", "_memo", "_preemptible",
        "policy",
    )  # fmt: skip

    def __init__(self, policy: Policy, *, preemptible: bool = True) -> None:
        """``preemptible``: only items that ``can_preempt`` allows are found (running requests);
        False for paused ones (waiting requests that hold KV blocks, keyed as the queue keys
        them: a key point is also where a timer re-keys them)."""
        mode = policy.running_keys
        if mode not in RUNNING_KEYS:
            valid = ", ".join(repr(m) for m in RUNNING_KEYS)
            raise ValueError(f"policy {policy.name!r}: running_keys must be one of {valid}, got {mode!r}")
        self.policy = policy
        self._preemptible = preemptible
        self._countdown = mode == "countdown"
        self._lapse = mode != ""  # declared: can_preempt only lapses between key points
        # entries (negated priority, token, item, request); a stale token marks a dead entry
        self._fixed: list[tuple[_Prio, int, T, Request]] = []  # keys that stay or improve
        self._drift: list[tuple[_Prio, int, T, Request]] = []  # countdown decoders, by anchor
        self._live: dict[T, int] = {}
        # the priority of each live item's entry in the fixed heap (not countdown keys): a push of
        # the same priority again is skipped (a request keyed as it was admitted, as its prefill ends)
        self._kept: dict[T, _Prio] = {}
        self._counter = itertools.count()
        self._epoch = policy.key_epoch
        # the last found answer (now, clock, item, request, (key, seq), priority), until a push or drop
        self._memo: tuple[float, int, T, Request, tuple[PolicyKey, int], _Prio] | None = None

    def _prio(self, key: PolicyKey, seq: int, clock: int | None) -> _Prio:
        """The heap priority of ``(key, seq)`` (negated: heapq is a min-heap); a countdown
        decoder's first component is anchored at the decode clock. One- and two-component keys
        (every built-in policy's) are negated without a generator: this runs at every re-key."""
        n = len(key)
        if not self._countdown:
            if n == 1:
                return (-key[0], -seq)
            if n == 2:
                return (-key[0], -key[1], -seq)
            return (*_neg(key), -seq)
        first = key[0]
        whole = math.floor(first)
        anchor = -whole if clock is None else -(whole + clock)
        if n == 1:
            return (anchor, whole - first, -seq)
        return (anchor, whole - first, *_neg(key[1:]), -seq)

    def push(self, item: T, req: Request, now: float, clock: int | None = None) -> None:
        """``item`` runs (or reached a key point): key it now. ``clock``: the engine's decode-step
        count if ``item`` decodes (its key counts down with it), None while it prefills."""
        self._memo = None
        key = self.policy.key(req, now)
        if not self._countdown:
            prio = self._prio(key, req.seq, None)
            if self._kept.get(item) == prio:  # its live entry has that priority: nothing moves
                return
            tok = next(self._counter)
            self._live[item] = tok
            self._kept[item] = prio
            heapq.heappush(self._fixed, (prio, tok, item, req))
            return
        tok = next(self._counter)  # a countdown key: always pushed (its priority moves with the clock)
        self._live[item] = tok
        if len(key) == 1:  # _prio's one-component countdown case, inlined (a push per key point)
            first = key[0]
            whole = math.floor(first)
            if clock is None:
                heapq.heappush(self._fixed, ((-whole, whole - first, -req.seq), tok, item, req))
            else:
                heapq.heappush(self._drift, ((-(whole + clock), whole - first, -req.seq), tok, item, req))
            return
        if clock is not None:
            heapq.heappush(self._drift, (self._prio(key, req.seq, clock), tok, item, req))
            return
        heapq.heappush(self._fixed, (self._prio(key, req.seq, None), tok, item, req))

    def admit(self, item: T, req: Request, now: float, *, last_chunk: bool) -> None:
        """``item`` starts running with a prefill chunk (``last_chunk``: the rest of its prefill).
        A countdown key is pushed as :meth:`push` does unless the chunk is the last: it moves to
        the decoders' heap when its prefill ends with this step (:meth:`decoding`), and no check
        before then can find it. (A check finds only keys above its candidate's; a request admitted
        during a check came off the queue before every later candidate, with the key the queue
        holds: the policy contract keeps a waiting key current.)"""
        if self._countdown and last_chunk:
            self._memo = None
            return
        self.push(item, req, now)

    def chunk_reported(self, item: T, req: Request, now: float) -> None:
        """``item``'s prefill chunk was reported and more of its prefill is left. A policy that
        declares its running keys has a progress hook, which may have moved the key either way
        (LTR's quantum: a chunk is a scheduled step that spends it), so it is re-keyed in place."""
        if self._lapse:
            self.push(item, req, now)

    def decoding(self, item: T, req: Request, now: float, clock: int) -> None:
        """``item`` finished its prefill and decodes from the decode-step count ``clock`` on. The
        prefill's token may have moved its key, so it is re-keyed (a key point): a countdown key
        into the decoders' heap; a bounded one in place. A policy that declares its running keys
        has a progress hook, whose report may move it (LTR's quantum, started by a report of a
        prefill chunk, can end with the prefill's token); and a request evicted one token before a
        rekey hint reaches that hint with the token its recompute ends with (UniBoost's grid), where
        no hint is armed: the bound kept from the prefill would be too low. (A bound unchanged
        files nothing.)"""
        if self._countdown:
            self.push(item, req, now, clock)
        else:
            self.push(item, req, now)

    def drop(self, item: T) -> None:
        """``item`` stopped running."""
        self._live.pop(item, None)
        self._kept.pop(item, None)
        self._memo = None

    def forget(self) -> None:
        """A new displacement check starts: keys may have moved since the last answer."""
        self._memo = None

    def _top(self, clock: int) -> tuple[list[tuple[_Prio, int, T, Request]], _Prio] | None:
        """The heap whose live top has the larger predicted key, and that top's priority now."""
        live, fixed = self._live, self._fixed
        while fixed and live.get(fixed[0][2]) != fixed[0][1]:
            heapq.heappop(fixed)
        if not self._countdown:  # (no decoders' heap)
            return (fixed, fixed[0][0]) if fixed else None
        drift = self._drift
        while drift and live.get(drift[0][2]) != drift[0][1]:
            heapq.heappop(drift)
        if not drift:
            return (fixed, fixed[0][0]) if fixed else None
        prio = drift[0][0]
        prio = (prio[0] + clock, *prio[1:])
        if fixed and fixed[0][0] <= prio:
            return fixed, fixed[0][0]
        return drift, prio

    def worst(
        self,
        above: tuple[PolicyKey, int] | None,
        now: float,
        sync: Callable[[T], None],
        running: Callable[[], Iterable[tuple[T, Request, int | None]]],
        clock: int = 0,
        skip: Request | None = None,
    ) -> tuple[T, tuple[PolicyKey, int]] | None:
        """The running item with the largest ``(key, seq)`` above ``above`` (None: any) that
        ``can_preempt`` allows, with that key; None if there is none. ``sync`` brings an item's counters up to
        date before it is re-keyed; ``running()`` lists every running item with its ``clock``
        argument of :meth:`push` (to re-key them all after a ``key_epoch`` change); ``clock`` is the
        engine's decode-step count now; ``skip``'s item is passed over."""
        policy, live = self.policy, self._live
        if policy.key_epoch != self._epoch:  # every key may have moved: re-key them all
            self._epoch = policy.key_epoch
            self._fixed, self._drift = [], []
            live.clear()
            self._kept.clear()
            self._memo = None
            for item, req, at in running():
                sync(item)
                self.push(item, req, now, at)
        elif len(self._fixed) + len(self._drift) > 4 * len(live) + 64:
            # compact: the live entries stay as they are (still bounds), the dead ones go
            self._fixed = [e for e in self._fixed if live.get(e[2]) == e[1]]
            self._drift = [e for e in self._drift if live.get(e[2]) == e[1]]
            heapq.heapify(self._fixed)
            heapq.heapify(self._drift)
        # Every live entry's priority is that of an upper bound of its item's (key, seq) now (a key
        # only stays or improves between its key points, where it is pushed again; a countdown
        # anchor is exact), and priorities order as (key, seq) do in reverse (keys of one length,
        # as the heap order itself needs). So once the top's priority is at or past ``above``'s,
        # no item is above it: the answer is None without syncing or re-keying the top, which
        # the top's fresh key (at or below its bound) would only confirm. tests/sim/
        # test_running_keys.py checks the answers against a scan of every live key. (A countdown
        # key's first component is split at its floor: a waiting key of inf or NaN has no such
        # priority, and is compared key to key below.)
        limit: _Prio | None
        try:
            limit = None if above is None else self._prio(above[0], above[1], None)
        except (OverflowError, ValueError):
            limit = None
        memo = self._memo
        if memo is not None and memo[0] == now and memo[1] == clock and memo[3] is not skip:
            # nothing pushed or dropped since it was found in this check: the same top, re-keyed
            # to the same key (the loop below would stop at it as it does here)
            if (limit is not None and memo[5] >= limit) or (above is not None and memo[4] <= above):
                return None
            return memo[2], memo[4]
        aside: list[tuple[list[tuple[_Prio, int, T, Request]], tuple[_Prio, int, T, Request]]] = []
        found = None
        while True:
            top = self._top(clock)
            if top is None:
                break
            heap, prio = top
            if limit is not None and prio >= limit:
                break
            _, tok, item, req = heap[0]
            sync(item)
            key = policy.key(req, now)
            fresh = self._prio(key, req.seq, None)
            if fresh != prio:  # it improved since it was keyed: back down with its key now
                at = clock if heap is self._drift else None
                entry = (self._prio(key, req.seq, at), tok, item, req)
                heapq.heapreplace(heap, entry)
                if item in self._kept:
                    self._kept[item] = entry[0]
                continue
            if above is not None and (key, req.seq) <= above:  # (with a limit, prio < limit said no)
                break
            if req is skip:
                aside.append((heap, heapq.heappop(heap)))
                continue
            if self._preemptible and not policy.can_preempt(req, now):
                entry = heapq.heappop(heap)
                if not self._lapse:  # it may be preemptible again at the next check
                    aside.append((heap, entry))
                else:  # out of the heap until it is pushed again (live, with no entry)
                    self._kept.pop(item, None)
                continue
            found = (item, (key, req.seq))
            if not aside:  # (what was set aside is above it: not the answer for another skip)
                self._memo = (now, clock, item, req, found[1], prio)
            break
        for heap, entry in aside:
            heapq.heappush(heap, entry)
        return found
