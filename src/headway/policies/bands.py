"""Priority bands around any policy: the flow-control model of llm-d and LiteLLM.

``bands`` composes an *inner* policy (``pars``, ``uniboost``, ``fcfs``, ...) into three levels:

1. **Band.** The request's ``priority`` (OpenAI/vLLM field: lower runs first; ``by="priority"``,
   the default), or its tenant's tier (``by="tier"``: premium, standard, batch), picks a band.
   Bands are served strictly in order: nothing of a later band starts while an earlier band has
   a request waiting, unless ``share`` > 0 (anti-starvation): then, while bands are backlogged,
   band ``i`` gets a share ``(1 - share) * share**i`` of the starts (the last band
   ``share**i``), by start-time fair queueing over bands. ``share = 0.1`` with two backlogged
   bands: about one start in ten goes to the later band.
2. **Tenant flow.** Inside a band each tenant is a flow; flows share starts fairly (equal shares,
   or ``tenant_weights``), again by start-time fair queueing (SFQ, Goyal et al.): each request
   of a flow holds a *slot* tag ``max(v, F_last[flow])`` with ``F_last += 1 / weight``, where
   ``v`` is the band's virtual time (the largest tag that has started).
3. **Inner order.** Inside a tenant's flow the inner policy orders requests: the flow's slot
   tags go to its waiting requests in the inner policy's key order, so a tenant's short request
   (by ``pars``' score, say) takes its flow's next turn, not the turn of its arrival.

The key is ``(band, flow slot, *inner key)`` (with ``share`` > 0, ``(band slot, band, flow slot,
*inner key)``). Because the slots are handed out again when a request joins its flow ahead of
others, such an arrival bumps ``key_epoch`` (the queue re-keys everything: O(n) for that arrival);
arrivals that go to the end of their flow change no key and cost O(log n) (a bisect; the started
requests, which lead their flow, are skipped as they are met). With ``share`` > 0 the band's slots go
out the same way, in ``(flow slot, inner key)`` order; an arrival that moved its flow's later requests
sorts its band again (O(n log n)), as does the first arrival after the inner policy re-keyed. The
inner policy's own hooks (``on_arrival``, ``on_progress``, ``on_finish``, ``can_preempt``, rekey
hints, its displacement mode, its oracle and estimate) are passed through, so one ``bands`` policy
runs unchanged in the simulator, the gateway and the vLLM plugin, which all take a
:class:`~headway.core.Policy`. Around a preemptive inner policy a waiting request displaces a
running one of a later band or flow slot, in the inner policy's mode; never one of its own
flow, whose running requests hold its earlier slots.

A request leaves its flow when its state is no longer ``WAITING`` (the engine started or
aborted it); the virtual times advance when a started request reports progress or finishes, or
when its flow or band next sees an arrival and it leads its flow (an engine starts a flow's
requests in slot order; one started out of that order counts from its first progress). Tags live
in this instance: gateway replicas sharing one Redis queue each keep their own (fair per replica).

Settings: ``inner`` (a registered policy name, default ``fcfs``), ``by`` (``priority`` or
``tier``), ``share`` (0 <= share < 1, default 0), ``tenant_weights`` (tenant -> weight > 0,
default 1 each); every other keyword goes to the inner policy (``scorer``, ``tau``, ...).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from headway.core import (
    Policy,
    PolicyKey,
    Request,
    RequestState,
    get_policy_class,
    make_policy,
    register_policy,
)
from headway.policies._base import ScoredPolicy, check_positive
from headway.routers import policy_estimator

__all__ = ["BandsPolicy"]

_GC_EVERY = 1024
"""Arrivals between two sweeps of idle flows (:meth:`BandsPolicy._forget_idle`)."""
_TAGS = "bands"
"""``request.extra`` entry holding the request's :class:`_Tags`."""


class _Tags:
    """A request's band, its SFQ slot tags and its inner-order key."""

    __slots__ = ("band", "band_tag", "flow_tag", "order")

    def __init__(self, band: int, order: tuple[Any, ...]) -> None:
        self.band = band
        self.order = order
        self.flow_tag = 0.0
        self.band_tag = 0.0


def _tags(request: Request) -> _Tags | None:
    t = request.extra.get(_TAGS)
    return t if isinstance(t, _Tags) else None


def _tags_of(request: Request) -> _Tags:
    t = request.extra[_TAGS]
    assert isinstance(t, _Tags)
    return t


