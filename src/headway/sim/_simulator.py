"""Run a workload through simulated replicas under a policy."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headway.core import Policy, Request, make_policy
from headway.routers import LoadTracker, Router, make_router, policy_estimator
from headway.sim._config import CacheConfig, SchedulerConfig
from headway.sim._cost import CostModel, load_preset
from headway.sim._events import ARRIVAL, EventLoop
from headway.sim._fleet import relative_speeds
from headway.sim._preempt import CLIENT_TIMEOUT
from headway.sim._replica import Replica
from headway.sim._steps import StepRecord
from headway.workload import RequestSpec, Workload

__all__ = ["ReplicaStats", "RouteFn", "SimResult", "simulate"]

RouteFn = Callable[[Request, Sequence[Replica]], int]
"""Picks the index of the replica a request goes to (see :mod:`headway.core` routers)."""


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """What one replica did. Times are seconds on the simulated clock (the first arrival's is the
    workload's own ``arrival_time``)."""

    name: str
    """``replica-<index>``, its index in ``SimResult.replicas`` and ``SimResult.assignment``."""
    preset: str
    """Name of its cost model (``CostModel.name``)."""
    num_gpu_blocks: int
    """Its KV cache's size in blocks (``CacheConfig.block_size`` tokens each)."""
    num_steps: int
    """Engine steps it ran (vLLM's ``schedule()`` calls that scheduled tokens)."""
    num_step_events: int
    """Events that advanced its steps: one per step in step-by-step mode, fewer when decode
    stretches were advanced in closed form."""
    num_preemptions: int
    """Evictions: requests taken out of the batch with their KV blocks freed (short of blocks, or
    displaced in ``evict`` mode; vLLM's ``vllm:num_preemptions``); pauses are ``num_pauses``."""
    num_requests: int
    """Requests routed to it (rejected and aborted ones included)."""
    max_step_tokens: int
    """Most tokens any one step computed (never above ``max_num_batched_tokens``)."""
    timeline: tuple[tuple[float, int, int, int], ...] | None = None
    """(time in seconds, waiting requests, running requests, used KV blocks) after every step event,
    when recorded (``simulate(record_timeline=True)``)."""
    speed: float = 1.0
    """Relative decode throughput the router weighed this replica with (1.0 = fastest)."""
    num_pauses: int = 0
    """Pause-mode displacements (requests taken out of the batch with their KV kept)."""
    prefix_cache_queries: int = 0
    """Prompt tokens of the requests scheduled for the first time (vLLM's ``prefix_cache_queries``)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found in the prefix cache (vLLM's ``prefix_cache_hits``)."""
    steps: tuple[StepRecord, ...] | None = None
    """Every step's decisions (scheduled ids and tokens, preemptions, prefix-cache hits), when
    recorded (``simulate(record_steps=True)``; one record a step in step-by-step mode)."""

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """``prefix_cache_hits / prefix_cache_queries`` (None without prefix caching or queries)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one simulation run; :func:`headway.metrics.summarize` turns ``requests`` into
    latency statistics (times are seconds on the simulated clock)."""

    policy: str
    """The policy's registered name (empty for an unregistered :class:`Policy` instance)."""
    workload: str
    """The workload's name (``"custom"`` for a sequence of :class:`RequestSpec`)."""
    requests: tuple[Request, ...]
    """Every request, in workload order, with its final state and times."""
    replicas: tuple[ReplicaStats, ...]
    """What each replica did, in replica order."""
    num_events: int
    """Events the event loop processed (arrivals, steps, aborts): the simulator's work."""
    wall_time: float
    """Wall-clock seconds the event loop ran (excludes building the workload)."""
    assignment: tuple[int, ...] = field(default=())
    """Replica index of each request (same order as ``requests``)."""
    cpu_time: float = 0.0
    """CPU seconds (``time.process_time``) the event loop took: robust on a busy machine."""
    router: str | None = None
    """Name of the router that spread requests over replicas (None: a ``route`` function or one replica)."""
    scheduler: SchedulerConfig | None = None
    """The engine settings the run used: the given ones, with the policy's own (Sarathi's budget)."""

    @property
    def num_steps(self) -> int:
        """Engine steps of every replica together."""
        return sum(r.num_steps for r in self.replicas)

    @property
    def requests_per_second_wall(self) -> float:
        """Simulated requests per wall-clock second: the simulator's speed."""
        return len(self.requests) / self.wall_time if self.wall_time > 0 else float("inf")


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while the event loop runs (and the policies'
    ``on_workload`` before it), as ``timeit`` does, then restore its state. The loop allocates heap
    entries and tuples by the million, and every few hundred allocations the collector walks the
    young objects, now and then all the requests: about 10 % of a run's CPU time (Azure conv, trail
    and ltr in pause mode), while it finds next to no cycles (reference counting frees the rest as
    before). Nothing the simulation decides depends on it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _chain(first: Callable[[Request], None], then: Callable[[Request], None]) -> Callable[[Request], None]:
    def both(req: Request) -> None:
        first(req)
        then(req)

    return both


