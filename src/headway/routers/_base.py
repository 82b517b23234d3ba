"""Routing: which replica (or gateway backend) a request goes to.

Routing decides *where*, each replica's :class:`~headway.core.Policy` decides *when*.
This module holds the interface, the load view and the registry; the built-in routers are
in ``_builtin.py`` and ``_prefix.py``.
Routers are engine-agnostic: they never see a simulator replica or an HTTP backend,
only the small load view :class:`TargetLoad` that a :class:`LoadTracker` keeps per
target. An engine uses them in three calls::

    router = make_router("least-tokens")
    tracker = LoadTracker(num_targets=4)            # or speeds=[1.0, 1.0, 0.3, 0.3]
    k = router.route(request, tracker)              # on arrival: choose + record
    ...
    tracker.release(request)                        # when it finished or was dropped

The tracker counts, per target, the requests routed there and not yet released and
their *outstanding tokens*: each request's *size*, prompt + expected output tokens.
It also keeps them per power-of-two size class (counts, token sums and suffix sums),
all maintained incrementally at ``route``/``release`` (O(size class) each), so every
decision is O(targets) whatever the queue lengths. A request's tokens count in full
until it is released (progress is not subtracted).

**Expected output length.** Routers that weigh requests by length read an
:data:`Estimator` (``request -> expected output tokens``), taken from the first of:

1. the router's own ``estimate_fn=`` (``make_router("length-aware", estimate_fn=f)``);
2. the engine's ``estimate=`` argument to :meth:`Router.route`; the simulator passes
   the policy's estimate (:func:`policy_estimator`: the policy's
   ``expected_output_tokens(request)``, else ``exp(policy.score_of(request))`` for
   score-ranked policies, whose scores are in log-token units);
3. :func:`default_estimate`: ``exp(request.score)`` when the request carries a score,
   else the prompt length (``min(num_prompt_tokens, max_tokens)``): with no predictor,
   a long prompt is taken to mean long work.

**Heterogeneous targets.** Each target has a relative ``speed`` (1.0 for the fastest;
the simulator derives it from the cost model, see :func:`headway.sim._fleet.replica_speed`).
Load-based routers compare load divided by speed; ``round-robin`` becomes smooth
weighted round-robin and ``random`` draws proportionally to speed. On a homogeneous
fleet every speed is 1.0 and the plain definitions hold.

**Candidates.** ``route``/``choose`` take an optional ``candidates`` list of target
indices (a gateway passes the backends that are up and have room); the router then
picks among those only. Each must be a target index, listed once (``ValueError``
otherwise).

**Reproducibility.** Randomized routers draw from ``numpy.random.default_rng(seed)``;
:meth:`Router.reset` (the simulator calls it at the start of every run) restores the
initial state, so the same seed gives bit-identical fleets.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from headway.core import Policy, Request
from headway.core._registry import Registry

__all__ = [
    "CLASS_SHIFT",
    "DEFAULT_ROUTER",
    "LENGTH_CLASSES",
    "Estimator",
    "LoadTracker",
    "Router",
    "SeededRouter",
    "Target",
    "TargetLoad",
    "UnknownRouterError",
    "available_routers",
    "default_estimate",
    "get_router_class",
    "length_class",
    "make_router",
    "policy_estimator",
    "register_router",
]

DEFAULT_ROUTER = "least-outstanding"
"""The router a fleet or a gateway uses when none is named."""

Estimator = Callable[[Request], float]
"""Maps a request to its expected number of output tokens."""

LENGTH_CLASSES = 12
"""Size classes kept per target: class 0 holds sizes below 32 tokens, class ``c`` in
1..10 sizes in ``[2^(c+4), 2^(c+5))`` and class 11 sizes from 32,768 tokens on (few
classes keep the tracker's per-request updates short)."""
CLASS_SHIFT = 5  # sizes below 2^5 share class 0

_RNG_BLOCK = 1024  # uniforms drawn at once by randomized routers


class UnknownRouterError(ValueError):
    """No router is registered under the given name."""


# ------------------------------------------------------------------ estimates
def default_estimate(request: Request) -> float:
    """``exp(request.score)`` (clipped to ``[1, max_tokens]``) if scored, else the prompt length."""
    score = request.score
    if score is not None and math.isfinite(score):
        return min(max(math.exp(min(score, 50.0)), 1.0), float(request.max_tokens))
    return float(min(request.num_prompt_tokens, request.max_tokens))


def policy_estimator(policy: Policy) -> Estimator | None:
    """The expected-output-length estimate a policy offers, or None.

    A policy that overrides :meth:`~headway.core.Policy.expected_output_tokens` gives that;
    otherwise one that overrides :meth:`~headway.core.Policy.score_of` (score-ranked policies
    such as PARS, whose scores are log-token units) gives ``exp(score)`` clipped to
    ``[1, max_tokens]``; a request the policy has no estimate for (None) gets
    :func:`default_estimate`. ``score_of`` caches the score on the request, so calling it at
    routing time does not change what the policy later sees.
    """
    hooks = type(policy).hooks()
    if hooks.expected_output_tokens:
        direct = policy.expected_output_tokens

        def from_tokens(request: Request) -> float:
            value = direct(request)
            return default_estimate(request) if value is None else float(value)

        return from_tokens
    if not hooks.score_of:
        return None
    score_of = policy.score_of

    def from_score(request: Request) -> float:
        s = score_of(request)
        if s is None:
            return default_estimate(request)
        return min(max(math.exp(min(float(s), 50.0)), 1.0), float(request.max_tokens))

    return from_score


def length_class(tokens: float) -> int:
    """Size class of a request size in tokens (see :data:`LENGTH_CLASSES`)."""
    c = int(tokens).bit_length() - CLASS_SHIFT if tokens >= 1.0 else 0
    return 0 if c < 0 else (c if c < LENGTH_CLASSES else LENGTH_CLASSES - 1)


# ------------------------------------------------------------------- load view
class TargetLoad(Protocol):
    """What a router may read about one target (replica or backend)."""

    @property
    def index(self) -> int: ...
    @property
    def speed(self) -> float:
        """Relative throughput (1.0 = the fastest kind of target)."""
        ...

    @property
    def outstanding_requests(self) -> int:
        """Requests routed here and not yet released."""
        ...

    @property
    def outstanding_tokens(self) -> float:
        """Their sizes summed: prompt + expected output tokens."""
        ...

    @property
    def class_requests(self) -> Sequence[int]:
        """Outstanding requests per size class (:func:`length_class` of their size)."""
        ...

    @property
    def class_tokens(self) -> Sequence[float]:
        """Their sizes summed, per size class."""
        ...

    @property
    def longer_requests(self) -> Sequence[int]:
        """``longer_requests[c]``: outstanding requests of a size class above ``c``."""
        ...

    @property
    def longer_tokens(self) -> Sequence[float]:
        """``longer_tokens[c]``: their sizes summed."""
        ...


class Target:
    """Counters of one target, kept by :class:`LoadTracker` (implements :class:`TargetLoad`)."""

    __slots__ = (
        "class_requests",
        "class_tokens",
        "index",
        "longer_requests",
        "longer_tokens",
        "name",
        "outstanding_requests",
        "outstanding_tokens",
        "speed",
    )

    def __init__(self, index: int, speed: float = 1.0, name: str | None = None) -> None:
        if not (speed > 0.0 and math.isfinite(speed)):
            raise ValueError(f"target {index}: speed must be a positive finite number, got {speed!r}")
        self.index = index
        self.name = name if name is not None else f"target-{index}"
        self.speed = float(speed)
        self.outstanding_requests = 0
        self.outstanding_tokens = 0.0
        self.class_requests = [0] * LENGTH_CLASSES
        self.class_tokens = [0.0] * LENGTH_CLASSES
        self.longer_requests = [0] * LENGTH_CLASSES
        self.longer_tokens = [0.0] * LENGTH_CLASSES

    def __repr__(self) -> str:
        return (
            f"Target({self.name!r}, speed={self.speed:g}, requests={self.outstanding_requests}, "
            f"tokens={self.outstanding_tokens:g})"
        )


class LoadTracker:
    """Outstanding load per target, updated when a request is routed and released.

    Engine-agnostic: the simulator releases from its replicas' completion callback,
    the gateway when a proxied response ends. ``release`` of a request that is not
    tracked (never routed, or already released) is a no-op.
    """

    __slots__ = ("_open", "indices", "length_sums", "targets", "uniform")

    def __init__(
        self,
        num_targets: int | None = None,
        *,
        speeds: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
        length_sums: bool = True,
    ) -> None:
        if speeds is None:
            if num_targets is None:
                raise ValueError("LoadTracker needs num_targets or speeds")
            speeds = [1.0] * num_targets
        elif num_targets is not None and num_targets != len(speeds):
            raise ValueError(f"got {len(speeds)} speeds for {num_targets} targets")
        if not speeds:
            raise ValueError("LoadTracker needs at least one target")
        if names is not None and len(names) != len(speeds):
            raise ValueError(f"got {len(names)} names for {len(speeds)} targets")
        self.targets = [Target(i, s, None if names is None else names[i]) for i, s in enumerate(speeds)]
        self.indices = range(len(self.targets))
        """Every target index (the candidates when none are given)."""
        self.uniform = all(t.speed == self.targets[0].speed for t in self.targets)
        """All targets have the same speed (routers then skip the weighting)."""
        self.length_sums = length_sums
        """Keep ``longer_requests``/``longer_tokens`` (O(size class) per request; the
        ``length-aware`` router needs them, see :attr:`Router.needs_length_sums`)."""
        self._open: dict[Request, tuple[Target, float, int]] = {}

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def num_open(self) -> int:
        """Requests routed and not yet released."""
        return len(self._open)

    def target_of(self, request: Request) -> int | None:
        """Index of the target ``request`` was routed to, while it is outstanding."""
        entry = self._open.get(request)
        return None if entry is None else entry[0].index

    def assign(self, request: Request, index: int, tokens: float) -> None:
        """Record that ``request`` of size ``tokens`` (prompt + expected output) went to ``index``."""
        t = self.targets[index]
        c = int(tokens).bit_length() - CLASS_SHIFT if tokens >= 1.0 else 0  # length_class() inlined
        c = 0 if c < 0 else (c if c < LENGTH_CLASSES else LENGTH_CLASSES - 1)
        entry = (t, tokens, c)
        if self._open.setdefault(request, entry) is not entry:
            raise ValueError(f"request {request.request_id!r} is already assigned to a target")
        t.outstanding_requests += 1
        t.outstanding_tokens += tokens
        t.class_requests[c] += 1
        t.class_tokens[c] += tokens
        if c and self.length_sums:  # suffix sums: O(class) here saves routers O(classes) per target
            n_hi, w_hi = t.longer_requests, t.longer_tokens
            for b in range(c):
                n_hi[b] += 1
                w_hi[b] += tokens

    def release(self, request: Request) -> None:
        """``request`` left its target (finished, aborted, failed); untracked requests are ignored."""
        entry = self._open.pop(request, None)
        if entry is None:
            return
        t, tokens, c = entry
        t.outstanding_requests -= 1
        if t.outstanding_requests == 0:  # no float drift on an idle target
            t.outstanding_tokens = 0.0
            t.class_requests[c] = 0
            t.class_tokens[c] = 0.0
            if c and self.length_sums:
                t.longer_requests = [0] * LENGTH_CLASSES
                t.longer_tokens = [0.0] * LENGTH_CLASSES
            return
        t.outstanding_tokens -= tokens
        t.class_requests[c] -= 1
        t.class_tokens[c] = t.class_tokens[c] - tokens if t.class_requests[c] else 0.0
        if c and self.length_sums:
            n_hi, w_hi = t.longer_requests, t.longer_tokens
            for b in range(c):
                n_hi[b] -= 1
                w_hi[b] = w_hi[b] - tokens if n_hi[b] else 0.0


# ---------------------------------------------------------------------- routers
class Router(ABC):
    """Base class of routers: pick a target index for each arriving request.

    Subclasses implement :meth:`_choose`; engines call :meth:`route` (choose and record
    in a :class:`LoadTracker`) or :meth:`choose` (choose only).
    """

    name: ClassVar[str] = ""
    """Registry name in kebab case (set by :func:`register_router`)."""
    uses_estimate: ClassVar[bool] = False
    """Whether decisions depend on the expected output length."""
    uses_block_hashes: ClassVar[bool] = False
    """Whether decisions read the request's :attr:`~headway.core.Request.block_hashes` (engines
    that must compute them, such as the gateway from the prompt text, skip that work otherwise)."""
    randomized: ClassVar[bool] = False
    """Whether the router draws random numbers (then it takes ``seed=``)."""
    needs_length_sums: bool = False
    """Whether decisions read ``longer_requests``/``longer_tokens`` (a tracker with
    ``length_sums=True``, the default)."""

    def __init__(self, *, estimate_fn: Estimator | None = None) -> None:
        if estimate_fn is not None and not callable(estimate_fn):
            raise ValueError(f"{self.name}: estimate_fn must be a callable Request -> float")
        self.estimate_fn = estimate_fn
        self._turn = 0

    # ---------------------------------------------------------------- engine API
    def reset(self) -> None:
        """Forget all routing state (counters, random draws): a fresh run starts."""
        self._turn = 0

    def _rotated(self, candidates: Sequence[int]) -> list[int]:
        """``candidates`` starting after the last pick, so that ties rotate (round-robin).

        Call :meth:`_picked` with the position of the pick in this list.
        """
        s = self._turn % len(candidates)
        self._turn = s
        return [*candidates[s:], *candidates[:s]]

    def _picked(self, position: int) -> None:
        self._turn += position + 1

    def _check_candidates(self, candidates: Sequence[int], num_targets: int) -> None:
        """``ValueError`` unless ``candidates`` are distinct target indices (at least one)."""
        if not candidates:
            raise ValueError(f"{self.name}: empty candidate list")
        seen: set[int] = set()
        for i in candidates:
            if isinstance(i, bool) or not isinstance(i, Integral) or not 0 <= i < num_targets:
                raise ValueError(
                    f"{self.name}: candidate {i!r} is not a target index (there are {num_targets} targets, "
                    f"0..{num_targets - 1})"
                )
            if i in seen:
                raise ValueError(f"{self.name}: candidate {i!r} is listed more than once in {list(candidates)}")
            seen.add(i)

    def expected_output(self, request: Request, estimate: Estimator | None = None) -> float:
        """Expected output tokens of ``request`` (see the module docs for the order)."""
        fn = self.estimate_fn or estimate
        if fn is None:
            return default_estimate(request)
        value = float(fn(request))
        if not 0.0 <= value < math.inf:
            raise ValueError(f"{self.name}: estimate for request {request.request_id!r} is {value!r}")
        return value

    def choose(
        self,
        request: Request,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int] | None = None,
        *,
        estimate: Estimator | None = None,
    ) -> int:
        """Index of the target ``request`` should go to among ``targets`` (nothing is recorded)."""
        if not targets:
            raise ValueError(f"{self.name}: no targets to route to")
        if candidates is None:
            candidates = range(len(targets))
        else:
            self._check_candidates(candidates, len(targets))
        length = self.expected_output(request, estimate) if self.uses_estimate else 0.0
        uniform = all(t.speed == targets[0].speed for t in targets)
        return self._choose(request, length, targets, candidates, uniform)

    def route(
        self,
        request: Request,
        tracker: LoadTracker,
        candidates: Sequence[int] | None = None,
        *,
        estimate: Estimator | None = None,
    ) -> int:
        """Choose a target for ``request`` and record it in ``tracker``; returns its index.

        The request's tokens (prompt + expected output) are recorded whatever the
        router, so ``outstanding_tokens`` means the same under every router.
        """
        # the hot path of every fleet simulation: expected_output() inlined
        fn = self.estimate_fn or estimate
        if fn is None:
            if request.score is None:  # default_estimate() without a score
                n = request.num_prompt_tokens
                length = float(n if n < request.max_tokens else request.max_tokens)
            else:
                length = default_estimate(request)
        else:
            length = float(fn(request))
            if not 0.0 <= length < math.inf:
                raise ValueError(f"{self.name}: estimate for request {request.request_id!r} is {length!r}")
        if candidates is None:
            candidates = tracker.indices
        else:
            self._check_candidates(candidates, len(tracker.targets))
        if self.needs_length_sums and not tracker.length_sums:
            raise ValueError(f"{self.name}: needs a LoadTracker with length_sums=True")
        k = self._choose(request, length, tracker.targets, candidates, tracker.uniform)
        tracker.assign(request, k, request.num_prompt_tokens + length)
        return k

    @abstractmethod
    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        """Pick one of ``candidates`` (non-empty indices into ``targets``).

        ``length`` is the expected output (0 from :meth:`choose` when ``uses_estimate``
        is false); ``uniform`` says that all targets have the same speed.
        """

    def describe(self) -> dict[str, Any]:
        """Settings, for reports."""
        return {}

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"{type(self).__name__}({settings})"