class _Group:
    """One tenant flow's (or, with ``band_level``, one band's) waiting requests in the order their
    slots go out, with their sort keys alongside (``orders``, for a bisect in C) and ``head``, the
    first still counted. A flow sorts by the inner order and hands out flow tags; a band (``share``
    > 0) sorts its requests by ``(flow tag, inner order)`` and hands out band tags. An engine starts
    requests in slot order, so those started lead and are skipped in O(1) instead of shifting the
    list."""

    __slots__ = ("band_level", "dirty", "head", "kept", "last_finish", "orders", "reqs")

    def __init__(self, band_level: bool = False) -> None:
        self.band_level = band_level
        self.reqs: list[Request] = []
        self.orders: list[tuple[Any, ...]] = []
        self.last_finish = 0.0
        self.head = 0
        self.kept = 0
        """Requests kept by the last full :meth:`prune`."""
        self.dirty = False
        """(band level) Flow tags or inner keys of its requests moved since it was last sorted."""

    def key(self, request: Request) -> tuple[Any, ...]:
        t = _tags_of(request)
        return (t.flow_tag, t.order) if self.band_level else t.order

    def tag(self, request: Request) -> float:
        t = _tags_of(request)
        return t.band_tag if self.band_level else t.flow_tag

    def set_tag(self, request: Request, value: float) -> None:
        t = _tags_of(request)
        if self.band_level:
            t.band_tag = value
        else:
            t.flow_tag = value

    @property
    def waiting(self) -> bool:
        """Whether a request waits (after :meth:`prune_front`: the one at ``head``)."""
        return self.head < len(self.reqs)

    def tidy(self) -> None:
        """Skip the started requests that lead, and drop those that left from further in (starts out
        of slot order, aborts) once the list has doubled since it was last pruned whole: amortized
        O(1) per arrival, at most half the list stale."""
        self.prune_front()
        if len(self.reqs) - self.head > 2 * self.kept + 64:
            self.prune()

    def prune_front(self) -> float:
        """Skip the leading requests that are no longer waiting; the largest tag of those started
        (or -inf). O(what it skips), the list compacted once half of it is skipped."""
        reqs = self.reqs
        started = -float("inf")
        i, n = self.head, len(reqs)
        while i < n:
            r = reqs[i]
            if r.state is RequestState.WAITING:
                break
            if r.state is not RequestState.ABORTED:
                started = max(started, self.tag(r))
            i += 1
        if i > 32 and 2 * i > n:
            del reqs[:i]
            del self.orders[:i]
            i = 0
        self.head = i
        return started

    def prune(self) -> float:
        """Drop every request that is no longer waiting; the largest tag of those started there
        (or -inf; those skipped at the head were counted when they were skipped)."""
        del self.reqs[: self.head]
        del self.orders[: self.head]
        self.head = 0
        started = -float("inf")
        if not all(r.state is RequestState.WAITING for r in self.reqs):
            keep: list[Request] = []
            for r in self.reqs:
                if r.state is RequestState.WAITING:
                    keep.append(r)
                elif r.state is not RequestState.ABORTED:
                    started = max(started, self.tag(r))
            self.reqs = keep
            self.orders = [self.key(r) for r in keep]
        self.kept = len(self.reqs)
        return started

    def resort(self) -> None:
        """Sort the (pruned) requests by their keys again; the same tags go out again in that order."""
        slots = sorted(self.tag(r) for r in self.reqs)
        self.reqs.sort(key=self.key)
        self.orders = [self.key(r) for r in self.reqs]
        for r, tag in zip(self.reqs, slots, strict=True):
            self.set_tag(r, tag)
        self.dirty = False

    def place(self, request: Request, key: tuple[Any, ...], slot: float) -> tuple[bool, float]:
        """Put ``request`` (sort key ``key``) in its place; the slots from there on go out again in
        order, ``slot`` (a new one, above every tag here) the last of them: each waiting request
        behind it moves to the next slot. Those behind it no longer waiting leave. Returns whether a
        request moved, and the largest tag of those started that left (or -inf)."""
        reqs, orders = self.reqs, self.orders
        at = bisect.bisect_right(orders, key, self.head)
        if at == len(reqs):  # last in order (FCFS inside a flow): nobody moves
            reqs.append(request)
            orders.append(key)
            self.set_tag(request, slot)
            return False, -float("inf")
        behind: list[Request] = []
        pool: list[float] = []
        started = -float("inf")
        for r in reqs[at:]:  # those no longer waiting leave here (a start out of slot order, an abort)
            if r.state is RequestState.WAITING:
                behind.append(r)
                pool.append(self.tag(r))
            elif r.state is not RequestState.ABORTED:
                started = max(started, self.tag(r))
        pool.append(slot)
        reqs[at:] = [request, *behind]
        orders[at:] = [key, *(self.key(r) for r in behind)]
        for r, tag in zip(reqs[at:], pool, strict=True):
            self.set_tag(r, tag)
        return bool(behind), started


