"""A policy-ordered waiting queue (a heap with lazy deletion).

Shaped like vLLM's ``RequestQueue``: add, pop, peek, remove, ``len``, iteration.
The order is ``policy.key(req, now)`` followed by ``req.seq``; keys are evaluated
when a request is added or re-keyed, never on pop, so every operation is O(log n) (O(1) for
keys that come in order: see :class:`PolicyQueue`).
"""

from __future__ import annotations

import heapq
import itertools
import numbers
from collections import deque
from collections.abc import Iterator

from headway.core._policy import Policy, PolicyKey
from headway.core._request import Request

__all__ = ["PolicyQueue", "check_key"]


def check_key(policy: Policy, key: object) -> None:
    """Raise a ValueError naming ``policy`` if ``key`` is not a tuple of numbers without NaN.

    Engines order by keys without looking at them, so a bad one would pass silently (a NaN
    compares false with everything, which breaks a heap's order without an error) or fail deep
    inside a heap; :class:`PolicyQueue` checks the first key a policy gives it, once."""
    who = f"policy {policy.name!r} ({type(policy).__qualname__})"
    if not isinstance(key, tuple):
        raise ValueError(
            f"{who}: key() must return a tuple of numbers (smaller runs first), got {type(key).__name__} "
            f"{key!r}" + (f": return ({key!r},)" if isinstance(key, numbers.Real) else "")
        )
    for i, x in enumerate(key):
        if not isinstance(x, numbers.Real):
            raise ValueError(
                f"{who}: key() must return a tuple of numbers (smaller runs first), got {key!r}, whose "
                f"element {i} is a {type(x).__name__}: map it to a number (a tier to its rank, say)"
            )
        if x != x:
            raise ValueError(
                f"{who}: key() returned {key!r}, whose element {i} is NaN, which is neither smaller nor "
                "larger than any key, so the queue's order would be wrong: return a number (math.inf to "
                "run last)"
            )


_Entry = tuple[PolicyKey, int, int, Request]
"""A queued request: its key, its ``seq`` and the token of its latest insertion (stale when
``_live`` holds another), then the request."""


def _incomparable(policy: Policy, key: object, exc: TypeError) -> ValueError:
    return ValueError(
        f"policy {policy.name!r} ({type(policy).__qualname__}): key {key!r} cannot be ordered against the "
        f"queue's other keys ({exc}): every key must be a tuple of numbers"
    )


