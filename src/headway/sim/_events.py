"""The event kernel: a heap of ``(time, priority, seq, handler, arg)``, as SimPy's core.

The sequence number makes the order total, so two runs of the same inputs pop events
in the same order (never ``id()`` tie-breaks). Priorities order simultaneous events:
arrivals before timers before step ends, so a request arriving exactly at a step
boundary is seen by the next scheduling decision.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ARRIVAL", "STEP_END", "TIMER", "EventLoop"]

ARRIVAL = 0
TIMER = 1
STEP_END = 2

Handler = Callable[[Any], None]


class EventLoop:
    """A discrete-event clock."""

    __slots__ = ("_heap", "_seq", "_stream", "now", "num_events")

    def __init__(self) -> None:
        self.now = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._stream: tuple[Sequence[float], Callable[[int], None]] | None = None

    def set_arrivals(self, times: Sequence[float], handler: Callable[[int], None]) -> None:
        """A pre-sorted stream of arrival events: ``handler(i)`` at ``times[i]``.

        Merged with the heap as if each were scheduled with priority ``ARRIVAL`` before
        anything else (so they win ties), without paying a heap push and pop each.
        """
        if any(b < a for a, b in itertools.pairwise(times)):
            raise ValueError("arrival times must be sorted")
        self._stream = (times, handler)

    def schedule(self, time: float, priority: int, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(arg)`` at ``time`` (never earlier than now)."""
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        heapq.heappush(self._heap, (time, priority, next(self._seq), handler, arg))

    def run(self, until: float = math.inf) -> None:
        """Run events in order until none are left or ``until`` is reached."""
        heap, pop = self._heap, heapq.heappop
        times, on_arrival = self._stream if self._stream is not None else ((), None)
        i, n = 0, len(times)
        while True:
            if i < n and (not heap or times[i] <= heap[0][0]):
                # arrivals win ties: every heap event has priority >= ARRIVAL
                if times[i] > until:
                    break
                self.now = times[i]
                self.num_events += 1
                assert on_arrival is not None
                on_arrival(i)
                i += 1
                continue
            if not heap or heap[0][0] > until:
                break
            time, _, _, handler, arg = pop(heap)
            self.now = time
            self.num_events += 1
            handler(arg)
        self._stream = (times[i:], on_arrival) if on_arrival is not None and i < n else None