def _resolve_policy(policy: Policy | str, policy_kwargs: Mapping[str, Any] | None) -> Policy:
    if isinstance(policy, Policy):
        if policy_kwargs:
            raise ValueError("policy_kwargs apply only when the policy is given by name")
        if policy._simulated:
            raise ValueError(
                f"this {policy.name!r} instance already ran a simulation and keeps what it learned there "
                "(estimates, random draws), so a second run would not repeat the first: pass the policy "
                "by name, or a fresh instance"
            )
        policy._simulated = True
        return policy
    return make_policy(policy, **dict(policy_kwargs or {}))


def _policy_scheduler(policy: Policy, scheduler: SchedulerConfig) -> SchedulerConfig:
    """The engine settings ``policy`` assumes: chunked prefill on, its token budget as a cap."""
    if policy.requires_chunked_prefill and not scheduler.enable_chunked_prefill:
        raise ValueError(f"policy {policy.name!r} needs chunked prefill, which is off")
    budget = policy.token_budget
    if budget is not None and budget < scheduler.max_num_batched_tokens:
        return dataclasses.replace(scheduler, max_num_batched_tokens=budget)
    return scheduler


def _resolve_router(
    router: Router | str | None, router_kwargs: Mapping[str, Any] | None, route: RouteFn | None
) -> Router | None:
    if router is None:
        if router_kwargs:
            raise ValueError("router_kwargs apply only with a router")
        return None
    if route is not None:
        raise ValueError("give either route (a function) or router, not both")
    if isinstance(router, Router):
        if router_kwargs:
            raise ValueError("router_kwargs apply only when the router is given by name")
        return router
    return make_router(router, **dict(router_kwargs or {}))


