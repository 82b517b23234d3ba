"""The event kernel: a heap of ``(time, priority, seq, handler, arg)``, as SimPy's core.

The sequence number makes the order total, so two runs of the same inputs pop events
in the same order (never ``id()`` tie-breaks). Priorities order simultaneous events:
arrivals before timers before step ends, so a request arriving exactly at a step
boundary is seen by the next scheduling decision.

**Rounding ties.** An arrival at ``t`` counts as simultaneous with any event at or after
:func:`tie_floor` ``(t)`` (``t`` less a relative ``TIE_RTOL``), and so goes first. Step-by-step
mode adds step times one at a time while the fast-forward sums a stretch in closed form; the
two put the same step end a few ulps apart, and without this an arrival that lands exactly on
it would fall inside the step in one mode and after it in the other. The replica applies the
same rule to the step in flight (``Replica.submit``). A heap event that lost such a tie runs
after the arrival at the arrival's time: the clock never goes back.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ARRIVAL", "STEP_END", "TIE_RTOL", "TIMER", "EventLoop", "tie_floor"]

ARRIVAL = 0
TIMER = 1
STEP_END = 2

# Relative width of a rounding tie: far above the ulps by which the two modes' step ends differ
# (measured: < 2e-15 relative on the property tests' workloads), far below any step time.
TIE_RTOL = 1e-12


def tie_floor(t: float) -> float:
    """The earliest time that counts as simultaneous with an arrival at ``t``."""
    return t - TIE_RTOL * abs(t)


Handler = Callable[[Any], None]


class EventLoop:
    """A discrete-event clock."""

    __slots__ = ("_heap", "_seq", "_stream", "now", "num_events")

    def __init__(self) -> None:
        self.now = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = itertools.count()
        # arrival times, their tie floors, the handler
        self._stream: tuple[Sequence[float], Sequence[float], Callable[[int], None]] | None = None

    def set_arrivals(self, times: Sequence[float], handler: Callable[[int], None]) -> None:
        """A pre-sorted stream of arrival events: ``handler(i)`` at ``times[i]``.

        Merged with the heap as if each were scheduled with priority ``ARRIVAL`` before
        anything else (so they win ties, rounding ties included: see :func:`tie_floor`),
        without paying a heap push and pop each.
        """
        if any(b < a for a, b in itertools.pairwise(times)):
            raise ValueError("arrival times must be sorted")
        self._stream = (times, list(map(tie_floor, times)), handler)

    def schedule(self, time: float, priority: int, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(arg)`` at ``time`` (never earlier than now)."""
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        heapq.heappush(self._heap, (time, priority, next(self._seq), handler, arg))

    def run(self, until: float = math.inf) -> None:
        """Run events in order until none are left or ``until`` is reached."""
        heap, pop = self._heap, heapq.heappop
        times, floors, on_arrival = self._stream if self._stream is not None else ((), (), None)
        i, n = 0, len(times)
        now = self.now  # mirrors self.now (handlers only read it)
        while True:
            # arrivals win ties, rounding ties too (tie_floor): every heap event has priority
            # >= ARRIVAL; one past ``until`` leaves the heap's events up to ``until`` to run
            if i < n and (not heap or floors[i] <= heap[0][0]) and (t := times[i]) <= until:
                self.now = now = t
                self.num_events += 1
                assert on_arrival is not None
                on_arrival(i)
                i += 1
                continue
            if not heap or heap[0][0] > until:
                break
            time, _, _, handler, arg = pop(heap)
            if time > now:  # else it lost a rounding tie to an arrival just run
                self.now = now = time
            self.num_events += 1
            handler(arg)
        self._stream = (times[i:], floors[i:], on_arrival) if on_arrival is not None and i < n else None
