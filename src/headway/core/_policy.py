"""The scheduling-policy interface and its registry.

Every engine headway drives (the simulator, the gateway, the vLLM plugin) talks to
policies through this one small interface, so one policy object runs anywhere and a
policy never imports an engine.

The contract, in the order an engine calls it:

``on_arrival(req, now)``
    A request entered the scheduler: engines call it as their next scheduling decision first
    sees the request (vLLM's plugin as ``schedule()`` starts, after the output of the step the
    request came in; the simulator at its next plan), so a request aborted before then is never
    announced. Learned estimators score it here.
``key(req, now) -> tuple``
    Its ordering key, a tuple of numbers (no NaN) of one length for every request: smaller
    runs first (queues check the first key they get); the engine appends ``req.seq`` as the final
    tie-break, so order is total and runs are repeatable. Engines evaluate the key
    when a request arrives, is preempted, reports progress, or when a rekey hint
    below fires, and cache it in between: keys must be *invariant between those
    points*. Time-dependent orderings are written in a time-shifted form (aging:
    ``tier - rate * (now - arrival)`` orders like ``tier + rate * arrival``).
``on_progress(req, now, num_new_tokens)``
    The engine computed or generated tokens for ``req``. Engines may batch several
    tokens into one call, but call it at least where ``rekey_after_tokens`` asked.
``on_finish(req, now)``
    ``req`` finished; ``req.num_output_tokens`` is the observed output length
    (feedback for online estimators).
``expected_output_tokens(req)`` / ``score_of(req)``
    Optional estimates for length-aware routers (see :func:`~headway.routers.policy_estimator`):
    the expected output tokens, or a score in log output tokens; None means none.
``can_preempt(req, now)`` / ``choose_victim(running, now)``
    For ``preemptive`` policies a waiting request with a smaller key may displace a
    running one that ``can_preempt`` allows, in the policy's ``displacement`` mode (below).
    When memory runs out, any policy's ``choose_victim`` names whom to evict (default:
    the largest key, which is vLLM's rule for both FCFS and priority scheduling).

**Displacement modes** (``displacement``; engines never preempt for the token budget):

``"none"``
    vLLM's own rule: running requests are never displaced; only a running request's KV
    shortage evicts (``choose_victim``). The default, and the only mode of non-preemptive
    policies.
``"pause"``
    vllm-ltr's: a better-keyed waiting request that finds no sequence slot (or token budget)
    takes the slot of the worst-keyed running one, which is not scheduled while it ranks
    lower but keeps its KV blocks; only a KV shortage evicts (the worst-keyed holder).
``"evict"``
    SGLang's retract: a better-keyed waiting request that finds no KV blocks evicts the
    worst-keyed running one, whose blocks go back to the prefix cache; it recomputes on
    resume what is no longer cached. A full batch (no slot) displaces nobody.

Each preemptive policy declares the mode of the system its paper built on
(``displacement``, with the source in ``displacement_source``); a run may override it with
the ``displacement`` setting (``make_policy(name, displacement="evict")``, on the command
line ``--policy-arg NAME.displacement=evict``).

Engines detect which optional hooks a policy overrides by looking at its class,
``type(policy).hooks()`` (a :class:`PolicyHooks`, computed once per class), and skip the
rest on their hot paths: override hooks in a subclass, not on an instance.

A policy whose keys all change together (a learned global parameter) increments
``key_epoch``; queues re-key everything at their next decision.

Rekey hints (optional): ``rekey_after_tokens(req)`` - after how many more processed
tokens the key of a running request may get *worse* (larger); ``rekey_at_time(req)`` -
an absolute time at which the key of a queued request changes (e.g. starvation
promotion). Between hints a running request's key may stay or improve, never worsen
(SRPT's remaining length only shrinks: no hint needed; attained-service keys such as
UniBoost's grow: they must give hints). For a policy with an ``on_progress`` hook each report
of a prefill chunk is a key point too (the last one with the prefill's first token), where its
key may change either way. Engines skip work between hints: for policies
with no ``on_progress`` and either the default ``can_preempt`` or
``preempt_changes_at_hints``, the simulator skips a displacement check while the queue
head, the running set and ``key_epoch`` are unchanged (a hint counts as a change).

How running keys evolve (optional, ``running_keys`` and ``progress_at_hints``): a policy
with an ``on_progress`` hook may declare that its running keys keep the contract above
(``"bounded"``) or, further, that a decoding request's first key component falls by exactly
one per output token between its key points, the rest of the key fixed (``"countdown"``:
remaining-length keys). Either declaration also promises that a running request's
``can_preempt``, once False, stays False until its next key point. The simulator then keeps
the running keys in a heap with lazy invalidation instead of re-keying every running request
at each displacement check. ``progress_at_hints`` adds that ``on_progress`` changes nothing
but at ``rekey_after_tokens`` points, so progress between them may be reported late, in one
call; without it every running request's progress is reported at each check.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from headway.core._registry import Registry
from headway.core._request import Request

__all__ = [
    "DISPLACEMENT_MODES",
    "RUNNING_KEYS",
    "STALL_EVICTIONS",
    "OracleAccessError",
    "Policy",
    "PolicyHooks",
    "PolicyKey",
    "SharedStartTags",
    "UnknownPolicyError",
    "available_policies",
    "get_policy_class",
    "make_policy",
    "register_policy",
    "set_displacement",
]

PolicyKey = tuple[float | int, ...]

DISPLACEMENT_MODES = ("none", "pause", "evict")
"""How a preemptive policy's better-keyed waiting request displaces a running one (see above)."""

