"""The shared queue's state in Redis: its key layout, the Lua scripts that change it, and
running them while Redis may be away (:class:`RedisScripts`). The protocol that uses them,
replica by replica, is :mod:`headway.serve._redis_queue`'s.

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
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

from headway.core import PolicyKey

__all__ = ["KeyEncodingError", "RedisScripts", "RedisUnavailableError", "encode_key", "unreachable"]

log = logging.getLogger("headway.serve.redis")


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
# slots waiting, for that many more ms (the replica then asks again; see RedisDispatcher._held).

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


_SOURCES = {
    "enqueue": _ENQUEUE,
    "release": _RELEASE,
    "cancel": _CANCEL,
    "heartbeat": _HEARTBEAT,
    "join": _JOIN,
    "reap": _REAP,
    "scoring": _SCORING,
    "sfq_tag": _SFQ_TAG,
    "sfq_advance": _SFQ_ADVANCE,
}


class RedisUnavailableError(Exception):
    """Redis could not be reached within the retry window."""


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises when Redis cannot be reached (retried), as opposed to a refused command."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OSError)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis could not be reached (not that it refused a command)."""
    return isinstance(exc, (*_connection_errors(), RedisUnavailableError))


class RedisScripts:
    """The scripts, registered on a ``redis.asyncio`` client, run under the key ``prefix``;
    :meth:`retrying` retries one on connection errors for up to ``retry_s``."""

    def __init__(self, redis: Any, prefix: str, retry_s: float) -> None:
        self.prefix = prefix
        self.retry_s = retry_s
        self.scripts = {name: redis.register_script(src) for name, src in _SOURCES.items()}
        self.reachable = True
        """False from a failed heartbeat (or an operation out of retries) until Redis answers again."""
        self._last_error_log = 0.0

    def log_error(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 2.0:  # at most one line per 2 s during an outage
            self._last_error_log = now
            log.error("redis %s failed: %s: %s", what, type(exc).__name__, exc)

    async def run(self, name: str, args: list[Any], client: Any = None) -> Any:
        """Run script ``name`` once (on ``client``, else the client it was registered on)."""
        return await self.scripts[name](keys=[], args=[self.prefix, *args], client=client)

    async def retrying(self, name: str, args: list[Any]) -> Any:
        """Run a script, retrying on connection errors for up to ``retry_s``."""
        retried = _connection_errors()
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                res = await self.run(name, args)
                self.reachable = True
                return res
            except retried as exc:
                self.log_error(name, exc)
                if time.monotonic() + delay > deadline:
                    self.reachable = False
                    raise RedisUnavailableError(f"redis unreachable for {self.retry_s:g} s ({exc})") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