def simulate(
    workload: Workload | Sequence[RequestSpec],
    policy: Policy | str,
    *,
    preset: str | CostModel | Sequence[str | CostModel] = "llama3-8b-a100",
    scheduler: SchedulerConfig | None = None,
    cache: CacheConfig | None = None,
    num_replicas: int | None = None,
    route: RouteFn | None = None,
    router: Router | str | None = None,
    router_kwargs: Mapping[str, Any] | None = None,
    policy_kwargs: Mapping[str, Any] | None = None,
    record_timeline: bool = False,
    record_steps: bool = False,
) -> SimResult:
    """Simulate ``workload`` under ``policy`` and return every request's outcome.

    ``preset`` is a cost-model name, a :class:`CostModel`, or one per replica for
    heterogeneous fleets (then ``num_replicas`` defaults to their count; otherwise to 1).
    Each replica gets its own policy instance (built from the name and
    ``policy_kwargs``); a :class:`Policy` object is accepted for one replica and one run
    (a second run of the same object is refused: it would start from the first's state). A policy's
    ``token_budget`` (Sarathi's) caps ``scheduler.max_num_batched_tokens``, and one that
    ``requires_chunked_prefill`` is refused without it.

    Several replicas share one arrival stream and need a ``router`` (a
    :class:`~headway.routers.Router` or a registered name, see
    :func:`~headway.routers.available_routers`, with ``router_kwargs``) or, for custom
    logic, a ``route`` function ``(request, replicas) -> index``. A router is reset at
    the start of the run, weighs replicas by their relative speed (from their cost
    models), and gets the policy's length estimate when the policy has one (see
    :func:`~headway.routers.policy_estimator`). ``result.assignment`` says where each
    request went (:func:`headway.sim._fleet.split_by_replica`).

    ``cache.enable_prefix_caching`` (on by default, as in vLLM V1) reuses cached KV blocks
    of the requests' ``block_hashes`` (see :mod:`headway.sim._prefix`); each replica's hits
    are in its :class:`ReplicaStats`. A spec with ``after`` arrives ``think_time`` after the
    request it follows ends, or after its client gave up on it (its ``timeout``; at the earliest
    when the engine took that abort) (closed loop: multi-turn sessions); its ``arrival_time`` is
    then set when it arrives.
    Deterministic: the same inputs (and router seed) give bit-identical results.
    """
    for what, value, want in (("scheduler", scheduler, SchedulerConfig), ("cache", cache, CacheConfig)):
        if value is not None and not isinstance(value, want):
            raise TypeError(f"{what} must be a {want.__name__} or None, got {type(value).__name__} {value!r}")
    scheduler = scheduler or SchedulerConfig()
    cache = cache or CacheConfig()
    if isinstance(workload, str | bytes) or not isinstance(workload, Workload | Iterable):
        raise TypeError(
            f"workload must be a Workload or a sequence of RequestSpec, got {type(workload).__name__} {workload!r} "
            "(headway.workload.load_workload builds one from a name or a file)"
        )
    specs = workload.requests if isinstance(workload, Workload) else tuple(workload)
    stray = next((s for s in specs if not isinstance(s, RequestSpec)), None)
    if stray is not None:
        raise TypeError(f"workload must hold RequestSpec objects, got a {type(stray).__name__}: {stray!r}")
    name = workload.name if isinstance(workload, Workload) else "custom"
    if isinstance(preset, (list, tuple)):
        presets = list(preset)
        if num_replicas is None:
            num_replicas = len(presets)
    else:
        presets = [preset] * (1 if num_replicas is None else max(num_replicas, 0))
    if num_replicas is None:
        num_replicas = 1
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if len(presets) != num_replicas:
        raise ValueError(f"got {len(presets)} presets for {num_replicas} replicas")
    if isinstance(policy, Policy) and num_replicas > 1:
        raise ValueError("pass the policy by name to simulate several replicas (one instance each)")
    rtr = _resolve_router(router, router_kwargs, route)
    if num_replicas > 1 and route is None and rtr is None:
        raise ValueError("several replicas need a router (see headway.routers.available_routers) or a route function")

    loop = EventLoop()
    truth: dict[Request, int] = {}
    replicas: list[Replica] = []
    tracker: LoadTracker | None = None
    for i, p in enumerate(presets):
        cost = p if isinstance(p, CostModel) else load_preset(p)
        pol = _resolve_policy(policy, policy_kwargs)
        if pol.oracle:
            pol.bind_oracle(truth.__getitem__)
        replicas.append(
            Replica(
                loop,
                pol,
                cost,
                _policy_scheduler(pol, scheduler),
                cache,
                name=f"replica-{i}",
                truth=truth,
                record_timeline=record_timeline,
                record_steps=record_steps,
            )
        )
    policy_name = replicas[0].policy.name
    scheduler = replicas[0].cfg  # with the policy's own settings (Sarathi's budget)
    speeds = relative_speeds([r.cost for r in replicas], scheduler, cache, [r.num_blocks for r in replicas])
    if rtr is not None:
        tracker = LoadTracker(speeds=speeds, names=[r.name for r in replicas], length_sums=rtr.needs_length_sums)
        for r in replicas:
            r.on_done = tracker.release

    requests = [s.to_request() for s in specs]
    assignment = [0] * len(requests)
    for i, req in enumerate(requests):
        req.seq = i
    # closed-loop requests (RequestSpec.after) arrive think_time after the one they follow ends
    index = {s.request_id: i for i, s in enumerate(specs)}
    followers: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        if s.after is not None:
            followers.setdefault(index[s.after], []).append(i)
    open_loop = [i for i, s in enumerate(specs) if s.after is None]

    if rtr is not None and tracker is not None:
        rtr.reset()
        lead = replicas[0].policy
        estimate = policy_estimator(lead) if rtr.uses_estimate and rtr.estimate_fn is None else None
        # an oracle policy's estimate (e.g. the noisy oracle) needs the truth before submit
        prime = estimate is not None and lead.oracle
        route_req = rtr.route

        fleet = len(replicas)
        limited = replicas[0].api is not None and fleet > 1

        def elsewhere(req: Request, k: int) -> int:
            """Replica ``k``'s API server turns ``req`` away (HTTP 503): as a load balancer retries
            vLLM's 503 on another instance, the router picks again among the replicas that have not
            turned it away; the last one's rejection stands if every one does."""
            assert tracker is not None
            tried = {k}
            while len(tried) < fleet and replicas[k].turns_away() is not None:
                tracker.release(req)
                k = route_req(req, tracker, [j for j in range(fleet) if j not in tried], estimate=estimate)
                tried.add(k)
            return k

        def arrive(i: int) -> None:
            req = requests[i]
            spec = specs[i]
            if prime:
                truth[req] = min(spec.num_output_tokens, req.max_tokens)
            k = route_req(req, tracker, estimate=estimate)
            if limited:
                k = elsewhere(req, k)
            assignment[i] = k
            replicas[k].submit(req, spec.num_output_tokens, spec.timeout)
    else:

        def arrive(i: int) -> None:
            req = requests[i]
            k = 0 if route is None else route(req, replicas)
            assignment[i] = k
            spec = specs[i]
            replicas[k].submit(req, spec.num_output_tokens, spec.timeout)

    if followers:

        def follow(i: int) -> None:
            requests[i].arrival_time = loop.now
            arrive(i)

        answered: set[int] = set()  # the turns whose clients have had their answer or given up

        def release(req: Request) -> None:
            """The client's next turn comes a think time after it had its answer, or gave up on it
            (its timeout: now, when the client aborts, or the engine took the abort a rounding tie
            earlier; the client does not wait for the engine)."""
            if req.seq in answered:
                return
            answered.add(req.seq)
            done = loop.now
            timeout = specs[req.seq].timeout
            if timeout is not None and req.extra.get("abort_reason") == CLIENT_TIMEOUT:
                done = min(done, req.arrival_time + timeout)
            for j in followers.get(req.seq, ()):
                loop.schedule(max(loop.now, done + specs[j].think_time), ARRIVAL, follow, j)

        for r in replicas:
            done = r.on_done
            r.on_done = release if done is None else _chain(done, release)
            r.on_client_abort = release
        loop.set_arrivals([requests[i].arrival_time for i in open_loop], lambda k: arrive(open_loop[k]))
    else:
        loop.set_arrivals([r.arrival_time for r in requests], arrive)
    c0, t0 = time.process_time(), time.perf_counter()
    with _cyclic_gc_paused():
        for r in replicas:  # (timed: bulk work a policy prepares is part of the run's cost)
            if r.policy.hooks().on_workload:
                r.policy.on_workload(requests)
        loop.run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0

    counts = [0] * num_replicas
    for k in assignment:
        counts[k] += 1
    unfinished = [r.request_id for r in requests if not r.is_finished]
    if unfinished:
        raise RuntimeError(
            f"simulation ended with {len(unfinished)} unfinished requests "
            f"(first: {unfinished[:3]}); this is a simulator bug"
        )
    if tracker is not None and tracker.num_open:
        raise RuntimeError(f"router load tracker still holds {tracker.num_open} requests; this is a simulator bug")
    for r in replicas:
        if r.free != r.num_blocks or r.num_running or r.waiting:
            raise RuntimeError(
                f"{r.name}: KV blocks not conserved at the end ({r.free} free of {r.num_blocks}); "
                "this is a simulator bug"
            )
        if r.api is not None and (r.api.queued_tokens or r.api.dropped):
            raise RuntimeError(
                f"{r.name}: {r.api.queued_tokens} prompt tokens still counted as queued, {len(r.api.dropped)} "
                "aborted requests not taken by the engine at the end; this is a simulator bug"
            )
    stats = tuple(
        ReplicaStats(
            name=r.name,
            preset=r.cost.name,
            num_gpu_blocks=r.num_blocks,
            num_steps=r.num_steps,
            num_step_events=r.num_step_events,
            num_preemptions=r.num_preemptions,
            num_requests=counts[i],
            max_step_tokens=r.max_step_tokens,
            timeline=None if r.timeline is None else tuple(r.timeline),
            speed=speeds[i],
            num_pauses=r.num_pauses,
            prefix_cache_queries=0 if r.cache is None else r.cache.queries,
            prefix_cache_hits=0 if r.cache is None else r.cache.hits,
            steps=None if r.steps is None else tuple(r.steps),
        )
        for i, r in enumerate(replicas)
    )
    return SimResult(
        policy=policy_name,
        workload=name,
        requests=tuple(requests),
        replicas=stats,
        num_events=loop.num_events,
        wall_time=wall,
        assignment=tuple(assignment),
        cpu_time=cpu,
        router=None if rtr is None else rtr.name,
        scheduler=scheduler,
    )
