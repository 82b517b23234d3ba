"""The request model shared by the simulator, the gateway and the vLLM plugin.

A :class:`Request` carries what a scheduler may legitimately know about a request
(its prompt, arrival time, tenant, ``max_tokens``) plus the progress an engine has
reported so far. The true output length is deliberately *not* a field: engines keep
it to themselves and hand it only to policies that declare ``oracle = True``
(see :meth:`headway.core.Policy.true_output_tokens`).

State machine::

    WAITING --schedule--> RUNNING --finish--> FINISHED
       ^                     |
       +----- PREEMPTED <----+   (evicted; re-enters the waiting queue)

    WAITING / PREEMPTED --abort--> ABORTED   (client gone, TTL, queue full)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["InvalidTransition", "Request", "RequestState", "Tier"]


class RequestState(enum.Enum):
    """Lifecycle of a request inside a scheduler."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"


_ALLOWED: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.RUNNING, RequestState.ABORTED}),
    RequestState.RUNNING: frozenset({RequestState.PREEMPTED, RequestState.FINISHED, RequestState.ABORTED}),
    RequestState.PREEMPTED: frozenset({RequestState.RUNNING, RequestState.ABORTED}),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
}
# the same edges by member identity (members are singletons): an Enum member's hash is a call of
# Python code (the hash of its name), and a request makes several transitions per simulation;
# likewise the members themselves as module constants (reading a member off its Enum class is a
# lookup through the class's metaclass, several times slower than a global)
_NEXT = {id(a): frozenset(map(id, ends)) for a, ends in _ALLOWED.items()}
_RUNNING, _FINISHED, _ABORTED = RequestState.RUNNING, RequestState.FINISHED, RequestState.ABORTED


class InvalidTransition(RuntimeError):
    """A request was moved along an edge the state machine does not have."""


class Tier(enum.IntEnum):
    """Quality-of-service tier of a tenant (lower value = more important)."""

    PREMIUM = 0
    STANDARD = 1
    BATCH = 2

    @classmethod
    def parse(cls, value: object) -> Tier:
        """Accept ``"premium"``, ``"PREMIUM"``, ``0`` or a :class:`Tier`; anything else (a bool,
        None, an out-of-range int, another type) is a ValueError listing the valid tiers."""
        if isinstance(value, Tier):
            return value
        try:
            if isinstance(value, int) and not isinstance(value, bool):
                return cls(value)
            if isinstance(value, str):
                return cls[value.strip().upper()]
        except (KeyError, ValueError):
            pass
        valid = ", ".join(t.name.lower() for t in cls)
        raise ValueError(f"unknown tier {value!r}; valid tiers: {valid}")


