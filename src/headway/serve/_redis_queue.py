"""Queue state in Redis, so several gateway replicas share one global order and capacity.

Layout (``P`` = the key prefix, ``headway:`` by default; one Redis instance, not a cluster):

``P queue``
    Sorted set, every score 0, so members sort lexicographically. A member is
    ``<policy key><global seq>|<replica>|<request id>``, the key encoded as 16 hex digits
    per element in an order-preserving float encoding: the global order is the policy
    order, ties broken by global arrival sequence (``INCR P seq``).
``P inflight``
    Hash backend URL -> requests in flight on it, over all replicas.
``P held:<replica>``
    Hash backend URL -> the part of ``inflight`` that replica holds (granted, not released).
``P rq:<replica>``
    Set of the replica's members in ``P queue``.
``P exclude``
    Hash member -> comma-separated backend URLs a retried request must avoid.
``P grant:<replica>``
    List of ``<member>#<backend URL>#<generation>``: dispatch decisions for that replica.
``P replicas`` / ``P gen``
    Sorted set replica -> lease expiry (ms, Redis server clock) and hash replica ->
    generation: the live replicas.
``P scoring`` / ``P hold_since``
    Hash replica -> requests it is scoring before they are queued, and when the current
    score hold began (ms): the score hold of the in-memory dispatcher, over all replicas.
``P sfq:v`` / ``P sfq:last``
    For fair-queueing policies (:class:`~headway.core.SharedStartTags`, e.g. tenant-weighted):
    the shared virtual time and hash flow -> last finish tag, from which *sfq_tag* draws each
    request's start tag (its key) before it is enqueued; *sfq_advance* moves the virtual time
    to the start tag of each dispatched request. So tags from every replica compare. (If Redis
    loses its state, tags start again from 0; requests that rejoining replicas re-enqueue keep
    the tags they had, so for a while they queue behind the new ones.)

Every state change is one Lua script (atomic in Redis): *enqueue*, *release*, *cancel*,
*heartbeat*, *join*, *reap*; enqueue, release and reap end with *dispatch*: while the head
of the queue fits a backend with room, ZREM it, count the slot in ``inflight`` and in the
owner's ``held``, and RPUSH the grant to the owner's list. Each replica BLPOPs its own
grant list and resolves the waiting HTTP handler.

**Who dispatches.** The client's HTTP connection is held by the replica it reached, so
only that replica (the *owner*, named in the member) ever sends a request to a backend:
the order and the backend slots are global, the dispatch is local. A request is sent
upstream at most once per grant and a handler's future resolves once, so nothing is
dispatched twice; a grant for a request its owner already dropped (client gone, TTL,
cancelled) is released at once.

**Score hold.** As in memory (:meth:`Dispatcher._holding`), free slots wait while more
requests are being scored than are queued, for at most ``score_hold_s``; here both counts are
global. Each replica sends how many it is scoring (numbered, so a late message cannot undo a
newer one). A scored request's new count travels in its own *enqueue*, so it leaves "being
scored" in the same step as it enters the queue. A script that held returns how long the hold
has left, and the replica asks for a dispatch again when it ends.

**Leases.** Each replica holds a lease in ``P replicas`` that it renews every
``lease_s / 3``. A replica whose lease has expired is presumed dead; any live replica
*reaps* it (one script): its queued entries are removed (their clients were connected to
the dead process, so there is nobody to answer: they are dropped, never dispatched), its
held slots (grants it had not used yet, and requests it had in flight, whose backend
connections died with it) are subtracted from ``inflight`` and its grant list is deleted;
then the freed capacity is dispatched to the next requests in global order. Dispatch also
drops the entries of an owner that is no longer registered. Counters in ``P stats``:
``reaped_replicas``, ``dropped_queued``, ``reclaimed_slots``.

**Fencing and rejoin.** A replica that was reaped while alive (paused past its lease, or
Redis lost its data) notices at its next heartbeat (its lease or generation is gone). It
then *rejoins* under a new generation: it registers again, re-declares the slots it really
holds (its local in-flight count per backend) and re-enqueues every request it still has
waiting. Releases and grants carry the generation, so those from before the rejoin are
ignored and nothing is counted twice.

**Redis restarts.** Every operation is retried on connection errors for up to
``retry_s`` (then the request fails with 503); releases that could not be delivered are
owed and flushed on the next heartbeat. With persistence on (``appendonly yes``) the
queue survives a restart. Leases are not reaped until Redis has been up for two lease
periods, so replicas can renew after a restart before anyone is presumed dead; a replica
whose state was lost (no persistence) rejoins and re-enqueues its waiting requests.

Limits: keys are computed by each replica's own policy instance (learned state is per
replica, except the fair-queueing tags above); all replicas must list the same backends;
saturation polling, per-tenant queue limits and ``router`` are per replica (the shared
dispatcher picks the least-loaded backend with room).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from headway.core import Policy, PolicyKey, Request, RequestState, SharedStartTags
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError

__all__ = ["KeyEncodingError", "RedisDispatcher", "RedisUnavailableError", "encode_key"]

log = logging.getLogger("headway.serve.redis")

WALL_EPOCH = 1_700_000_000.0
"""Replicas share the wall clock (seconds since this epoch) so arrival-time keys compare."""


class RedisUnavailableError(Exception):
    """Redis could not be reached within the retry window."""


_COMMON = """
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local held_ms = 0
local function holding(hold_ms)
  -- the score hold (Dispatcher._holding) over all replicas: while more requests are being
  -- scored (P scoring: replica -> count) than are queued, free slots wait, at most hold_ms
  if hold_ms <= 0 then return false end
  local queued = redis.call('ZCARD', P .. 'queue')
  if queued == 0 then return false end
  local scoring = 0
  for _, v in ipairs(redis.call('HVALS', P .. 'scoring')) do scoring = scoring + tonumber(v) end
  if scoring <= queued then
    redis.call('DEL', P .. 'hold_since')
    return false
  end
  local t = now_ms()
  local since = tonumber(redis.call('GET', P .. 'hold_since') or '-1')
  if since < 0 then
    since = t
    redis.call('SET', P .. 'hold_since', t)
  end
  held_ms = hold_ms - (t - since)
  return held_ms > 0