@register_policy("bands")
class BandsPolicy(Policy):
    """Strict priority bands, fair tenant flows inside a band, the inner policy's order in a flow.

    ``share`` > 0 gives later bands a share of the starts (anti-starvation); see the module docstring."""

    def __init__(
        self,
        inner: str | Policy = "fcfs",
        *,
        by: str = "priority",
        share: float = 0.0,
        tenant_weights: Mapping[str, float] | None = None,
        **inner_args: Any,
    ) -> None:
        if by not in ("priority", "tier"):
            raise ValueError(f"bands: by must be 'priority' or 'tier', got {by!r}")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise ValueError(f"bands: share must be a number in [0, 1), got {share!r}")
        if isinstance(inner, Policy):
            if inner_args:
                raise ValueError(f"bands: settings {sorted(inner_args)} need an inner policy name, not an instance")
            self.inner = inner
        elif isinstance(inner, str):
            if inner == "bands":
                raise ValueError("bands: the inner policy cannot be 'bands' itself")
            self.inner = make_policy(inner, **inner_args)
        else:
            raise ValueError(f"bands: inner must be a policy name, got {inner!r}")
        weights = dict(tenant_weights or {})
        for tenant, w in weights.items():
            weights[tenant] = check_positive(f"tenant_weights[{tenant!r}]", w, "bands")
        self.by = by
        self.share = float(share)
        self.tenant_weights = weights
        self.oracle = self.inner.oracle
        self.token_budget = self.inner.token_budget
        # a preemptive inner policy displaces in its own mode (``displacement`` overrides it, as for any
        # policy); left at the class's "none", bands around srpt-oracle displaced nobody
        self.displacement = self.inner.displacement
        self._inner_estimate = policy_estimator(self.inner)
        self._own_epoch = 0
        self._inner_epoch = self.inner.key_epoch
        self._flows: dict[tuple[int, str], _Group] = {}
        self._bands: dict[int, _Group] = {}
        self._band_v: dict[int, float] = {}
        """Virtual time per band (tenant-flow level)."""
        self._v = 0.0
        """Virtual time over bands (``share`` > 0)."""
        self._arrivals = 0

    @staticmethod
    def needs_scorer(policy_args: Mapping[str, Any]) -> bool:
        """Whether these settings make a ``bands`` policy whose inner policy ranks by a length score
        and has no scorer of its own (an engine must then supply ``Request.score``)."""
        inner = policy_args.get("inner", "fcfs")
        if not isinstance(inner, str) or "scorer" in policy_args:
            return False
        try:
            return issubclass(get_policy_class(inner), ScoredPolicy)
        except ValueError:
            return False  # an unknown inner policy: refused when the policy is made

    # ------------------------------------------------------------ properties
    @property
    def key_epoch(self) -> int:
        return self._own_epoch + self.inner.key_epoch

    @key_epoch.setter
    def key_epoch(self, value: int) -> None:
        self._own_epoch = value - self.inner.key_epoch

    @property
    def preemptive(self) -> bool:  # type: ignore[override]
        return self.inner.preemptive

    @property
    def requires_chunked_prefill(self) -> bool:  # type: ignore[override]
        return self.inner.requires_chunked_prefill

    def band_of(self, request: Request) -> int:
        """The request's band: its ``priority``, or its tier's value (``by``)."""
        return int(request.priority) if self.by == "priority" else int(request.tier)

    def _band_weight(self, band: int) -> float:
        ranked = sorted(self._bands)
        i = ranked.index(band)
        return self.share**i if i == len(ranked) - 1 else (1 - self.share) * self.share**i

    # ---------------------------------------------------------------- hooks
    def on_arrival(self, request: Request, now: float) -> None:
        self.inner.on_arrival(request, now)
        self._sync_inner(now)
        band = self.band_of(request)
        tags = _Tags(band, (*self.inner.key(request, now), request.seq))
        request.extra[_TAGS] = tags
        flow = self._flows.get((band, request.tenant_id))
        if flow is None:
            flow = self._flows[(band, request.tenant_id)] = _Group()
        v = max(self._band_v.get(band, 0.0), flow.prune_front())
        # a new slot for the flow (above each of its tags); the flow's slots go to its waiting requests
        # in inner order from where this one goes in
        slot = max(v, flow.last_finish)
        flow.last_finish = slot + 1.0 / self.tenant_weights.get(request.tenant_id, 1.0)
        changed, started = flow.place(request, tags.order, slot)
        self._band_v[band] = max(v, started)
        if self.share > 0:
            changed = self._band_arrival(band, request, moved=changed) or changed
        if changed:
            self._own_epoch += 1
        self._arrivals += 1
        if self._arrivals % _GC_EVERY == 0:
            self._forget_idle()

    def _forget_idle(self) -> None:
        """Drop the state of idle flows: priorities and tenants come from clients, so the number of
        flows seen is unbounded. A band with nothing waiting ends its busy period (as in SFQ, its
        virtual time and flows start afresh); in a busy band, a flow with nothing waiting goes
        once the band's virtual time has passed its last tag (it would start from there anyway)."""
        waiting: set[int] = set()
        for key in list(self._flows):
            flow = self._flows[key]
            flow.tidy()
            if flow.waiting:
                waiting.add(key[0])
        for key in list(self._flows):
            flow = self._flows[key]
            if not flow.waiting and (key[0] not in waiting or flow.last_finish <= self._band_v.get(key[0], 0.0)):
                del self._flows[key]
        for band in [b for b in self._band_v if b not in waiting]:
            del self._band_v[band]
        for band in list(self._bands):
            group = self._bands[band]
            group.tidy()
            if not group.waiting and group.last_finish <= self._v:
                del self._bands[band]

    def _band_arrival(self, band: int, request: Request, moved: bool) -> bool:
        """The band-level slot of an arrival (``share`` > 0): as :meth:`on_arrival`'s flow slot, in the
        band's ``(flow tag, inner order)``. ``moved``: this arrival moved others' flow tags, so the
        band is sorted again (as after the inner policy re-keyed everything)."""
        group = self._bands.get(band)
        if group is None:
            group = self._bands[band] = _Group(band_level=True)
        if moved or group.dirty:
            return self._band_arrival_sorted(group, band, request)
        self._v = max(self._v, group.prune_front())
        slot = max(self._v, group.last_finish)
        group.last_finish = slot + 1.0 / self._band_weight(band)
        changed, started = group.place(request, group.key(request), slot)
        self._v = max(self._v, started)
        return changed

    def _band_arrival_sorted(self, group: _Group, band: int, request: Request) -> bool:
        """:meth:`_band_arrival` sorting the band whole: O(n log n)."""
        self._v = max(self._v, group.prune())
        slot = max(self._v, group.last_finish)
        group.last_finish = slot + 1.0 / self._band_weight(band)
        before = {r: _tags_of(r).band_tag for r in group.reqs}
        _tags_of(request).band_tag = slot
        group.reqs.append(request)
        group.resort()
        return any(_tags_of(r).band_tag != tag for r, tag in before.items())

    def _sync_inner(self, now: float) -> None:
        """The inner policy re-keyed everything: put each flow back in its inner order."""
        if self.inner.key_epoch == self._inner_epoch:
            return
        self._inner_epoch = self.inner.key_epoch
        for flow in self._flows.values():
            flow.prune()
            for r in flow.reqs:
                _tags_of(r).order = (*self.inner.key(r, now), r.seq)
            flow.resort()
        for group in self._bands.values():
            group.dirty = True

    def _started(self, request: Request) -> None:
        t = _tags(request)
        if t is None:
            return
        if t.flow_tag > self._band_v.get(t.band, 0.0):
            self._band_v[t.band] = t.flow_tag
        if t.band_tag > self._v:
            self._v = t.band_tag

    def key(self, request: Request, now: float) -> PolicyKey:
        self._sync_inner(now)
        t = _tags(request)
        if t is None:
            self.on_arrival(request, now)
            t = _tags_of(request)
        inner = self.inner.key(request, now)
        if self.share > 0:
            return (t.band_tag, t.band, t.flow_tag, *inner)
        return (t.band, t.flow_tag, *inner)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        self._started(request)
        self.inner.on_progress(request, now, num_new_tokens)

    def on_finish(self, request: Request, now: float) -> None:
        self._started(request)
        self.inner.on_finish(request, now)

    def can_preempt(self, request: Request, now: float) -> bool:
        return self.inner.can_preempt(request, now)

    def choose_victim(self, running: Sequence[Request], now: float) -> Request:
        return max(running, key=lambda r: (self.key(r, now), r.seq))

    def rekey_after_tokens(self, request: Request) -> int | None:
        return self.inner.rekey_after_tokens(request)

    def rekey_at_time(self, request: Request) -> float | None:
        return self.inner.rekey_at_time(request)

    def expected_output_tokens(self, request: Request) -> float | None:
        """The inner policy's estimate (None when it has none)."""
        return None if self._inner_estimate is None else self._inner_estimate(request)

    def bind_oracle(self, lookup: Callable[[Request], int]) -> None:
        self.inner.bind_oracle(lookup)
        self._oracle_fn = lookup

    def __repr__(self) -> str:
        return f"BandsPolicy(inner={self.inner!r}, by={self.by!r}, share={self.share})"
