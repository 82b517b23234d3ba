"""What may stop a request early (:class:`Watch`), and the small async helpers of the exchange."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest

from headway.serve._conn import SEND_TIMED_OUT
from headway.serve._errors import sse_error
from headway.serve._upstream import UpstreamResponse

__all__ = ["STOP_EVENTS", "STOP_REASONS", "Watch", "chain", "either", "wait_disconnect"]


STOP_EVENTS: dict[str, bytes] = {
    "cancelled": sse_error("the request was cancelled", "cancelled", "cancelled"),
    "shutdown": sse_error(
        "the gateway shut down before the stream ended (drain timeout); retry later",
        "service_unavailable",
        "drain_timeout",
    ),
}
"""Why a stream was stopped (:class:`Watch`) -> its final error event and ``[DONE]``."""
STOP_REASONS = {"cancelled": "cancelled", "shutdown": "drain_timeout", "disconnected": "client_disconnected"}
"""Why a request was stopped -> its ``headway_rejections`` reason."""


async def chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``head``, then what ``rest`` yields (a stream whose first piece was read already)."""
    yield head
    async for chunk in rest:
        yield chunk


def either(a: asyncio.Future[Any], b: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    return {a, b}


async def wait_disconnect(request: HTTPRequest) -> None:
    """Return when the client of ``request`` disconnects (the task a :class:`Watch` watches)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class Watch:
    """Why a request should stop early: its client disconnected (``"disconnected"``), it was
    cancelled by API (``"cancelled"``) or the drain timeout ran out (``"shutdown"``)."""

    __slots__ = ("scope", "stop", "task", "upstream")

    def __init__(self, task: asyncio.Future[None], scope: Any = None) -> None:
        self.task = task
        self.scope = scope
        """The client's HTTP request's ASGI scope (where the connection marks a send deadline missed)."""
        self.stop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.upstream: UpstreamResponse | None = None
        """The backend's response being streamed, closed by :meth:`end` to wake the relay."""
        task.add_done_callback(self._on_disconnect)

    def _on_disconnect(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if not self.stop.done():
            self.stop.set_result("disconnected")

    def end(self, reason: str) -> None:
        if not self.stop.done():
            self.stop.set_result(reason)
            if self.upstream is not None:
                self.upstream.close()  # a relay waiting for the backend's next event ends now

    @property
    def send_timed_out(self) -> bool:
        """Whether the client's connection was cut off for taking none of its answer (``_conn``)."""
        return bool(self.scope and self.scope.get(SEND_TIMED_OUT))

    @property
    def reason(self) -> str | None:
        return self.stop.result() if self.stop.done() else None

    def close(self) -> None:
        self.task.cancel()