RUNNING_KEYS = ("", "bounded", "countdown")
"""How a policy's running keys evolve between key points (``Policy.running_keys``, see above)."""

STALL_EVICTIONS = 1000
"""Recompute evictions in a row that find a request with no more tokens computed than an earlier
one had (every turn it got was lost): where the engines call a displacement livelock (the
simulator raises ``SimulationStalled``, the vLLM plugin warns)."""


class OracleAccessError(PermissionError):
    """A policy that is not an oracle asked for a request's true output length."""


class UnknownPolicyError(ValueError):
    """No policy is registered under the given name."""


@runtime_checkable
class SharedStartTags(Protocol):
    """A fair-queueing policy whose keys are start tags drawn from running state (a virtual
    time and each flow's last finish tag), not from the request alone.

    Where several schedulers share one queue (gateway replicas on one Redis queue), their
    tags are comparable only if that state is shared too. Such a queue asks the policy for a
    request's flow and tag increment, draws the start tag from the shared state
    (``start = max(v, last[flow])``; ``last[flow] = start + increment``), gives it back with
    :meth:`set_start_tag` before asking for the key, and advances the shared ``v`` to the
    start tag of each request it dispatches. One scheduler on its own needs none of this:
    the policy keeps the state itself.
    """

    def tag_flow(self, request: Request) -> tuple[str, float]:
        """The request's flow (the fair-queueing class) and its tag increment (cost / weight)."""
        ...

    def set_start_tag(self, request: Request, start: float) -> None:
        """Use ``start`` as the request's start tag (its key) from now on."""
        ...

    def start_tag(self, request: Request) -> float | None:
        """The request's start tag, once it has one."""
        ...


@dataclass(frozen=True)
class PolicyHooks:
    """Which of :class:`Policy`'s optional hooks a policy class overrides (``Policy.hooks()``).

    Engines call a hook left at its default only where its result matters, and skip the rest
    on their hot paths; every field is True when the class replaces that hook.
    """

    on_workload: bool
    on_arrival: bool
    on_progress: bool
    on_decode_progress: bool
    on_finish: bool
    can_preempt: bool
    choose_victim: bool
    rekey_after_tokens: bool
    rekey_at_time: bool
    expected_output_tokens: bool
    score_of: bool
    stable_displacement: bool
    """A failed displacement check stays failed until the queue head, the running set,
    ``key_epoch`` or a rekey point changes (:meth:`Policy.stable_displacement`)."""


_OPTIONAL_HOOKS = tuple(f.name for f in fields(PolicyHooks) if f.name != "stable_displacement")


