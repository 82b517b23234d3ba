"""The worst-keyed running request, without re-keying every running request each step.

A displacement check needs the running request with the largest ``(key, seq)`` that the
policy lets go (``can_preempt``). The Policy contract says a running request's key may only
stay or improve between its ``rekey_after_tokens`` hints, so a key computed earlier is an
upper bound of its key now. :class:`RunningKeys` keeps those bounds in a max-heap: the top
is re-keyed; if its key improved it goes back down with the new key, else it is the worst
(an exact answer, as a scan of every running request gives). Each request is re-keyed when
it starts running and at each hint (the key may worsen there), and all of them when the
policy's ``key_epoch`` changes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from headway.core import Policy, PolicyKey, Request

__all__ = ["RunningKeys"]

T = TypeVar("T")


def _neg(key: PolicyKey) -> tuple[float | int, ...]:
    return tuple(-x for x in key)


class RunningKeys(Generic[T]):
    """Running items (each with a request) by their policy key, largest first, lazily."""

    __slots__ = ("_counter", "_epoch", "_heap", "_live", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[tuple[tuple[float | int, ...], int, int, T, Request]] = []
        self._live: dict[T, int] = {}
        self._counter = itertools.count()
        self._epoch = policy.key_epoch

    def push(self, item: T, req: Request, now: float) -> None:
        """``item`` runs (or passed a rekey hint): key it now."""
        tok = next(self._counter)
        self._live[item] = tok
        heapq.heappush(self._heap, (_neg(self.policy.key(req, now)), -req.seq, tok, item, req))

    def drop(self, item: T) -> None:
        """``item`` stopped running."""
        self._live.pop(item, None)

    def worst(
        self,
        above: tuple[PolicyKey, int],
        now: float,
        sync: Callable[[T], None],
        running: Callable[[], Iterable[tuple[T, Request]]],
    ) -> tuple[T, tuple[PolicyKey, int]] | None:
        """The running item with the largest ``(key, seq)`` above ``above`` that ``can_preempt``
        allows, with that key; None if there is none. ``sync`` brings an item's counters up to
        date before it is re-keyed; ``running()`` lists every running item (to re-key them all
        after a ``key_epoch`` change, or to compact the heap)."""
        policy, heap, live = self.policy, self._heap, self._live
        if policy.key_epoch != self._epoch or len(heap) > 4 * len(live) + 64:
            self._epoch = policy.key_epoch
            self._heap = heap = []
            live.clear()
            for item, req in running():
                sync(item)
                self.push(item, req, now)
        aside = []
        found = None
        while heap:
            neg, negseq, tok, item, req = heap[0]
            if live.get(item) != tok:
                heapq.heappop(heap)
                continue
            sync(item)
            key = policy.key(req, now)
            fresh = _neg(key)
            if fresh != neg:  # it improved since it was keyed: back down with its key now
                heapq.heapreplace(heap, (fresh, negseq, tok, item, req))
                continue
            if (key, req.seq) <= above:
                break
            if not policy.can_preempt(req, now):
                aside.append(heapq.heappop(heap))
                continue
            found = (item, (key, req.seq))
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found