class PolicyQueue:
    """Waiting requests ordered by a :class:`Policy`'s key.

    Two stores keep one order: while the heap is empty, an entry that sorts after the last one
    appended to ``_run`` (a deque kept sorted) goes there; any other goes into the heap (and so
    does every entry while the heap holds any, so that keys out of order cost one store, not
    two), and the first request is the smaller of the two heads. Keys that come in order (FCFS's
    arrivals; a preempted request re-added ahead of them goes to the heap) then cost O(1) to add
    and pop, as vLLM keeps its FCFS waiting queue in a deque and only its priority queue in a
    heap; other keys cost the heap's O(log n) as before. A re-added request's old entry stays in
    the heap, stale, until the heap holds over twice the queued requests: then the stale ones are
    dropped at once (:meth:`_compact`).
    """

    __slots__ = ("_checked", "_counter", "_epoch", "_heap", "_live", "_run", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[_Entry] = []
        self._run: deque[_Entry] = deque()
        self._live: dict[Request, int] = {}
        self._counter = itertools.count()
        self._epoch = policy.key_epoch
        self._checked = False  # the first key is checked (check_key), the rest are trusted

    def add(self, request: Request, now: float) -> None:
        """Insert ``request`` (or re-insert it with a fresh key)."""
        key = self.policy.key(request, now)
        if not self._checked:
            check_key(self.policy, key)
            self._checked = True
        token = next(self._counter)
        self._live[request] = token
        entry = (key, request.seq, token, request)
        run, heap = self._run, self._heap
        try:  # (tokens are unique: comparisons never reach the requests)
            if heap or (run and entry < run[-1]):
                heapq.heappush(heap, entry)
            else:
                run.append(entry)
                return
        except TypeError as exc:
            raise _incomparable(self.policy, key, exc) from None
        if len(heap) > 2 * len(self._live) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the heap's stale entries (re-keyed or removed requests' old ones), which otherwise
        stay until they reach its top: a policy that re-keys waiting requests often (LTR's
        starvation promotions, a timer each) would leave most of the heap stale, and every push and
        pop would sift through it. The live entries are unique, ``(key, seq, token)`` ordered, so
        the queue's order is the same after as before; it runs when the heap holds over twice the
        queued requests, so each entry dropped costs O(1) amortized."""
        live = self._live
        heap = self._heap
        heap[:] = [e for e in heap if live.get(e[3]) == e[2]]
        heapq.heapify(heap)

    rekey = add

    def refresh(self, now: float) -> bool:
        """Re-key every request if the policy bumped ``key_epoch``; returns whether it did."""
        if self.policy.key_epoch == self._epoch:
            return False
        self._epoch = self.policy.key_epoch
        key = self.policy.key
        self._heap = [(key(r, now), r.seq, tok, r) for r, tok in self._live.items()]
        self._run.clear()
        try:
            heapq.heapify(self._heap)
        except TypeError as exc:
            raise _incomparable(self.policy, self._heap[0][0], exc) from None
        return True

    def _first(self) -> _Entry | None:
        """The first live entry (dropping stale ones from both heads), or None."""
        heap, run, live = self._heap, self._run, self._live
        while heap and live.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)
        while run and live.get(run[0][3]) != run[0][2]:
            run.popleft()
        if run:
            return heap[0] if heap and heap[0] < run[0] else run[0]
        return heap[0] if heap else None

    def peek(self) -> Request | None:
        """The request that would be popped next, or None."""
        first = self._first()
        return None if first is None else first[3]

    def peek_key(self) -> PolicyKey | None:
        """The cached key of :meth:`peek`'s request, or None."""
        first = self._first()
        return None if first is None else first[0]

    def head(self) -> tuple[Request, PolicyKey] | None:
        """:meth:`peek`'s request and :meth:`peek_key`'s key together (one pass), or None."""
        first = self._first()
        return None if first is None else (first[3], first[0])

    def pop(self) -> Request:
        """Remove and return the first request; IndexError when empty."""
        first = self._first()
        if first is None:
            raise IndexError("pop from an empty PolicyQueue")
        if self._run and first is self._run[0]:
            self._run.popleft()
        else:
            heapq.heappop(self._heap)
        request = first[3]
        del self._live[request]
        return request

    def remove(self, request: Request) -> bool:
        """Drop ``request`` if queued; returns whether it was."""
        return self._live.pop(request, None) is not None

    def __contains__(self, request: object) -> bool:
        return request in self._live

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def keyed(self) -> Iterator[tuple[Request, PolicyKey]]:
        """Queued requests with their cached keys, in policy order, lazily: the first costs O(n)
        (a copy of the heap), each next one O(log n); the queue must not change meanwhile."""
        live, heap, run = self._live, list(self._heap), self._run
        i = 0
        while True:
            while heap and live.get(heap[0][3]) != heap[0][2]:
                heapq.heappop(heap)
            while i < len(run) and live.get(run[i][3]) != run[i][2]:
                i += 1
            if heap and (i >= len(run) or heap[0] < run[i]):
                entry = heapq.heappop(heap)
            elif i < len(run):
                entry = run[i]
                i += 1
            else:
                return
            yield entry[3], entry[0]

    def __iter__(self) -> Iterator[Request]:
        """Queued requests in policy order (O(n log n); for inspection, not hot paths)."""
        live = self._live
        return iter([e[3] for e in sorted([*self._heap, *self._run]) if live.get(e[3]) == e[2]])