class Policy(ABC):
    """Base class of every headway scheduling policy."""

    name: ClassVar[str] = ""
    """Registry name in kebab case (set by :func:`register_policy`)."""
    oracle: bool = False
    """True if the policy reads true output lengths (simulation/benchmarks only); a class
    may set it per instance (e.g. only when configured with an oracle scorer)."""
    preemptive: ClassVar[bool] = False
    """True if a better-keyed waiting request may displace a running one."""
    displacement: str = "none"
    """The displacement mode (``"none"``, ``"pause"`` or ``"evict"``, see the module docstring);
    preemptive policies set their source system's, a run may override it per instance."""
    displacement_source: ClassVar[str] = ""
    """Where the declared ``displacement`` mode comes from (the paper's system)."""
    preempt_changes_at_hints: ClassVar[bool] = False
    """True if an overridden ``can_preempt`` of a running request changes only at its
    ``rekey_after_tokens`` points (as MemGuard's bands do); engines may then skip
    displacement checks between hints as they do for the default ``can_preempt``."""
    running_keys: ClassVar[str] = ""
    """How running keys evolve between key points (see the module docstring): ``""`` (not
    declared), ``"bounded"`` or ``"countdown"`` (:data:`RUNNING_KEYS`)."""
    progress_at_hints: ClassVar[bool] = False
    """True if ``on_progress`` changes nothing (keys now or later, ``can_preempt``) except at
    ``rekey_after_tokens`` points, so engines may report the progress between them late."""
    key_epoch: int = 0
    """Bump this when every cached key is stale at once (e.g. a global parameter such
    as gamma-Ada's gamma changed); queues then re-key all waiting requests."""
    arrival_deque: ClassVar[bool] = False
    """True if the waiting queue is vLLM's FCFS deque rather than an order by key: a request put
    back (preempted, or skipped in a step) goes to its front, and memory pressure evicts the last
    request of the running list. They differ from the key's order only when requests run out of
    arrival order (vLLM skips one waiting for its grammar or over ``max_loras``): the vLLM plugin
    follows it; the simulator, where requests are never skipped, keys as usual."""
    requires_chunked_prefill: ClassVar[bool] = False
    """True if the policy assumes chunked prefill (engines refuse to run it without)."""
    token_budget: int | None = None
    """The most tokens per step the policy assumes (Sarathi's small budget); engines that
    can cap their own budget (the simulator, the vLLM plugin) use the smaller of the two."""

    _oracle_fn: Callable[[Request], int] | None = None
    _simulated: bool = False  # set by the simulator: an instance runs one simulation

    # -------------------------------------------------------------- contract
    def on_workload(self, requests: Sequence[Request]) -> None:  # noqa: B027 - optional hook
        """Called once before a simulation's first arrival with every request it may submit
        (identifiers and prompts; no true lengths): per-request work that needs nothing learned
        at run time may be prepared in bulk here (the noisy oracle's draws). It must change no
        decision: ``on_arrival`` and the keys read the same values as without this call."""

    def on_arrival(self, request: Request, now: float) -> None:  # noqa: B027 - optional hook
        """Called once when ``request`` enters the scheduler."""

    @abstractmethod
    def key(self, request: Request, now: float) -> PolicyKey:
        """Ordering key of ``request``: smaller runs first."""

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:  # noqa: B027
        """Called after ``num_new_tokens`` were computed or generated for ``request``."""

    def on_decode_progress(self, now: float, runs: Sequence[tuple[int, int, float]]) -> None:  # noqa: B027
        """Optional, for a policy whose ``on_progress`` of a decoding request only learns from how
        long its tokens took: the simulator then reports a batch's decode progress in one call,
        not one ``on_progress`` per decoder (whose counters it leaves lazy). ``runs`` lists the
        decoders in batch order, grouped: ``(count, tokens, since)`` is ``count`` consecutive
        decoders that each generated ``tokens`` tokens since their previous progress report, at
        ``since``. An override must learn what ``on_progress`` learns from those reports, in that
        order, and nothing else may depend on a decoder's reports (LTR's step-time estimate)."""

    def on_finish(self, request: Request, now: float) -> None:  # noqa: B027
        """Called once when ``request`` finished (observed output length is final)."""

    def can_preempt(self, request: Request, now: float) -> bool:
        """Whether running ``request`` may be displaced by a better-keyed waiting one."""
        return self.preemptive

    def choose_victim(self, running: Sequence[Request], now: float) -> Request:
        """Whom to evict when memory runs out (default: the largest key)."""
        return max(running, key=lambda r: (self.key(r, now), r.seq))

    def rekey_after_tokens(self, request: Request) -> int | None:
        """Tokens after which a running request's key may worsen (None: never)."""
        return None

    def rekey_at_time(self, request: Request) -> float | None:
        """Absolute time at which a queued request's key changes (None: never)."""
        return None

    # ------------------------------------------------------- estimates
    def expected_output_tokens(self, request: Request) -> float | None:
        """The policy's estimate of ``request``'s output length in tokens, for routers that
        weigh requests by length (see :func:`~headway.routers.policy_estimator`); None (the
        default): no estimate, the router falls back to
        :func:`~headway.routers.default_estimate`. Override it only in a policy that has one."""
        return None

    def score_of(self, request: Request) -> float | None:
        """The score ``request`` is ranked by, in log output tokens (score-ranked policies such as
        PARS; routers use ``exp(score)`` as the length estimate when ``expected_output_tokens``
        is not overridden); None (the default): the policy ranks by no score."""
        return None

    # ------------------------------------------------- what engines may skip
    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Whether this class replaces :class:`Policy`'s default ``hook`` (engines skip the
        defaults on their hot paths)."""
        return getattr(cls, hook) is not getattr(Policy, hook)

    @classmethod
    def hooks(cls) -> PolicyHooks:
        """Which optional hooks this class overrides, computed once per class (see
        :class:`PolicyHooks`); the simulator, the gateway, the plugin and the routers' estimates read this."""
        found = _HOOKS.get(cls)
        if found is None:
            _check_class(cls, cls.name or cls.__name__, warn=False)  # a class never registered
            found = _HOOKS[cls] = PolicyHooks(
                **{name: cls.overrides(name) for name in _OPTIONAL_HOOKS},
                stable_displacement=cls.stable_displacement(),
            )
        return found

    @classmethod
    def stable_displacement(cls) -> bool:
        """Whether a failed displacement check stays failed until the queue head, the running
        set, ``key_epoch`` or a ``rekey_after_tokens`` point changes: no ``on_progress``, and
        the default ``can_preempt`` or one that changes only at hints
        (``preempt_changes_at_hints``)."""
        return not cls.overrides("on_progress") and (not cls.overrides("can_preempt") or cls.preempt_changes_at_hints)

    # ---------------------------------------------------------------- oracle
    def bind_oracle(self, lookup: Callable[[Request], int]) -> None:
        """Engines call this on oracle policies only, with the true-length lookup."""
        if not self.oracle:
            raise OracleAccessError(
                f"policy {self.name!r} does not declare oracle = True; true output lengths are withheld from it"
            )
        self._oracle_fn = lookup

    def true_output_tokens(self, request: Request) -> int:
        """True output length of ``request``: oracles only, and only once bound."""
        if not self.oracle:
            raise OracleAccessError(f"policy {self.name!r} is not an oracle and may not read true output lengths")
        if self._oracle_fn is None:
            raise OracleAccessError(
                f"oracle policy {self.name!r} has no oracle bound: this engine cannot provide true output lengths"
            )
        return self._oracle_fn(request)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_HOOKS: weakref.WeakKeyDictionary[type[Policy], PolicyHooks] = weakref.WeakKeyDictionary()

