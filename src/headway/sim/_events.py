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
from collections.abc import Callable
from typing import Any

__all__ = ["ARRIVAL", "STEP_END", "TIMER", "EventLoop"]

ARRIVAL = 0
TIMER = 1
STEP_END = 2

Handler = Callable[[Any], None]


class EventLoop:
    """A discrete-event clock."""

    __slots__ = ("_heap", "_seq", "now", "num_events")

    def __init__(self) -> None:
        self.now = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = itertools.count()

    def schedule(self, time: float, priority: int, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(arg)`` at ``time`` (never earlier than now)."""
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        heapq.heappush(self._heap, (time, priority, next(self._seq), handler, arg))

    def run(self, until: float = math.inf) -> None:
        """Pop and run events in order until the heap is empty or ``until`` is reached."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            time, _, _, handler, arg = pop(heap)
            self.now = time
            self.num_events += 1
            handler(arg)
