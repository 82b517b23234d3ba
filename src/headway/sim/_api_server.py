"""vLLM's API server in front of a replica: its admission limits (``max_num_queued_reqs``,
``max_num_queued_tokens``), checked on each arriving request before the engine sees it.

The counts are the server's own (its ``OutputProcessor``'s): a request counts from its admission
until its finishing output or its client's abort, which the server takes at once, before the
engine takes it at its step's end; its prompt counts as queued, whole, until its first token.
"""

from __future__ import annotations

from collections.abc import Callable

from headway.core import Request

__all__ = ["ApiServerLimits"]


class ApiServerLimits:
    """The API server's books for one replica (vLLM's ``AsyncLLM.check_admission``)."""

    __slots__ = ("deferred", "dropped", "held", "max_reqs", "max_tokens", "queued_tokens")

    def __init__(self, max_reqs: int | None, max_tokens: int | None) -> None:
        self.max_reqs = max_reqs
        self.max_tokens = max_tokens
        self.queued_tokens = 0  # prompt tokens of the admitted requests without a first token yet
        self.dropped: set[Request] = set()  # forgotten at their clients' aborts, not yet taken by the engine
        self.held: int | None = None  # while outputs are held back (hold): the unfinished requests then
        # (while held) what the engine's outputs tell it, not learnt yet: (this object's method, request)
        self.deferred: list[tuple[Callable[[Request], None], Request]] = []

    def hold(self, held: int) -> None:
        """The engine processes a step's output before the arrivals at its end, which the server checks
        before it learns that output (async scheduling, ``Replica``): until :meth:`release` its counts
        stay as they are, ``held`` unfinished requests and those admitted since."""
        self.held = held

    def release(self) -> None:
        """Learn the outputs held back since :meth:`hold`, in order."""
        self.held = None
        deferred, self.deferred = self.deferred, []
        for learn, req in deferred:
            learn(req)

    def check(self, held: int) -> str | None:
        """The limit a request arriving now breaks (HTTP 503 there), or None; ``held``: the unfinished
        requests the engine holds (the reqs limit first, as vLLM checks)."""
        if self.held is not None:
            held = self.held
        if self.max_reqs is not None and held - len(self.dropped) + 1 > self.max_reqs:
            return "rejected: max_num_queued_reqs"
        if self.max_tokens is not None and self.queued_tokens >= self.max_tokens:
            return "rejected: max_num_queued_tokens"
        return None

    def admitted(self, req: Request) -> None:
        self.queued_tokens += req.num_prompt_tokens
        if self.held is not None:
            self.held += 1

    def first_token(self, req: Request) -> None:
        if self.held is not None:
            self.deferred.append((self.first_token, req))
            return
        if req not in self.dropped:
            self.queued_tokens -= req.num_prompt_tokens

    def client_left(self, req: Request) -> None:
        """Its client aborts ``req``: the server forgets it now (its output processor's ``abort_requests``)."""
        self.dropped.add(req)
        if req.first_token_time is None or (self.held is not None and (self.first_token, req) in self.deferred):
            self.queued_tokens -= req.num_prompt_tokens  # (its first token not learnt yet: held back)

    def engine_took_abort(self, req: Request) -> None:
        if self.held is not None:
            self.deferred.append((self.engine_took_abort, req))
            return
        if req in self.dropped:
            self.dropped.remove(req)
        elif req.first_token_time is None:
            self.queued_tokens -= req.num_prompt_tokens

    def finished(self, req: Request) -> None:
        if self.held is not None:
            self.deferred.append((self.finished, req))
            return
        self.dropped.discard(req)