@dataclass(slots=True, eq=False)
class Request:
    """One inference request as a scheduler sees it.

    Identity and static facts come first; the fields after ``state`` are progress
    that the engine (simulator, gateway or vLLM) updates. Times are seconds on the
    engine's clock and stay ``None`` until the event happens.
    """

    request_id: str
    """Unique id within one run."""
    arrival_time: float
    """When the request reached the scheduler (seconds)."""
    num_prompt_tokens: int
    """Prompt length in tokens."""
    max_tokens: int
    """Upper bound on generated tokens that the client asked for."""
    tenant_id: str = "default"
    """Who sent the request."""
    tier: Tier = Tier.STANDARD
    """QoS tier of the tenant."""
    priority: int = 0
    """vLLM-style priority: lower runs first."""
    prompt: str | None = None
    """Prompt text, when known (predictors need it)."""
    category: str | None = None
    """Workload category hint (e.g. ``"summary"``), when known."""
    score: float | None = None
    """Predicted length score (higher = longer), set by a scorer before arrival."""
    seq: int = -1
    """Arrival sequence number assigned by the engine; the final tie-break in keys."""
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the request's tokens in blocks of ``hash_block_size`` tokens, as vLLM's
    automatic prefix caching keys its KV blocks: equal hashes at position ``i`` mean equal
    first ``i + 1`` blocks (so two requests share the KV of their common hash prefix). They
    may run past the prompt (a replayed conversation knows its answer), and the last one may
    cover a partial block (Mooncake's ``hash_ids``); engines cache whole blocks of their own
    size that these cover. Empty: nothing known, the request shares no prefix."""
    hash_block_size: int = 16
    """Tokens per entry of ``block_hashes`` (16 as vLLM's blocks, 512 in Mooncake traces); a
    multiple of the engine's block size for the hashes to be used."""
    hashed_tokens: int | None = None
    """The tokens ``block_hashes`` cover, when known: every hash a whole block of the request's
    token stream, the last possibly running past the prompt into the answer (a replayed chat's
    turn, whose answer the next turn sends back). None: a last hash that ends within one block
    past the prompt covers the prompt's partial last block (Mooncake's ``hash_ids``)."""

    state: RequestState = RequestState.WAITING
    num_computed_tokens: int = 0
    """Tokens whose KV entries are currently computed (prompt + generated)."""
    num_output_tokens: int = 0
    """Tokens generated so far."""
    queued_time: float | None = None
    """When the engine's scheduler first saw it. Engines add arrivals between steps (vLLM's
    engine core does), so this is the arrival on an idle engine, else the start of the next
    step; engine-side latencies (vLLM's queued timestamp) count from here."""
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    """Times it was taken out of the batch after it started: evictions plus pauses."""
    num_pauses: int = 0
    """Of those, pauses (a ``pause``-mode displacement: out of the batch, KV blocks kept)."""
    num_cached_tokens: int | None = None
    """Prompt tokens found in the prefix cache when it was first scheduled (vLLM's name); None
    while unknown (not scheduled yet, or an engine that does not report it)."""
    num_recomputed_tokens: int = 0
    """Tokens computed again after preemption by recompute."""
    run_start_output_tokens: int = 0
    """``num_output_tokens`` when the current run began (set on every move to RUNNING)."""
    output_tokens_known: bool = True
    """False when the engine could not observe the output length (the gateway, for an answer
    without ``usage.completion_tokens``): ``num_output_tokens`` is then no observation, and
    policies that learn from finished lengths skip the request."""
    extra: dict[str, object] = field(default_factory=dict)
    """Per-request state that a policy wants to keep (namespaced by policy name)."""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(
                f"request {self.request_id!r}: num_prompt_tokens must be > 0, got {self.num_prompt_tokens}"
            )
        if self.max_tokens <= 0:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be > 0, got {self.max_tokens}")
        if self.hash_block_size < 1:
            raise ValueError(f"request {self.request_id!r}: hash_block_size must be >= 1, got {self.hash_block_size}")
        if self.hashed_tokens is not None and self.hashed_tokens < 0:
            raise ValueError(f"request {self.request_id!r}: hashed_tokens must be >= 0, got {self.hashed_tokens}")
        if not self.arrival_time >= 0.0:  # also rejects NaN
            raise ValueError(f"request {self.request_id!r}: arrival_time must be >= 0, got {self.arrival_time}")

    # ----------------------------------------------------------------- state
    def transition(self, new_state: RequestState) -> None:
        """Move to ``new_state``, raising :class:`InvalidTransition` on an illegal edge."""
        if id(new_state) not in _NEXT[id(self.state)]:
            raise InvalidTransition(
                f"request {self.request_id!r}: {self.state.name} -> {new_state.name} is not a valid transition"
            )
        if new_state is _RUNNING:
            self.run_start_output_tokens = self.num_output_tokens
        self.state = new_state

    @property
    def is_finished(self) -> bool:
        state = self.state
        return state is _FINISHED or state is _ABORTED

    # --------------------------------------------------------------- metrics
    @property
    def e2e_latency(self) -> float | None:
        """Time to last token (TTLT), from arrival."""
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for 1-token outputs)."""
        if self.first_token_time is None or self.last_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.last_token_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def queueing_delay(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time