end
local function set_scoring(r, count, seq)
  -- a replica's scoring count; messages may land out of order: only a newer one counts
  if tonumber(seq) <= tonumber(redis.call('HGET', P .. 'scoring_seq', r) or '-1') then return end
  redis.call('HSET', P .. 'scoring_seq', r, seq)
  if tonumber(count) > 0 then
    redis.call('HSET', P .. 'scoring', r, count)
  else
    redis.call('HDEL', P .. 'scoring', r)
  end
end
local function dispatch(b0)
  if holding(tonumber(ARGV[b0])) then return 0 end
  b0 = b0 + 1
  local qkey, infkey, exkey, reps = P .. 'queue', P .. 'inflight', P .. 'exclude', P .. 'replicas'
  local nb = tonumber(ARGV[b0])
  local granted = 0
  for _ = 1, 1000000 do
    local head = redis.call('ZRANGE', qkey, 0, 15)
    if #head == 0 then break end
    local picked, pick_url, dropped = nil, nil, false
    for _, m in ipairs(head) do
      local owner = string.match(m, '|([^|]*)|[^|]*$')
      if not redis.call('ZSCORE', reps, owner) then
        redis.call('ZREM', qkey, m)
        redis.call('HDEL', exkey, m)
        redis.call('SREM', P .. 'rq:' .. owner, m)
        redis.call('HINCRBY', P .. 'stats', 'dropped_queued', 1)
        dropped = true
        break
      end
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
    if not dropped then
      if picked == nil then break end
      local owner = string.match(picked, '|([^|]*)|[^|]*$')
      redis.call('ZREM', qkey, picked)
      redis.call('HDEL', exkey, picked)
      redis.call('SREM', P .. 'rq:' .. owner, picked)
      redis.call('HINCRBY', infkey, pick_url, 1)
      redis.call('HINCRBY', P .. 'held:' .. owner, pick_url, 1)
      local gen = redis.call('HGET', P .. 'gen', owner) or '0'
      redis.call('RPUSH', P .. 'grant:' .. owner, picked .. '#' .. pick_url .. '#' .. gen)
      granted = granted + 1
    end
  end
  return granted