# ------------------------------------------------------------------ registry
P = TypeVar("P", bound=type[Policy])


def _load_builtin() -> None:
    import headway.policies  # noqa: F401  (modules register themselves on import)


PAPER_POLICIES: dict[str, tuple[str, ...]] = {
    "PARS": ("pars", "sjf-score", "ltr", "trail"),
    "UniBoost": ("distboost", "uniboost-base", "uniboost-memguard", "uniboost", "rank-boost"),
    "DriftSched": ("tenant-fifo", "tenant-priority", "tenant-weighted", "tenant-sjf", "tenant-aging"),
}
"""Each paper's built-in policies (docs/policies/index.md): a paper's name given as a policy's
(``--policies driftsched``) fails naming them, and the plots draw them in the paper's family
(``headway.metrics.POLICY_FAMILIES``)."""


def _check_class(cls: type[Policy], name: str, *, warn: bool = True) -> None:
    """What a policy class declares, checked once as it registers (engines read these on their hot
    paths and would take a bad value silently): it defines ``key``, its ``displacement`` and
    ``running_keys`` are known modes, and a preemptive class declares a displacement mode other
    than ``"none"``; a public name that is not a hook but one letter or so from one
    (``on_progres``) is a warning (``warn``), as engines never call it. Engines check a class
    that never registered (an instance given to ``simulate``) as they first read its hooks."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"policy {name!r}: {cls!r} is not a subclass of headway.Policy")
    if inspect.isabstract(cls):
        left = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(
            f"policy {name!r} ({cls.__qualname__}) does not define {left}: every policy needs "
            "key(self, request, now), returning a tuple of numbers (smaller runs first)"
        )
    # a property (a wrapper's, following its inner policy) is read on the instance, not here
    mode, preemptive = (inspect.getattr_static(cls, a) for a in ("displacement", "preemptive"))
    if isinstance(mode, str) and mode not in DISPLACEMENT_MODES:
        valid = ", ".join(repr(m) for m in DISPLACEMENT_MODES)
        raise ValueError(f"policy {name!r} ({cls.__qualname__}): displacement must be one of {valid}, got {mode!r}")
    if preemptive is True and mode == "none":
        raise ValueError(
            f"policy {name!r} ({cls.__qualname__}) is preemptive but its displacement is 'none', under which "
            "no running request is ever displaced: declare displacement = 'pause' (vllm-ltr's: the displaced "
            "request keeps its KV blocks) or 'evict' (SGLang's: it gives them back), or drop preemptive = True"
        )
    if cls.running_keys not in RUNNING_KEYS:
        valid = ", ".join(repr(m) for m in RUNNING_KEYS)
        raise ValueError(
            f"policy {name!r} ({cls.__qualname__}): running_keys must be one of {valid}, got {cls.running_keys!r}"
        )
    if not warn:
        return
    known = [n for n in dir(Policy) if not n.startswith("_")]
    for attr in cls.__dict__:
        if attr.startswith("_") or hasattr(Policy, attr):
            continue
        close = difflib.get_close_matches(attr, known, n=1, cutoff=0.8)
        if close:
            warnings.warn(
                f"policy {name!r} ({cls.__qualname__}) defines {attr!r}, which is no Policy attribute and "
                f"which engines never read: did you mean {close[0]!r}?",
                RuntimeWarning,
                stacklevel=3,
            )


_POLICIES: Registry[Policy] = Registry(
    "policy", "policies", UnknownPolicyError, _load_builtin, base=Policy, families=PAPER_POLICIES, check=_check_class
)


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: register a :class:`Policy` subclass under ``name``.

    Names are kebab case and unique; registering a name twice is an error, except for a new
    definition of the same class (same module and qualified name: a notebook cell run again),
    which replaces the old one.
    """
    return _POLICIES.register(name)


def available_policies() -> list[str]:
    """Names of all registered policies, sorted."""
    return _POLICIES.names()


def get_policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``; raises :class:`UnknownPolicyError`."""
    return _POLICIES.get(name)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Instantiate the policy registered as ``name`` with keyword settings.

    Besides the class's own settings every policy takes ``displacement`` (one of
    :data:`DISPLACEMENT_MODES`; anything but ``"none"`` only for preemptive policies), which
    overrides the mode the class declares.
    """
    mode = kwargs.pop("displacement", None)
    policy = _POLICIES.make(name, **kwargs)
    if mode is not None:
        set_displacement(policy, mode)
    return policy


def set_displacement(policy: Policy, mode: object) -> None:
    """Override ``policy``'s displacement mode; a ValueError names a bad mode."""
    if mode not in DISPLACEMENT_MODES:
        valid = ", ".join(DISPLACEMENT_MODES)
        raise ValueError(f"policy {policy.name!r}: displacement must be one of {valid}, got {mode!r}")
    if mode != "none" and not policy.preemptive:
        raise ValueError(
            f"policy {policy.name!r} is not preemptive: displacement {mode!r} needs a preemptive policy "
            "(only 'none' applies)"
        )
    policy.displacement = str(mode)