class SeededRouter(Router):
    """A router that draws uniforms from ``numpy.random.default_rng(seed)``."""

    randomized = True

    def __init__(self, *, seed: int = 0, estimate_fn: Estimator | None = None) -> None:
        super().__init__(estimate_fn=estimate_fn)
        value: object = seed  # any integer type (numpy's too), not bool
        if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
            raise ValueError(f"{self.name}: seed must be a non-negative integer, got {seed!r}")
        self.seed: int = int(value)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._rng = np.random.default_rng(self.seed)
        self._buf: list[float] = []
        self._pos = 0

    def _uniform(self) -> float:
        if self._pos >= len(self._buf):
            self._buf = self._rng.random(_RNG_BLOCK).tolist()
            self._pos = 0
        u = self._buf[self._pos]
        self._pos += 1
        return u

    def describe(self) -> dict[str, Any]:
        return {"seed": self.seed}


# ------------------------------------------------------------------- registry
R = TypeVar("R", bound=type[Router])
_ROUTERS: Registry[Router] = Registry("router", "routers", UnknownRouterError, base=Router)


def register_router(name: str) -> Callable[[R], R]:
    """Class decorator: register a :class:`Router` subclass under ``name`` (kebab case, unique)."""
    return _ROUTERS.register(name)


def available_routers() -> list[str]:
    """Names of all registered routers, sorted."""
    return _ROUTERS.names()


def get_router_class(name: str) -> type[Router]:
    """The class registered as ``name``; raises :class:`UnknownRouterError` listing valid names."""
    return _ROUTERS.get(name)


def make_router(name: str, **kwargs: Any) -> Router:
    """Instantiate the router registered as ``name`` with keyword settings."""
    return _ROUTERS.make(name, **kwargs)
