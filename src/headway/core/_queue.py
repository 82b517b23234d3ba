"""A policy-ordered waiting queue (a heap with lazy deletion).

Shaped like vLLM's ``RequestQueue``: add, pop, peek, remove, ``len``, iteration.
The order is ``policy.key(req, now)`` followed by ``req.seq``; keys are evaluated
when a request is added or re-keyed, never on pop, so every operation is O(log n).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from headway.core._policy import Policy, PolicyKey
from headway.core._request import Request

__all__ = ["PolicyQueue"]


class PolicyQueue:
    """Waiting requests ordered by a :class:`Policy`'s key."""

    __slots__ = ("_counter", "_epoch", "_heap", "_live", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[tuple[PolicyKey, int, int, Request]] = []
        self._live: dict[Request, int] = {}
        self._counter = itertools.count()
        self._epoch = policy.key_epoch

    def add(self, request: Request, now: float) -> None:
        """Insert ``request`` (or re-insert it with a fresh key)."""
        token = next(self._counter)
        self._live[request] = token
        heapq.heappush(self._heap, (self.policy.key(request, now), request.seq, token, request))

    rekey = add

    def refresh(self, now: float) -> bool:
        """Re-key every request if the policy bumped ``key_epoch``; returns whether it did."""
        if self.policy.key_epoch == self._epoch:
            return False
        self._epoch = self.policy.key_epoch
        key = self.policy.key
        self._heap = [(key(r, now), r.seq, tok, r) for r, tok in self._live.items()]
        heapq.heapify(self._heap)
        return True

    def _prune(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)

    def peek(self) -> Request | None:
        """The request that would be popped next, or None."""
        self._prune()
        return self._heap[0][3] if self._heap else None

    def peek_key(self) -> PolicyKey | None:
        """The cached key of :meth:`peek`'s request, or None."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    def head(self) -> tuple[Request, PolicyKey] | None:
        """:meth:`peek`'s request and :meth:`peek_key`'s key together (one pass), or None."""
        heap, live = self._heap, self._live
        while heap:
            top = heap[0]
            if live.get(top[3]) == top[2]:
                return top[3], top[0]
            heapq.heappop(heap)
        return None

    def pop(self) -> Request:
        """Remove and return the first request; IndexError when empty."""
        self._prune()
        if not self._heap:
            raise IndexError("pop from an empty PolicyQueue")
        _, _, _, request = heapq.heappop(self._heap)
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

    def __iter__(self) -> Iterator[Request]:
        """Queued requests in policy order (O(n log n); for inspection, not hot paths)."""
        live = self._live
        return iter([e[3] for e in sorted(self._heap) if live.get(e[3]) == e[2]])
