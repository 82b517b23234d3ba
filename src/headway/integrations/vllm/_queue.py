"""The waiting queue in policy order that replaces vLLM's ``RequestQueue``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from headway.core import PolicyQueue, Request

if TYPE_CHECKING:
    from headway.integrations.vllm._adapter import PolicyAdapter

__all__ = ["HeadwayRequestQueue"]


class HeadwayRequestQueue:
    """A waiting queue in policy order, shaped like vLLM's ``RequestQueue``.

    Holds engine requests; orders them by the policy's key then arrival sequence (a
    :class:`~headway.core.PolicyQueue` underneath: O(log n) add and pop). ``prepend_*``
    re-insert by key: a preempted or skipped request goes where the policy puts it, not
    to the front; but for a policy with :attr:`~headway.core.Policy.arrival_deque` (``fcfs``), to
    the front, as in vLLM's FCFS deque (a preempted request
    ahead of one that arrived before it but was skipped, e.g. waiting for its grammar). Requests
    added since the last step stay unordered until
    :meth:`PolicyAdapter.flush` scores them (peek/pop/iteration flush first); with background
    scoring, until their scores are in.
    """

    __slots__ = ("_a", "_front", "_npending", "_pq")

    def __init__(self, adapter: PolicyAdapter) -> None:
        self._a = adapter
        self._pq = PolicyQueue(adapter.policy)
        self._front: deque[Request] = deque()  # arrival_deque: requests put back, ahead of the rest
        self._npending = 0

    def add_request(self, request: Any) -> None:
        self._a.enqueue(request, self)

    def prepend_request(self, request: Any) -> None:
        self._a.enqueue(request, self, front=True)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Each goes back as :meth:`prepend_request` puts it: with ``arrival_deque`` the last of ``requests``
        ends up first, as vLLM's ``deque.extendleft``."""
        for r in requests:
            self._a.enqueue(r, self, front=True)

    def _head(self) -> Request | None:
        a = self._a
        if a._pending or a._scoring:
            a.flush()
        return self._front[0] if self._front else self._pq.peek()

    def peek_request(self) -> Any:
        t0 = time.perf_counter()
        h = self._head()
        self._a.policy_time += time.perf_counter() - t0
        if h is None:
            raise IndexError("peek from an empty queue")
        return self._a.engine[h]

    def pop_request(self) -> Any:
        t0 = time.perf_counter()
        a = self._a
        if a._pending or a._scoring:
            a.flush()
        if self._front:
            h = self._front.popleft()
        elif self._pq:
            h = self._pq.pop()
        else:
            raise IndexError("pop from an empty queue")
        a._popped.append(h)
        a.policy_time += time.perf_counter() - t0
        return a.engine[h]

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        a = self._a
        for r in requests:
            h = a.reqs.get(r.request_id)
            if h is None:
                continue
            if a._pending.get(h) is self or a._scoring.get(h) is self:
                a.forget_pending(h)
            self._drop(h)

    def _drop(self, h: Request) -> None:
        """Take ``h`` out of the queue, wherever it is (nothing if it is not here)."""
        self._pq.remove(h)
        if self._front and h in self._front:
            self._front.remove(h)

    def __len__(self) -> int:
        return len(self._pq) + len(self._front) + self._npending

    def __bool__(self) -> bool:
        """Whether a request can be taken from the queue: with background scoring, only those whose
        scores are in (vLLM peeks after this says so); its ``len`` counts the others too, so the
        engine keeps stepping while they are scored."""
        if self._npending and self._a._scoring:
            self._a.flush()
            return bool(self._pq) or bool(self._front)
        return self._npending > 0 or bool(self._pq) or bool(self._front)

    def __iter__(self) -> Iterator[Any]:
        if self._a._pending or self._a._scoring:
            self._a.flush()
        engine = self._a.engine
        return iter([engine[h] for h in (*self._front, *self._pq)])

    def __contains__(self, request: object) -> bool:
        h = self._a.reqs.get(getattr(request, "request_id", ""))
        return h is not None and (
            h in self._pq or h in self._front or self._a._pending.get(h) is self or self._a._scoring.get(h) is self
        )
