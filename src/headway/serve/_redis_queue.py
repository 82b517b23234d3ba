"""Queue state in Redis, so several gateway replicas share one global order and capacity.

The key layout and the Lua scripts (one per state change) are in
:mod:`headway.serve._redis_scripts`; this module is how each replica uses them.

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
replica, except the fair-queueing tags, ``P sfq:*``); all replicas must list the same backends;
saturation polling, per-tenant queue limits and ``router`` are per replica (the shared
dispatcher picks the least-loaded backend with room).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from headway.core import Policy, Request, RequestState, SharedStartTags
from headway.serve._config import redact_url
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError
from headway.serve._redis_scripts import KeyEncodingError, RedisScripts, encode_key, unreachable

__all__ = ["RedisDispatcher"]

log = logging.getLogger("headway.serve.redis")

WALL_EPOCH = 1_700_000_000.0
"""Replicas share the wall clock (seconds since this epoch) so arrival-time keys compare."""


_SHARED_TAG = "serve.shared_start_tag"
"""``Request.extra`` flag: the start tag came from the shared state in Redis."""


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
        self._k_grant = prefix + "grant:" + self.replica
        self._scripts = RedisScripts(redis, prefix, retry_s)
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
        self._scoring_sent: int | None = 0
        """The scoring count in this replica's last message to Redis (None: unknown, send it)."""
        self._scoring_seq = 0
        self._publishing = False
        self._hold_end: asyncio.TimerHandle | None = None

    @property
    def redis_reachable(self) -> bool:
        """False from a failed heartbeat (or an operation out of retries) until Redis answers
        again: the gateway's ``/health`` then says ``degraded``."""
        return self._scripts.reachable

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
                    self._held(await self._scripts.retrying("scoring", args))
                except Exception as exc:
                    self._scoring_sent = None
                    self._scripts.log_error("scoring count", exc)  # stale in Redis: a hold lasts score_hold_s at most
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
            await asyncio.wait_for(self._scripts.run("reap", [self.replica, *self._dispatch_args()]), 2.0)

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

    async def _join(self) -> None:
        """Register under a new generation with the slots this replica really holds."""
        self.gen += 1
        self._owed.clear()  # the join re-declares what we hold: older releases no longer apply
        self._joined.clear()
        held = [(b.url, b.in_flight) for b in self.backends if b.in_flight > 0]
        args: list[Any] = [self.replica, int(self.lease_s * 1000), self.gen, len(held)]
        for url, n in held:
            args += [url, n]
        await self._scripts.retrying("join", args)
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
                ok = await self._scripts.run("heartbeat", [self.replica, int(self.lease_s * 1000), self.gen], side)
                self._scripts.reachable = True
                if not ok:
                    await self._rejoin()
                if self._full_hint:
                    self._full_hint = await side.zcard(self.prefix + "queue") >= self.max_queue_len
                self._publish_scoring_soon()  # a count that could not be sent
                for url, n in list(self._owed.items()):
                    del self._owed[url]
                    args = [self.replica, url, n, self.gen, *self._dispatch_args()]
                    self._held(await self._scripts.run("release", args, side))
                info = await side.info("server")
                if float(info.get("uptime_in_seconds", 0)) >= 2 * self.lease_s:
                    n = self._held(await self._scripts.run("reap", ["", *self._dispatch_args()], side))
                    if n:
                        log.warning("reaped %d replica(s) whose lease expired", n)
                else:  # Redis just restarted: give every replica time to renew first
                    args = [self.replica, "", 0, self.gen, *self._dispatch_args()]
                    self._held(await self._scripts.run("release", args, side))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._scripts.log_error("heartbeat", exc)
                if unreachable(exc):
                    self._scripts.reachable = False

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
                res = self._held(await self._scripts.retrying("enqueue", args))
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
            start = float(_text(await self._scripts.retrying("sfq_tag", [flow, repr(float(increment))])))
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
            await self._scripts.retrying("cancel", [self.replica, member])
        except Exception as exc:
            self._scripts.log_error("cancel", exc)

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
                args = [self.replica, url, n, self.gen, *self._dispatch_args()]
                self._held(await self._scripts.retrying("release", args))
            except Exception as exc:
                self._scripts.log_error("release", exc)
                self._owed[url] += n  # the heartbeat flushes it once Redis is back

    async def _remote_release(self, url: str, gen: int) -> None:
        if not url:
            self._dispatch_pending = False
        try:
            self._held(await self._scripts.retrying("release", [self.replica, url, 1, gen, *self._dispatch_args()]))
        except Exception as exc:
            self._scripts.log_error("release", exc)
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
                self._scripts.log_error("grant listener", exc)
                await asyncio.sleep(0.2)
                continue
            if item is None:
                continue
            member, url, gen = _text(item[1]).rsplit("#", 2)
            request_id = member.rsplit("|", 1)[-1]
            backend = self._by_url.get(url)
            if backend is None:
                log.error("grant for unknown backend %s (replicas must list the same backends)", redact_url(url))
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
            await self._scripts.retrying("sfq_advance", [repr(tag)])
        except Exception as exc:  # a missed advance only lets later tags start lower: logged, not fatal
            self._scripts.log_error("sfq_advance", exc)

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
            removed = await self._scripts.retrying("cancel", [self.replica, member])
        except Exception as exc:
            self._scripts.log_error("rekey", exc)
            return
        if not removed or self._by_id.get(request.request_id) is not request or self._members.get(request) != member:
            return
        self._members.pop(request, None)
        self.queue.rekey(request, self.now())
        await self._enqueue(request)

    def fail_all(self, exc: BaseException) -> None:
        for req in list(self._waiters):
            self._fail(req, exc)
