"""Clients' aborts (``RequestSpec.timeout``; :meth:`ClientAborts.abort_at`): taken between steps, as
vLLM's ``finish_requests``; a running request's after the step in flight, before the next plan
(with async scheduling: before that step's output if the abort came by the time that plan was
made, else a step later); its blocks are freed as a finished request's
(``test_client_aborts_sim_makes_vllms_decisions``). vLLM's API server, in front, forgets the
request at once: its admission limits (``_api_server.py``) stop counting it before the engine
takes the abort (``test_api_server_limits_sim_make_vllms_decisions``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from headway.core import Request
from headway.sim._async import ASYNC_PLAN_DELAY, AsyncScheduling
from headway.sim._events import TIMER, tie_floor

__all__ = ["ClientAborts"]


class ClientAborts(AsyncScheduling):
    """Clients' aborts and vLLM's API server's limits on a :class:`~headway.sim.Replica` (the replica
    sets every attribute below)."""

    busy: bool  # a step is in flight
    on_client_abort: Callable[[Request], None] | None  # the simulator's: a client gives up now
    outstanding: Callable[[], int]  # the replica's: requests queued or running there
    _cut: Callable[[int], None]  # the replica's: end the stretch in flight after its first m steps
    _truncate: Callable[[float], None]  # the replica's: end the stretch in flight at the step at t

    def turns_away(self) -> str | None:
        """The limit of vLLM's API server that a request arriving now would break (HTTP 503 there), or
        None (none set, or room)."""
        # (async: those in _finishing finished in the step just ended)
        return None if self.api is None else self.api.check(self.outstanding() - len(self._finishing))

    def abort_at(self, req: Request, at: float) -> None:
        """The client aborts ``req`` at time ``at`` if it has not finished by then (its timeout).
        vLLM takes an abort between steps: a waiting request leaves the queue at once, a running
        one when the step in flight ends (a step ending at ``at`` first finishes what it
        finishes), before the next step is planned; its KV blocks are freed as a finished
        request's are. With async scheduling the next step is planned as the one in flight
        starts: an abort by then (``ASYNC_PLAN_DELAY`` after that start) is taken before that
        step's output, so a request finishing in it is aborted; a later one a step later."""
        if req.is_finished:
            return
        heapq.heappush(self._aborts, (at, req.seq, req))
        self.loop.schedule(at, TIMER, self._on_abort, req)

    def _on_abort(self, req: Request) -> None:
        """A client's abort comes (:meth:`abort_at`): a waiting request leaves now, unless a step's
        end takes it, as for a running one (a decode stretch is cut there)."""
        if req.is_finished:
            return
        s = self.seqs[req]
        now = self.loop.now
        if self.api is not None:  # vLLM's API server forgets it now, before the engine takes the abort
            self.api.client_left(req)
        if self.on_client_abort is not None:
            self.on_client_abort(req)
        running = s in self.decoders or s in self.prefilling or s in self._sitting
        if running or (self._async and self.busy and self.plan_n):
            # a step's end takes it (with async scheduling a waiting request's too: the next step's
            # plan, made as the step in flight started, still saw it)
            if self.plan_n > 1:  # the stretch ends there: the step in flight (async: or the next)
                m = self._step_at(tie_floor(now))
                # (async: after that step's plan, a rounding tie counting as by it, as in _apply_aborts)
                if self._async and tie_floor(now) > self.plan_start + self._span(m - 1) + ASYNC_PLAN_DELAY:
                    m += 1
                self._cut(m)
            return
        if self.plan_reported >= 0:
            self._catch_up(tie_floor(now))
        if self.busy and self.plan_n > 1:  # the queue changes: the next step may admit others
            self._truncate(tie_floor(now))
        self._abort(s, now)

    def _apply_aborts(self, now: float, upto: float, before_output: bool = False) -> None:
        """At a step's end: the aborts due by ``upto`` (a rounding tie counts), in the order they
        came; ``before_output``: the step's output is not processed yet (async scheduling)."""
        aborts = self._aborts
        while aborts and tie_floor(aborts[0][0]) <= upto:
            req = heapq.heappop(aborts)[2]
            if not req.is_finished:
                s = self.seqs[req]
                self._abort(s, now, self._async_lag(s) if before_output else 0)
