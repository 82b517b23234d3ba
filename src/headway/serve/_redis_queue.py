"""Queue state in Redis, so several gateway replicas share one global order and capacity.

Layout (``prefix`` defaults to ``headway:``):

``{prefix}queue``
    Sorted set, every score 0, so members sort lexicographically. A member is
    ``<policy key><global seq>|<replica>|<request id>``, the key encoded as 16 hex digits
    per element in an order-preserving float encoding: the global order is the policy
    order, ties broken by global arrival sequence (``INCR {prefix}seq``).
``{prefix}inflight``
    Hash backend URL -> requests in flight on it, over all replicas.
``{prefix}exclude``
    Hash member -> comma-separated backend URLs a retried request must avoid.
``{prefix}grant:<replica>``
    List of ``<member>#<backend URL>``: dispatch decisions for that replica's requests.

Every state change is one Lua script (atomic in Redis): *enqueue* (length check, seq,
ZADD, then dispatch), *release* (HINCRBY -1, then dispatch) and *dispatch* (while the
head of the queue fits a backend with room: ZREM, HINCRBY +1, RPUSH the grant to the
owner's list). Each replica BLPOPs its own grant list and resolves the waiting HTTP
handler. A grant for a request its replica already dropped (client gone, TTL) is
released at once.

Limits: keys are computed by each replica's own policy instance (learned state is per
replica); all replicas must list the same backends; saturation polling and per-tenant
queue limits are per replica; a replica that dies while holding slots leaks them until
``{prefix}inflight`` is reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from headway.core import Policy, PolicyKey, Request, RequestState
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError

__all__ = ["RedisDispatcher", "encode_key"]

log = logging.getLogger("headway.serve.redis")

WALL_EPOCH = 1_700_000_000.0
"""Replicas share the wall clock (seconds since this epoch) so arrival-time keys compare."""

_DISPATCH_FN = """
local function dispatch(qkey, infkey, exkey, prefix, b0)
  local nb = tonumber(ARGV[b0])
  local granted = 0
  while true do
    local head = redis.call('ZRANGE', qkey, 0, 15)
    if #head == 0 then break end
    local picked, pick_url = nil, nil
    for _, m in ipairs(head) do
      local ex = redis.call('HGET', exkey, m)
      local best, bestload = nil, nil
      for i = 1, nb do
        local url = ARGV[b0 + 2 * i - 1]
        local lim = tonumber(ARGV[b0 + 2 * i])
        if lim >= 0 then
          local cur = tonumber(redis.call('HGET', infkey, url) or '0')
          local excluded = ex and string.find(',' .. ex .. ',', ',' .. url .. ',', 1, true)
          if (lim == 0 or cur < lim) and not excluded then
            local load = cur
            if lim > 0 then load = cur / lim end
            if best == nil or load < bestload then best = url; bestload = load end
          end
        end
      end
      if best ~= nil then picked = m; pick_url = best; break end
      if not ex then break end
    end
    if picked == nil then break end
    redis.call('ZREM', qkey, picked)
    redis.call('HDEL', exkey, picked)
    redis.call('HINCRBY', infkey, pick_url, 1)
    local replica = string.match(picked, '|([^|]*)|[^|]*$')
    redis.call('RPUSH', prefix .. 'grant:' .. replica, picked .. '#' .. pick_url)
    granted = granted + 1
  end
  return granted
end
"""

# KEYS: queue, seq, exclude, inflight; ARGV: keyhex, replica, request_id, max_len, excl, prefix, nb, url, lim...
_ENQUEUE = (
    _DISPATCH_FN
    + """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return false end
local seq = redis.call('INCR', KEYS[2])
local m = ARGV[1] .. string.format('%016x', seq) .. '|' .. ARGV[2] .. '|' .. ARGV[3]
redis.call('ZADD', KEYS[1], 0, m)
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], m, ARGV[5]) end
dispatch(KEYS[1], KEYS[4], KEYS[3], ARGV[6], 7)
return m
"""
)

# KEYS: queue, inflight, exclude; ARGV: url, prefix, nb, url, lim...
_RELEASE = (
    _DISPATCH_FN
    + """
