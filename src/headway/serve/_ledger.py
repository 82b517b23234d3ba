"""The gateway's record of its requests: those open (for status, cancel and the drain), those
recently ended (for status), and the finished ones kept for tests and debugging."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headway.core import Request, RequestState
from headway.serve._watch import Watch

__all__ = ["Ledger", "Open"]


@dataclass(slots=True)
class Open:
    """A request being served (queued, running or streaming) and what may stop it."""

    req: Request
    watch: Watch


class Ledger:
    """Open and recently ended requests, by id; ``now`` is the policy clock."""

    RECENT = 10_000
    """Ended requests remembered for ``GET /v1/requests/{id}``."""
    FINISHED = 4096
    """Finished or aborted requests kept in :attr:`finished_requests` (halved when over)."""

    def __init__(self, id_prefix: str, now: Callable[[], float]) -> None:
        self._id_prefix = id_prefix
        self._now = now
        self.active: dict[str, Open] = {}
        """Requests being served (queued, running or streaming), by id."""
        self.recent: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Recently ended requests: id -> (tenant, final status), bounded."""
        self.finished_requests: list[Request] = []
        """Most recent finished/aborted requests (bounded), for tests and debugging."""

    def new_id(self) -> str:
        """A random id (``hw-`` and 16 hex digits, after the replica's name with Redis): a
        sequential one would tell each tenant how much traffic the others send."""
        while True:
            rid = f"{self._id_prefix}{secrets.token_hex(8)}"
            if rid not in self.active and rid not in self.recent:
                return rid

    def open(self, req: Request, watch: Watch) -> None:
        self.active[req.request_id] = Open(req, watch)

    def ended(self, req: Request, watch: Watch) -> None:
        """``req`` is answered (or its stream over): remembered with its final status."""
        if self.active.pop(req.request_id, None) is not None:
            status = "cancelled" if watch.reason == "cancelled" else req.state.name.lower()
            self.recent[req.request_id] = (req.tenant_id, status)
            if len(self.recent) > self.RECENT:
                self.recent.popitem(last=False)

    def record(self, req: Request) -> None:
        """Keep a finished or aborted request (without its prompt prefix and hashes)."""
        req.prompt = None  # the scored prefix is not needed any more: kept, 4096 of them would weigh
        req.block_hashes = ()  # likewise the prefix hashes (the router read them when it chose)
        self.finished_requests.append(req)
        if len(self.finished_requests) > self.FINISHED:
            del self.finished_requests[: self.FINISHED // 2]

    def abort(self, req: Request) -> None:
        """End ``req`` as aborted, unless it ended already."""
        if not req.is_finished:
            req.transition(RequestState.ABORTED)
            req.finish_time = self._now()
            self.record(req)

    @staticmethod
    def status_of(req: Request) -> str:
        if req.state in (RequestState.WAITING, RequestState.PREEMPTED):
            return "queued"
        return req.state.name.lower()

    def lookup(self, op: str, rid: str, tenant: str) -> dict[str, Any]:
        """Status (``op`` ``"status"``) or cancel (``"cancel"``) of request ``rid`` of ``tenant``
        on this replica: ``{"status": ...}``, ``{"cancelled": True}``, ``{"ended": status}`` or
        ``{"missing": True}`` (none, or another tenant's)."""
        entry = self.active.get(rid)
        if entry is not None and entry.req.tenant_id == tenant:
            if op == "cancel":
                entry.watch.end("cancelled")
                return {"cancelled": True}
            return {"status": self.status_of(entry.req)}
        done = self.recent.get(rid)
        if done is not None and done[0] == tenant:
            return {"ended": done[1]} if op == "cancel" else {"status": done[1]}
        return {"missing": True}

    def end_all(self, reason: str) -> None:
        """Stop every open request (the drain timeout)."""
        for entry in list(self.active.values()):
            entry.watch.end(reason)