end
local function reap_one(r, count)
  local members = redis.call('SMEMBERS', P .. 'rq:' .. r)
  for _, m in ipairs(members) do
    redis.call('ZREM', P .. 'queue', m)
    redis.call('HDEL', P .. 'exclude', m)
  end
  local held = redis.call('HGETALL', P .. 'held:' .. r)
  local slots = 0
  for i = 1, #held, 2 do
    local n = tonumber(held[i + 1])
    if n > 0 then
      slots = slots + n
      local v = redis.call('HINCRBY', P .. 'inflight', held[i], -n)
      if v < 0 then redis.call('HSET', P .. 'inflight', held[i], 0) end
    end
  end
  redis.call('DEL', P .. 'rq:' .. r, P .. 'held:' .. r, P .. 'grant:' .. r)
  redis.call('HDEL', P .. 'scoring', r)
  redis.call('HDEL', P .. 'scoring_seq', r)
  redis.call('ZREM', P .. 'replicas', r)
  redis.call('HDEL', P .. 'gen', r)
  if count then
    redis.call('HINCRBY', P .. 'stats', 'reaped_replicas', 1)
    redis.call('HINCRBY', P .. 'stats', 'dropped_queued', #members)
    redis.call('HINCRBY', P .. 'stats', 'reclaimed_slots', slots)
  end
end
"""

# Scripts that dispatch return {result, held_ms}: held_ms > 0 while the score hold keeps free
# slots waiting, for that many more ms (the replica then asks again; see _held).

# ARGV: prefix, replica, keyhex, request_id, max_len, excl, scoring count, its seq, hold_ms, nb, url, lim, ...
# (the count travels with the enqueue: a request leaves "being scored" as it enters the queue)
_ENQUEUE = (
    _COMMON
    + """
local r = ARGV[2]
if not redis.call('ZSCORE', P .. 'replicas', r) then return 'fenced' end
set_scoring(r, ARGV[7], ARGV[8])
if redis.call('ZCARD', P .. 'queue') >= tonumber(ARGV[5]) then return 'full' end
local seq = redis.call('INCR', P .. 'seq')
local m = ARGV[3] .. string.format('%016x', seq) .. '|' .. r .. '|' .. ARGV[4]
redis.call('ZADD', P .. 'queue', 0, m)
redis.call('SADD', P .. 'rq:' .. r, m)
if ARGV[6] ~= '' then redis.call('HSET', P .. 'exclude', m, ARGV[6]) end
dispatch(9)
return {m, held_ms}
"""
)

# ARGV: prefix, replica, url ('' = dispatch only), count, gen, hold_ms, nb, url, lim, ...
_RELEASE = (
    _COMMON
    + """
local r, url = ARGV[2], ARGV[3]
if url ~= '' and redis.call('HGET', P .. 'gen', r) == ARGV[5] then
  local hkey = P .. 'held:' .. r
  local held = tonumber(redis.call('HGET', hkey, url) or '0')
  local n = math.min(held, tonumber(ARGV[4]))
  if n > 0 then
    redis.call('HINCRBY', hkey, url, -n)
    local v = redis.call('HINCRBY', P .. 'inflight', url, -n)
    if v < 0 then redis.call('HSET', P .. 'inflight', url, 0) end
  end
end
local granted = dispatch(6)
return {granted, held_ms}
"""
)

# ARGV: prefix, replica, member
_CANCEL = (
    _COMMON
    + """
local n = redis.call('ZREM', P .. 'queue', ARGV[3])
redis.call('HDEL', P .. 'exclude', ARGV[3])
redis.call('SREM', P .. 'rq:' .. ARGV[2], ARGV[3])
return n
"""
)

# ARGV: prefix, replica, lease_ms, gen  ->  1 renewed, 0 fenced (reaped or state lost)
_HEARTBEAT = (
    _COMMON
    + """
local r = ARGV[2]
if not redis.call('ZSCORE', P .. 'replicas', r) or redis.call('HGET', P .. 'gen', r) ~= ARGV[4] then
  return 0
end
redis.call('ZADD', P .. 'replicas', now_ms() + tonumber(ARGV[3]), r)
return 1
"""
)

# ARGV: prefix, replica, lease_ms, gen, n, url, held, ...   (register, or rejoin after a fence)
_JOIN = (
    _COMMON
    + """
local r = ARGV[2]
reap_one(r, false)
redis.call('ZADD', P .. 'replicas', now_ms() + tonumber(ARGV[3]), r)
redis.call('HSET', P .. 'gen', r, ARGV[4])
for i = 1, tonumber(ARGV[5]) do
  local url, n = ARGV[4 + 2 * i], tonumber(ARGV[5 + 2 * i])
  if n > 0 then
    redis.call('HINCRBY', P .. 'inflight', url, n)
    redis.call('HSET', P .. 'held:' .. r, url, n)
  end
end
return 1
"""
)

# ARGV: prefix, replica ('' = every replica whose lease expired), hold_ms, nb, url, lim, ...
_REAP = (
    _COMMON
    + """
local n = 0
if ARGV[2] ~= '' then
  reap_one(ARGV[2], false)
else
  local dead = redis.call('ZRANGEBYSCORE', P .. 'replicas', '-inf', now_ms())
  for _, r in ipairs(dead) do reap_one(r, true) end
  n = #dead
end
dispatch(3)
return {n, held_ms}
"""
)

# ARGV: prefix, replica, count, seq, gen, hold_ms, nb, url, lim, ...: how many requests this replica is scoring
_SCORING = (
    _COMMON
    + """
local r = ARGV[2]
if redis.call('HGET', P .. 'gen', r) ~= ARGV[5] then return {0, 0} end
set_scoring(r, ARGV[3], ARGV[4])
local granted = dispatch(6)
return {granted, held_ms}
"""
)


# ARGV: prefix, flow, increment  ->  the start tag (a string, to keep every digit)
_SFQ_TAG = (
    _COMMON
    + """
local v = tonumber(redis.call('GET', P .. 'sfq:v') or '0')
local start = math.max(v, tonumber(redis.call('HGET', P .. 'sfq:last', ARGV[2]) or '0'))
redis.call('HSET', P .. 'sfq:last', ARGV[2], string.format('%.17g', start + tonumber(ARGV[3])))
return string.format('%.17g', start)
"""
)

# ARGV: prefix, start tag of a dispatched request
_SFQ_ADVANCE = (
    _COMMON
    + """
local t = tonumber(ARGV[2])
if t > tonumber(redis.call('GET', P .. 'sfq:v') or '0') then
  redis.call('SET', P .. 'sfq:v', string.format('%.17g', t))
end
return 1
"""
)


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises when Redis cannot be reached (retried), as opposed to a refused command."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OSError)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis could not be reached (not that it refused a command)."""
    return isinstance(exc, (*_connection_errors(), RedisUnavailableError))


_SHARED_TAG = "serve.shared_start_tag"
"""``Request.extra`` flag: the start tag came from the shared state in Redis."""


class KeyEncodingError(ValueError):
    """A policy key that the Redis queue cannot encode (an element that is no finite-or-infinite
    float: NaN, or an integer too large for a double)."""


def encode_key(key: PolicyKey) -> str:
    """Order-preserving hex encoding of a policy key (16 hex digits per element).

    Raises :class:`KeyEncodingError` (a ValueError) for an element that is NaN or does not
    fit a double."""
    out = []
    for x in key:
        try:
            f = float(x)
        except (OverflowError, TypeError, ValueError) as exc:
            text = repr(x) if len(repr(x)) <= 40 else f"{repr(x)[:20]}... ({len(repr(x))} characters)"
            raise KeyEncodingError(f"policy key element {text} cannot be queued in Redis: {exc}") from None
        if f != f:
            raise KeyEncodingError("policy key element NaN cannot be queued in Redis (it has no order)")
        bits: int = struct.unpack(">Q", struct.pack(">d", f))[0]
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        out.append(f"{bits:016x}")
    return "".join(out)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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
        lease_s: float = 5.0,
        retry_s: float = 5.0,
        replica: str | None = None,
        listen_redis: Any = None,
        score_hold_s: float = 0.0,
    ) -> None:
        self._scoring = 0
        self._started = False
        self._stopping = False
        self.redis_reachable = True
        """False from a failed heartbeat (or an operation out of retries) until Redis answers
        again: the gateway's ``/health`` then says ``degraded``."""
        super().__init__(
            policy,
            backends,
            max_queue_len=max_queue_len,
            max_queue_per_tenant=max_queue_per_tenant,
            clock=time.monotonic,
            on_dispatch=on_dispatch,
            score_hold_s=score_hold_s,
        )
        self.redis = redis
        self.listen_redis = listen_redis if listen_redis is not None else redis
        """Client for the blocking BLPOP of grants (best on a connection of its own)."""
        self.prefix = prefix
        self.replica = replica or uuid.uuid4().hex[:12]
        self.lease_s = lease_s
        self.retry_s = retry_s
        self._k_grant = prefix + "grant:" + self.replica
        self._scripts = {
            name: redis.register_script(src)
            for name, src in (
                ("enqueue", _ENQUEUE),
                ("release", _RELEASE),
                ("cancel", _CANCEL),
                ("heartbeat", _HEARTBEAT),
                ("join", _JOIN),
                ("reap", _REAP),
                ("scoring", _SCORING),
                ("sfq_tag", _SFQ_TAG),
                ("sfq_advance", _SFQ_ADVANCE),
            )
        }
        self._by_id: dict[str, Request] = {}
        self._members: dict[Request, str] = {}
        self._key_epoch = policy.key_epoch  # the policy's key_epoch when the members' keys were given
        self._enq_epoch: dict[Request, int] = {}
        self._by_url = {b.url: b for b in backends}
        self._listener: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dispatch_pending = False
        self.gen = 0
        """Generation of this replica's registration (bumped by every join)."""
        self._joined = asyncio.Event()
        self._owed: Counter[str] = Counter()
        self._rejoining = False
        self._full_hint = False
        """The shared queue was full when last seen (:meth:`admit`)."""
        self._last_error_log = 0.0
        self._scoring_sent: int | None = 0
        """The scoring count in this replica's last message to Redis (None: unknown, send it)."""
        self._scoring_seq = 0
        self._publishing = False
        self._hold_end: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ score hold
    @property
    def scoring(self) -> int:
        """Requests this replica is scoring; with a score hold, published to ``P scoring``."""
        return self._scoring

    @scoring.setter
    def scoring(self, n: int) -> None:
        self._scoring = n
        self._publish_scoring_soon()

    def _publish_scoring_soon(self) -> None:
        """Send the scoring count unless Redis has it (with a score hold, once started)."""
        if self._started and self.score_hold_s > 0 and not self._publishing and self._scoring_sent != self._scoring:
            self._publishing = True
            self._spawn(self._publish_scoring())

    def _scoring_args(self) -> list[int]:
        """The scoring count and its sequence number, for a message about to be sent."""
        self._scoring_seq += 1
        self._scoring_sent = self._scoring
        return [self._scoring, self._scoring_seq]

    async def _publish_scoring(self) -> None:
        try:
            # a scored request is submitted right after its count drops, and its enqueue carries
            # the new count: let those enqueues go first, so the count never drops before the
            # request is in the queue (which would end a hold without it)
            await asyncio.sleep(0)
            while self._scoring_sent != self._scoring:
                args = [self.replica, *self._scoring_args(), self.gen, *self._dispatch_args()]
                try:
                    self._held(await self._retrying("scoring", args))
                except Exception as exc:
                    self._scoring_sent = None
                    self._log_error("scoring count", exc)  # stale in Redis: a hold lasts score_hold_s at most
                    return
        finally:
            self._publishing = False

    def _held(self, res: Any) -> Any:
        """A dispatching script's result; while the score hold keeps slots waiting, ask again when it ends."""
        if not isinstance(res, list):
            return res  # an early return ('fenced', 'full')
        value, held_ms = res
        if int(held_ms) > 0 and (self._hold_end is None or self._hold_end.cancelled()):
            self._hold_end = asyncio.get_running_loop().call_later(int(held_ms) / 1000 + 0.001, self._end_hold)
        return value

    def _end_hold(self) -> None:
        self._hold_end = None
        self.dispatch()

    # ----------------------------------------------------------------- time
    def now(self) -> float:
        return time.time() - WALL_EPOCH

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Register (retrying while Redis is unreachable) and start the listener and heartbeat."""
        await self._join()
        self._started = True
        self._publish_scoring_soon()  # what arrived before the start
        self._listener = asyncio.create_task(self._listen(), name="grant listener")
        self._heartbeat = asyncio.create_task(self._beat(), name="heartbeat")

    async def stop(self) -> None:
        """Stop listening; return owed slots; deregister (our queue entries go, our slots are freed)."""
        self._stopping = True
        if self._hold_end is not None:
            self._hold_end.cancel()
        for task in (self._heartbeat, self._listener):
            if task is not None:
                task.cancel()
                # bounded: a BLPOP cancelled while its connection is still being set up (a gateway
                # whose port was taken stops right after it started) never finished its cancellation
                done, _ = await asyncio.wait({task}, timeout=2.0)
                if not done:
                    log.warning("redis %s task did not stop within 2 s; leaving it", task.get_name())
        for t in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._script("reap", [self.replica, *self._dispatch_args()]), 2.0)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch_args(self) -> list[str | int]:
        """The dispatch arguments: score hold (ms), then the backends and their limits (-1: none
        now, for a backend that is down or whose own /metrics say it is saturated)."""
        now = self._clock()
        args: list[str | int] = [int(self.score_hold_s * 1000), len(self.backends)]
        for b in self.backends:
            args += [b.url, b.config.max_concurrency if b.has_room(now) else -1]
        return args

    def _log_error(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 2.0:  # at most one line per 2 s during an outage
            self._last_error_log = now
            log.error("redis %s failed: %s: %s", what, type(exc).__name__, exc)

    async def _script(self, name: str, args: list[Any], client: Any = None) -> Any:
        return await self._scripts[name](keys=[], args=[self.prefix, *args], client=client)

    async def _retrying(self, name: str, args: list[Any]) -> Any:
        """Run a script, retrying on connection errors for up to ``retry_s``."""
        retried = _connection_errors()
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                res = await self._script(name, args)
                self.redis_reachable = True
                return res
            except retried as exc:
                self._log_error(name, exc)
                if time.monotonic() + delay > deadline:
                    self.redis_reachable = False
                    raise RedisUnavailableError(f"redis unreachable for {self.retry_s:g} s ({exc})") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _join(self) -> None:
        """Register under a new generation with the slots this replica really holds."""
        self.gen += 1
        self._owed.clear()  # the join re-declares what we hold: older releases no longer apply
        self._joined.clear()
        held = [(b.url, b.in_flight) for b in self.backends if b.in_flight > 0]
        args: list[Any] = [self.replica, int(self.lease_s * 1000), self.gen, len(held)]
        for url, n in held:
            args += [url, n]
        await self._retrying("join", args)
        self._scoring_sent = None  # the join cleared this replica's scoring count
        self._joined.set()
        if self._owed:  # released while the join was under way
            self._spawn(self._flush_owed())

    async def _rejoin(self) -> None:
        if self._rejoining:
            return
        self._rejoining = True
        try:
            log.warning("replica %s lost its lease (reaped or Redis state lost): rejoining", self.replica)
            await self._join()
            self._publish_scoring_soon()  # the join cleared it
            for req in list(self._waiters):
                if req in self.queue:  # still waiting here: enter the shared queue again
                    self._members.pop(req, None)
                    self._spawn(self._enqueue(req))
        finally:
            self._rejoining = False

    async def _beat(self) -> None:
        """Renew the lease, flush owed releases, reap dead replicas, dispatch."""
        period = self.lease_s / 3
        while True:
            await asyncio.sleep(period)
            # on the listener's client: the lease does not wait behind a busy request pool
            side = self.listen_redis
            try:
                ok = await self._script("heartbeat", [self.replica, int(self.lease_s * 1000), self.gen], side)
                self.redis_reachable = True
                if not ok:
                    await self._rejoin()
                if self._full_hint:
                    self._full_hint = await side.zcard(self.prefix + "queue") >= self.max_queue_len
                self._publish_scoring_soon()  # a count that could not be sent
                for url, n in list(self._owed.items()):
                    del self._owed[url]
                    args = [self.replica, url, n, self.gen, *self._dispatch_args()]
                    self._held(await self._script("release", args, side))
                info = await side.info("server")
                if float(info.get("uptime_in_seconds", 0)) >= 2 * self.lease_s:
                    n = self._held(await self._script("reap", ["", *self._dispatch_args()], side))
                    if n:
                        log.warning("reaped %d replica(s) whose lease expired", n)
                else:  # Redis just restarted: give every replica time to renew first
                    args = [self.replica, "", 0, self.gen, *self._dispatch_args()]
                    self._held(await self._script("release", args, side))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._log_error("heartbeat", exc)
                if _unreachable(exc):
                    self.redis_reachable = False

    # -------------------------------------------------------------- arrival
    def admit(self, request: Request) -> None:
        """The per-tenant limit, and the shared queue's as last seen: full since an enqueue found
        it full, until this replica is granted a request or its heartbeat (every ``lease_s / 3``)
        counts room. Redis decides exactly when the request is enqueued (after scoring)."""
        if self._full_hint:
            raise QueueFullError("global")
        self._admit_tenant(request)

    def dispatch_unscored(self, request: Request) -> Backend | None:
        """No fast path with a shared queue: other replicas' requests, queued or being scored,
        may compete for the same slots (and a grant needs Redis anyway)."""
        return None

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
        self._spawn(self._enqueue(request))
        self._arm_rekey(request)
        return fut

    async def _enqueue(self, request: Request) -> None:
        epoch = self._enq_epoch.get(request, 0) + 1
        self._enq_epoch[request] = epoch
        policy = self.policy
        if isinstance(policy, SharedStartTags) and not request.extra.get(_SHARED_TAG):
            tagged = await self._shared_tag(request, policy)
            if not tagged or self._enq_epoch.get(request) != epoch:
                return
        while True:
            waiter = self._waiters.get(request)
            if waiter is None:
                return
            now = self.now()
            excl = ",".join(b.url for b in self.backends if b.index in waiter[1])
            try:
                key = encode_key(self.policy.key(request, now))
            except Exception as exc:  # fail the request now: unhandled here, it would wait out the TTL
                log.error("request %s cannot be queued: %s: %s", request.request_id, type(exc).__name__, exc)
                if not isinstance(exc, ValueError | TypeError | LookupError):
                    exc = KeyEncodingError(f"policy key failed: {type(exc).__name__}: {exc}")
                self._fail(request, exc)
                return
            args = [self.replica, key, request.request_id,
                    self.max_queue_len, excl, *self._scoring_args(), *self._dispatch_args()]  # fmt: skip
            try:
                res = self._held(await self._retrying("enqueue", args))
            except Exception as exc:
                self._scoring_sent = None
                self._publish_scoring_soon()  # the count on its own
                log.error("redis enqueue of %s failed: %s", request.request_id, exc)
                self._fail(request, exc)
                return
            member = _text(res) if res is not None else "full"
            if member != "fenced":
                break
            self._spawn(self._rejoin())
            await self._joined.wait()
            if self._enq_epoch.get(request) != epoch:
                return  # the rejoin enqueued it again
        if member == "full":
            self._full_hint = True
            self._fail(request, QueueFullError("global"))
            return
        if (
            self._by_id.get(request.request_id) is request
            and request in self._waiters
            and (self._enq_epoch.get(request) == epoch)
        ):
            self._members[request] = member
        else:  # cancelled or re-enqueued meanwhile
            await self._cancel_member(member)

    async def _shared_tag(self, request: Request, policy: SharedStartTags) -> bool:
        """Draw the request's start tag from the shared state (False: it failed, or left)."""
        try:
            flow, increment = policy.tag_flow(request)
            if not math.isfinite(increment) or increment < 0:
                raise ValueError(
                    f"tag increment of request {request.request_id} must be finite and >= 0, got {increment}"
                )
            start = float(_text(await self._retrying("sfq_tag", [flow, repr(float(increment))])))
        except Exception as exc:
            log.error(
                "request %s cannot be queued: shared start tag: %s: %s", request.request_id, type(exc).__name__, exc
            )
            self._fail(request, exc)
            return False
        if request not in self._waiters:
            return False  # cancelled meanwhile
        self.queue.remove(request)  # the local mirror holds it under its key: re-add it under the new one
        policy.set_start_tag(request, start)
        request.extra[_SHARED_TAG] = True
        self.queue.add(request, self.now())
        return True

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
        self._enq_epoch.pop(request, None)

    def cancel(self, request: Request) -> bool:
        if not self.queue.remove(request):
            return False
        member = self._members.get(request)
        self._drop(request)
        if member is not None:
            self._spawn(self._cancel_member(member))
        return True

    async def _cancel_member(self, member: str) -> None:
        # 0 removed: it was granted meanwhile; the grant arrives and is released unused
        try:
            await self._retrying("cancel", [self.replica, member])
        except Exception as exc:
            self._log_error("cancel", exc)

    # ------------------------------------------------------------- dispatch
    def dispatch(self) -> int:
        """Ask Redis to dispatch (coalesced); grants arrive through the listener."""
        if not self._dispatch_pending:
            self._dispatch_pending = True
            with contextlib.suppress(RuntimeError):
                self._spawn(self._remote_release("", self.gen))
        return 0

    def release(self, backend: Backend, request: Request | None = None) -> None:
        backend.in_flight -= 1
        backend.note_released(request)
        if not self._joined.is_set():
            # a (re)join is declaring the slots held as of its start, this one included: a
            # release sent now could reach Redis before the join (under a generation not yet
            # registered) and be ignored, and the slot would stay held for good
            self._owed[backend.url] += 1
            return
        self._spawn(self._remote_release(backend.url, self.gen))

    async def _flush_owed(self) -> None:
        """Send the releases deferred while a join was under way (under the new generation)."""
        for url, n in list(self._owed.items()):
            del self._owed[url]
            try:
                self._held(await self._retrying("release", [self.replica, url, n, self.gen, *self._dispatch_args()]))
            except Exception as exc:
                self._log_error("release", exc)
                self._owed[url] += n  # the heartbeat flushes it once Redis is back

    async def _remote_release(self, url: str, gen: int) -> None:
        if not url:
            self._dispatch_pending = False
        try:
            self._held(await self._retrying("release", [self.replica, url, 1, gen, *self._dispatch_args()]))
        except Exception as exc:
            self._log_error("release", exc)
            if url and gen == self.gen:
                self._owed[url] += 1  # flushed by the heartbeat once Redis is back

    async def _listen(self) -> None:
        while not self._stopping:
            try:
                item = await self.listen_redis.blpop([self._k_grant], timeout=1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return  # its connection was closed under it
                self._log_error("grant listener", exc)
                await asyncio.sleep(0.2)
                continue
            if item is None:
                continue
            member, url, gen = _text(item[1]).rsplit("#", 2)
            request_id = member.rsplit("|", 1)[-1]
            backend = self._by_url.get(url)
            if backend is None:
                log.error("grant for unknown backend %s (replicas must list the same backends)", url)
                continue
            if gen != str(self.gen):
                continue  # granted before a rejoin: that slot is not counted any more
            req = self._by_id.get(request_id)
            if req is None or req not in self._waiters or req not in self.queue:
                self._spawn(self._remote_release(url, self.gen))  # dropped meanwhile: give the slot back
                continue
            recorded = self._members.get(req)
            if recorded is not None and recorded != member:
                self._spawn(self._cancel_member(recorded))  # an older entry won: remove the newer one
            self._grant(req, backend)

    def _grant(self, req: Request, backend: Backend) -> None:
        self._full_hint = False  # the shared queue has room again
        fut, _ = self._waiters[req]
        self.queue.remove(req)
        self._drop(req)
        backend.in_flight += 1
        backend.dispatched_since_poll += 1
        req.transition(RequestState.RUNNING)
        now = self.now()
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        if log.isEnabledFor(logging.DEBUG):  # as the in-memory Dispatcher logs it (queued: this replica's)
            log.debug("dispatch %s at %.3f s (waited %.3f s, score %s, %d queued) to %s", req.request_id, now,
                      now - req.arrival_time, req.score, len(self.queue), backend.url)  # fmt: skip
        if self._on_dispatch is not None:
            self._on_dispatch(req, backend)
        if isinstance(self.policy, SharedStartTags) and req.extra.get(_SHARED_TAG):
            tag = self.policy.start_tag(req)
            if tag is not None:
                self._spawn(self._advance(tag))
        if not fut.done():
            fut.set_result(backend)
        else:
            self.release(backend)

    async def _advance(self, tag: float) -> None:
        """The shared virtual time to ``tag`` (a dispatched request's start tag), if later."""
        try:
            await self._retrying("sfq_advance", [repr(tag)])
        except Exception as exc:  # a missed advance only lets later tags start lower: logged, not fatal
            self._log_error("sfq_advance", exc)

    def _rekey(self, request: Request) -> None:
        """Key changed (e.g. starvation promotion): re-enter the global queue with the new key."""
        self._timers.pop(request, None)
        if request in self.queue and request in self._members:
            self._spawn(self._move(request))
        self._arm_rekey(request)

    def sync_keys(self) -> None:
        """The policy bumped ``key_epoch`` (gamma-Ada's new gamma, tenant-sjf's new scale): every
        key it gave is stale, so this replica's queued members re-enter the global queue with
        their new keys (the in-memory queue re-keys itself; Redis holds the keys as given)."""
        epoch = self.policy.key_epoch
        if epoch == self._key_epoch:
            return
        self._key_epoch = epoch
        for request in [r for r in self._members if r in self.queue]:
            self._spawn(self._move(request))

    async def _move(self, request: Request) -> None:
        """Take ``request``'s member out of the global queue and enqueue it again with its key now."""
        member = self._members.get(request)
        if member is None:
            return
        try:
            removed = await self._retrying("cancel", [self.replica, member])
        except Exception as exc:
            self._log_error("rekey", exc)
            return
        if not removed or self._by_id.get(request.request_id) is not request or self._members.get(request) != member:
            return
        self._members.pop(request, None)
        self.queue.rekey(request, self.now())
        await self._enqueue(request)

    def fail_all(self, exc: BaseException) -> None:
        for req in list(self._waiters):
            self._fail(req, exc)