if ARGV[1] ~= '' then
  local n = redis.call('HINCRBY', KEYS[2], ARGV[1], -1)
  if n < 0 then redis.call('HSET', KEYS[2], ARGV[1], 0) end
end
return dispatch(KEYS[1], KEYS[2], KEYS[3], ARGV[2], 3)
"""
)


def encode_key(key: PolicyKey) -> str:
    """Order-preserving hex encoding of a policy key (16 hex digits per element)."""
    out = []
    for x in key:
        bits: int = struct.unpack(">Q", struct.pack(">d", float(x)))[0]
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        out.append(f"{bits:016x}")
    return "".join(out)


class RedisDispatcher(Dispatcher):
    """:class:`Dispatcher` whose queue order and backend capacity live in Redis."""

    def __init__(
        self,
        policy: Policy,
        backends: list[Backend],
        redis: Any,
        *,
        max_queue_len: int,
        max_queue_per_tenant: int = 0,
        prefix: str = "headway:",
        on_dispatch: Callable[[Request, Backend], None] | None = None,
    ) -> None:
        super().__init__(
            policy,
            backends,
            max_queue_len=max_queue_len,
            max_queue_per_tenant=max_queue_per_tenant,
            clock=time.monotonic,
            on_dispatch=on_dispatch,
        )
        self.redis = redis
        self.prefix = prefix
        self.replica = uuid.uuid4().hex[:12]
        self._k_queue = prefix + "queue"
        self._k_seq = prefix + "seq"
        self._k_excl = prefix + "exclude"
        self._k_infl = prefix + "inflight"
        self._k_grant = prefix + "grant:" + self.replica
        self._enqueue_script = redis.register_script(_ENQUEUE)
        self._release_script = redis.register_script(_RELEASE)
        self._by_id: dict[str, Request] = {}
        self._members: dict[Request, str] = {}
        self._by_url = {b.url: b for b in backends}
        self._listener: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dispatch_pending = False

    # ----------------------------------------------------------------- time
    def now(self) -> float:
        return time.time() - WALL_EPOCH

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._listener = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        for t in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 2.0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _backend_args(self) -> list[str | int]:
        now = self._clock()
        args: list[str | int] = [len(self.backends)]
        for b in self.backends:
            down = now < b.down_until
            args += [b.url, -1 if down else b.config.max_concurrency]
        return args

    # -------------------------------------------------------------- arrival
    def submit(self, request: Request, exclude: frozenset[int] = frozenset()) -> asyncio.Future[Any]:
        tenant_key = (request.tenant_id, request.tier.name.lower())
        if self.max_queue_per_tenant and self.queued_per_tenant[tenant_key] >= self.max_queue_per_tenant:
            raise QueueFullError("tenant")
        now = self.now()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if request.seq < 0:
            request.seq = self.next_seq()
            self.policy.on_arrival(request, now)
        self._waiters[request] = (fut, exclude)
        self.queue.add(request, now)  # local mirror: this replica's waiting requests
        self.queued_per_tenant[tenant_key] += 1
        self._by_id[request.request_id] = request
        excl = ",".join(b.url for b in self.backends if b.index in exclude)
        self._spawn(self._enqueue(request, encode_key(self.policy.key(request, now)), excl))
        self._arm_rekey(request)
        return fut

    async def _enqueue(self, request: Request, keyhex: str, excl: str) -> None:
        try:
            member = await self._enqueue_script(
                keys=[self._k_queue, self._k_seq, self._k_excl, self._k_infl],
                args=[keyhex, self.replica, request.request_id, self.max_queue_len, excl, self.prefix,
                      *self._backend_args()],
            )  # fmt: skip
        except Exception as exc:
            log.error("redis enqueue failed: %s", exc)
            self._fail(request, exc)
            return
        if member is None:
            self._fail(request, QueueFullError("global"))
            return
        member = member.decode() if isinstance(member, bytes) else str(member)
        if self._by_id.get(request.request_id) is request:
            self._members[request] = member
        else:  # cancelled while enqueueing
            await self._zrem(member)

    def _fail(self, request: Request, exc: BaseException) -> None:
        waiter = self._waiters.get(request)
        if waiter is None:
            return
        self.queue.remove(request)
        self._drop(request)
        if not waiter[0].done():
            waiter[0].set_exception(exc)

    def _drop(self, request: Request) -> None:
        self._forget(request)
        self._by_id.pop(request.request_id, None)
        self._members.pop(request, None)

    def cancel(self, request: Request) -> bool:
        if not self.queue.remove(request):
            return False
        member = self._members.get(request)
        self._drop(request)
        if member is not None:
            self._spawn(self._zrem(member))
        return True

    async def _zrem(self, member: str) -> None:
        # 0 removed: it was granted meanwhile; the grant arrives and is released unused
        with contextlib.suppress(Exception):
            await self.redis.zrem(self._k_queue, member)
            await self.redis.hdel(self._k_excl, member)

    # ------------------------------------------------------------- dispatch
    def dispatch(self) -> int:
        """Ask Redis to dispatch (coalesced); grants arrive through the listener."""
        if not self._dispatch_pending:
            self._dispatch_pending = True
            with contextlib.suppress(RuntimeError):
                self._spawn(self._remote_release(""))
        return 0

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        backend.finished_since_poll += 1
        self._spawn(self._remote_release(backend.url))

    async def _remote_release(self, url: str) -> None:
        if not url:
            self._dispatch_pending = False
        try:
            await self._release_script(
                keys=[self._k_queue, self._k_infl, self._k_excl], args=[url, self.prefix, *self._backend_args()]
            )
        except Exception as exc:
            log.error("redis release/dispatch failed: %s", exc)

    async def _listen(self) -> None:
        while True:
            try:
                item = await self.redis.blpop([self._k_grant], timeout=1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("redis grant listener: %s", exc)
                await asyncio.sleep(0.5)
                continue
            if item is None:
                continue
            raw = item[1].decode() if isinstance(item[1], bytes) else str(item[1])
            member, _, url = raw.rpartition("#")
            request_id = member.rsplit("|", 1)[-1]
            backend = self._by_url.get(url)
            req = self._by_id.get(request_id)
            if backend is None:
                log.error("grant for unknown backend %s (replicas must list the same backends)", url)
                continue
            if req is None or req not in self._waiters:
                self._spawn(self._remote_release(url))  # dropped meanwhile: give the slot back
                continue
            self._grant(req, backend)

    def _grant(self, req: Request, backend: Backend) -> None:
        fut, _ = self._waiters[req]
        self.queue.remove(req)
        self._drop(req)
        backend.in_flight += 1
        backend.dispatched_since_poll += 1
        req.transition(RequestState.RUNNING)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = self.now()
        if self._on_dispatch is not None:
            self._on_dispatch(req, backend)
        if not fut.done():
            fut.set_result(backend)
        else:
            self.release(backend)

    def _rekey(self, request: Request) -> None:
        """Key changed (e.g. starvation promotion): re-enter the global queue with the new key."""
        self._timers.pop(request, None)
        member = self._members.get(request)
        if request not in self.queue or member is None:
            return

        async def move() -> None:
            removed = await self.redis.zrem(self._k_queue, member)
            if not removed or self._by_id.get(request.request_id) is not request:
                return
            now = self.now()
            self.queue.rekey(request, now)
            _, exclude = self._waiters[request]
            excl = ",".join(b.url for b in self.backends if b.index in exclude)
            await self._enqueue(request, encode_key(self.policy.key(request, now)), excl)

        self._spawn(move())
        self._arm_rekey(request)

    def fail_all(self, exc: BaseException) -> None:
        for req in list(self._waiters):
            self._fail(req, exc)
