"""Calls between gateway replicas over Redis: the status and cancel of a request another
replica holds.

A request lives on the replica whose connection it came in on (its id names that replica:
``hw-<replica>-<hex>``). Another replica that is asked about it pushes a message onto the
owner's list ``P peer:<replica>`` (``{"op", "id", "tenant", "reply"}``) and waits, up to
``timeout_s``, on the reply list named in it; the owner answers as it would have answered
the client itself (:meth:`PeerChannel.ask` returns that answer, or None when the owner did
not answer in time: gone; :class:`PeerUnavailable` when Redis is unreachable). The tenant
travels with the message, so the owner applies the same rule as for its own clients: another
tenant's request is not found.
Both lists expire after ``_KEY_TTL_S``, so nothing is left behind by a replica that died.

The replica named in an id is the client's word: one that holds no lease (``P replicas``) is not
asked (its request is not found), so that made-up ids neither make Redis keys nor wait; and at
most ``max_asking`` calls wait at once (the others wait for their turn, within the same
timeout), since each holds a connection of the gateway's Redis pool, which the queue needs too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["PeerChannel", "PeerUnavailable", "owner_of"]

log = logging.getLogger("headway.serve.redis")

_KEY_TTL_S = 30

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class PeerUnavailable(Exception):
    """Redis could not carry the call (unreachable or stalled)."""


def owner_of(request_id: str) -> str | None:
    """The replica named in a request id ``hw-<replica>-<hex>`` (None for any other form)."""
    parts = request_id.split("-")
    if len(parts) != 3 or parts[0] != "hw" or not parts[1]:
        return None
    return parts[1]


class PeerChannel:
    """This replica's end: answer messages for it with ``handler``; :meth:`ask` another one."""

    def __init__(
        self, redis: Any, listen_redis: Any, prefix: str, replica: str, handler: Handler, max_asking: int = 8
    ) -> None:
        self._redis = redis
        self._asking = asyncio.Semaphore(max_asking)
        self._listen_redis = listen_redis
        self._prefix = prefix
        self.replica = replica
        self._handler = handler
        self._task: asyncio.Task[None] | None = None

    def _inbox(self, replica: str) -> str:
        return f"{self._prefix}peer:{replica}"

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="peer channel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2.0)

    async def ask(self, replica: str, message: dict[str, Any], timeout_s: float = 2.0) -> dict[str, Any] | None:
        """``replica``'s answer to ``message``, or None if none came within ``timeout_s`` (the
        replica is gone); :class:`PeerUnavailable` when Redis could not carry it."""
        reply = f"{self._prefix}peer-reply:{uuid.uuid4().hex}"
        try:
            async with asyncio.timeout(timeout_s + 1.0), self._asking:
                if await self._redis.zscore(f"{self._prefix}replicas", replica) is None:
                    return None  # no such replica (alive): nobody to ask
                inbox = self._inbox(replica)
                await self._redis.rpush(inbox, json.dumps({**message, "reply": reply}))
                await self._redis.expire(inbox, _KEY_TTL_S)
                item = await self._redis.blpop([reply], timeout=max(1, round(timeout_s)))
        except Exception as exc:  # Redis unreachable or stalled
            raise PeerUnavailable(f"peer call to replica {replica} failed: {type(exc).__name__}: {exc}") from None
        if item is None:
            return None
        answer = json.loads(item[1])
        return answer if isinstance(answer, dict) else None

    async def _serve(self) -> None:
        inbox = self._inbox(self.replica)
        while True:
            try:
                item = await self._listen_redis.blpop([inbox], timeout=1)
                if item is None:
                    continue
                message = json.loads(item[1])
                answer = await self._handler(message)
                reply = str(message["reply"])
                await self._redis.rpush(reply, json.dumps(answer))
                await self._redis.expire(reply, _KEY_TTL_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("peer channel: %s: %s", type(exc).__name__, exc)
                await asyncio.sleep(0.5)
