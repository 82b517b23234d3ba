"""UniBoost (Li et al., ICML'26): prediction-free, tail-aware gamma-Boost for LLM serving.

Four stages, each registered so it can be ablated:

==================== =========================================================== ==========
name                 key (smaller runs first)                                     preempts
==================== =========================================================== ==========
``distboost``        ``a_i - b_gamma(theta * pw * prompt)``: Boost on prefill;    no
                     running decodes are never displaced (decode prioritized)
``uniboost-base``    ``a_i - b_gamma(theta * w~) - h * running``, ``w~`` on a      yes
                     linear grid of ``rekey_tokens`` output tokens
``uniboost-memguard`` same, ``w~`` on the geometric grid k, 2k, 4k...; no eviction yes,
                     until the request crosses its next threshold                 guarded
``uniboost``         memguard + gamma-Ada (gamma refitted from the P95-P99 tail)  yes,
                                                                                  guarded
==================== =========================================================== ==========

**Work units.** Work is counted in *tokens* and converted to seconds with one constant
``theta = seconds_per_token`` (default 0.02 s), because the boost is subtracted from an
arrival time (seconds) and gamma is a rate (1/s). Tokens are what engines observe
exactly and what the KV cache holds; 20 ms is the decode step of the built-in
``llama3-8b-a100`` preset at moderate batch (12.5 ms weights + launch, plus KV reads),
i.e. the latency one generated token costs a request. The attained work of a request
is its generated tokens; ``w~ = max(generated, pw * prompt tokens)`` (``pw =
prefill_weight``, default 1.0, the paper's form) so a request still in prefill is
placed by its prompt length, and a decode only loses priority once its output exceeds
that.

**gamma** (1/s), default 0.1: boosts of ~10-20 s for short requests under the default
theta (b(4 s) = 11.1 s, b(20 s) = 1.45 s), the order of queueing delays in a burst.

**Hysteresis** ``h`` (s, default 1.0; the preemptive stages only): a running request's
key is ``h`` better than the same request waiting, so a waiting request must beat it by
more than ``h`` to preempt it across phases (prefill vs decode); this bounds ping-pong
preemption. ``distboost`` never preempts, so it has no ``h`` (passing one is an error).

**MemGuard's bands** are bands of the same attained work as the key, ``max(generated,
pw * prompt tokens)``: a long prompt is work the request already holds in KV cache, so a
request scheduled with a 4000-token prompt stays guarded until it has generated 4096
tokens (the first threshold above 4000), not 32.

**gamma** must be at least ``GAMMA_FLOOR`` (1e-9/s); see :mod:`headway.policies._boost`.

**Rekey granularity.** ``w~`` grows while decoding, so keys *worsen*: uniboost-base
quantizes generated tokens down to multiples of ``rekey_tokens`` (64) and asks to be
re-keyed at each multiple (``rekey_after_tokens``); memguard quantizes to the geometric
thresholds and re-keys at each. Between hints a key is constant, as the engine contract
requires. gamma-Ada changes every key at once: it bumps ``key_epoch``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from headway.core import Policy, PolicyKey, Request, RequestState, register_policy
from headway.policies._base import check_nonneg, check_positive
from headway.policies._boost import GammaAda, b_gamma, check_count, check_gamma

__all__ = [
    "DistBoostPolicy",
    "UniBoostBasePolicy",
    "UniBoostMemGuardPolicy",
    "UniBoostPolicy",
    "memguard_level",
]


def memguard_level(tokens: int, base: int) -> int:
    """Index of the geometric threshold band: 0 below ``base``, j+1 in ``[base 2^j, base 2^(j+1))``."""
    if tokens < base:
        return 0
    return (tokens // base).bit_length()


class _BoostPolicy(Policy):
    """Common parameters of the UniBoost family."""

    def __init__(
        self,
        *,
        gamma: float = 0.1,
        seconds_per_token: float = 0.02,
        prefill_weight: float = 1.0,
    ) -> None:
        n = self.name
        self.gamma = check_gamma("gamma", gamma, n)
        self.seconds_per_token = check_positive("seconds_per_token", seconds_per_token, n)
        self.prefill_weight = check_nonneg("prefill_weight", prefill_weight, n)
        self._memo: dict[float, float] = {}
        self._memo_gamma = self._memo_theta = math.nan

    def boost(self, work_tokens: float) -> float:
        """``b_gamma`` of ``work_tokens`` (floored at one token), in seconds.

        Memoized per work value (work takes few distinct values: prompt lengths and grid
        points), so re-keying a long queue after gamma-Ada moves gamma costs a lookup per
        request; the memo is dropped whenever gamma or ``seconds_per_token`` changes.
        """
        if self._memo_gamma != self.gamma or self._memo_theta != self.seconds_per_token:
            self._memo = {}
            self._memo_gamma, self._memo_theta = self.gamma, self.seconds_per_token
        b = self._memo.get(work_tokens)
        if b is None:
            b = self._memo[work_tokens] = b_gamma(max(work_tokens, 1.0) * self.seconds_per_token, self.gamma)
        return b


@register_policy("distboost")
class DistBoostPolicy(_BoostPolicy):
    """Stage 1: gamma-Boost over prefill requests only; running decodes are never displaced.

    Non-preemptive, so it takes no ``hysteresis`` (an incumbency bonus matters only when
    running and waiting keys are compared): ``make_policy("distboost", hysteresis=...)``
    is a ValueError naming it.
    """

    def __init__(self, *, gamma: float = 0.1, seconds_per_token: float = 0.02, prefill_weight: float = 1.0) -> None:
        super().__init__(gamma=gamma, seconds_per_token=seconds_per_token, prefill_weight=prefill_weight)

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.arrival_time - self.boost(self.prefill_weight * request.num_prompt_tokens),)


@register_policy("uniboost-base")
class UniBoostBasePolicy(_BoostPolicy):
    """Stage 2: prefill and decode in one priority space ``a_i - b_gamma(w~)``, preemptive."""

    preemptive = True
    displacement = "evict"
    displacement_source = (
        "UniBoost (Li et al., ICML'26): a displaced request is retracted SGLang-style, its KV freed "
        "(into the prefix cache) and recomputed on resume; MemGuard exists to bound that recompute"
    )

    def __init__(
        self,
        *,
        gamma: float = 0.1,
        seconds_per_token: float = 0.02,
        prefill_weight: float = 1.0,
        hysteresis: float = 1.0,
        rekey_tokens: int = 64,
    ) -> None:
        super().__init__(gamma=gamma, seconds_per_token=seconds_per_token, prefill_weight=prefill_weight)
        self.hysteresis = check_nonneg("hysteresis", hysteresis, self.name)
        self.rekey_tokens = check_count("rekey_tokens", rekey_tokens, self.name)

    # -- work quantization (overridden by MemGuard)
    def quantized_output(self, generated: int) -> int:
        """Generated tokens rounded down to the re-key grid."""
        return generated - generated % self.rekey_tokens

    def next_grid_point(self, generated: int) -> int:
        """The first grid point above ``generated`` (any whole count, on the grid or not)."""
        return self.quantized_output(generated) + self.rekey_tokens

    def work(self, request: Request) -> float:
        """``w~`` in tokens: quantized generated tokens, floored by the weighted prompt length."""
        return max(
            float(self.quantized_output(request.num_output_tokens)),
            self.prefill_weight * request.num_prompt_tokens,
        )

    def key(self, request: Request, now: float) -> PolicyKey:
        k = request.arrival_time - self.boost(self.work(request))
        if request.state is RequestState.RUNNING:
            k -= self.hysteresis
        return (k,)

    def rekey_after_tokens(self, request: Request) -> int | None:
        g = request.num_output_tokens
        floor = self.prefill_weight * request.num_prompt_tokens
        nxt = self.next_grid_point(g)
        if nxt <= floor:  # grid points at or below the prompt floor do not change w~: the first one
            nxt = self.next_grid_point(math.floor(floor))  # above it (grid points are whole tokens)
        return nxt - g


@register_policy("uniboost-memguard")
class UniBoostMemGuardPolicy(UniBoostBasePolicy):
    """Stage 3: geometric work thresholds ``k, 2k, 4k, ...`` (``memguard_base = k`` = 32).

    The bands are of the key's attained work ``w = max(generated, pw * prompt tokens)``
    (unquantized; :meth:`attained_work`). Once scheduled, a request cannot be evicted
    (by preemption *or* by memory pressure, where any other candidate is taken first)
    until its ``w`` crosses the next threshold above the band it was scheduled in, that
    is until it has generated at least that threshold (``2^j k > w`` at scheduling): a
    request in band ``[2^j k, 2^(j+1) k)`` is evicted at most once there, so the KV its
    guarded evictions recompute (prompt plus output, at most ``(1 + 1/pw) w`` each time
    for ``pw > 0``) sums to at most ``4 (1 + 1/pw)`` times its final attained work, which
    bounds recomputation (thrashing). The key changes only at those same thresholds, so the
    re-key hints are the base stage's (the first grid point above both the generated
    tokens and the prompt floor).
    """

    def __init__(
        self,
        *,
        gamma: float = 0.1,
        seconds_per_token: float = 0.02,
        prefill_weight: float = 1.0,
        hysteresis: float = 1.0,
        memguard_base: int = 32,
    ) -> None:
        self.memguard_base = check_count("memguard_base", memguard_base, self.name)
        super().__init__(
            gamma=gamma,
            seconds_per_token=seconds_per_token,
            prefill_weight=prefill_weight,
            hysteresis=hysteresis,
            rekey_tokens=memguard_base,
        )

    def quantized_output(self, generated: int) -> int:
        lvl = memguard_level(generated, self.memguard_base)
        return 0 if lvl == 0 else self.memguard_base << (lvl - 1)

    def next_grid_point(self, generated: int) -> int:
        return self.memguard_base << memguard_level(generated, self.memguard_base)

    # can_preempt flips only where the attained work enters a new band; those are the grid points
    # above the prompt floor, which the inherited rekey_after_tokens announces (they move w~, the key)
    preempt_changes_at_hints = True

    def attained_work(self, request: Request, generated: int) -> int:
        """MemGuard's work measure at ``generated`` output tokens: ``max(generated, pw * prompt)``,
        floored to whole tokens (the thresholds are whole, so the band is the same)."""
        return max(generated, math.floor(self.prefill_weight * request.num_prompt_tokens))

    def can_preempt(self, request: Request, now: float) -> bool:
        # the band the current run was scheduled in (no per-step hook needed: the engine
        # records the output count at every move to RUNNING)
        base = self.memguard_base
        band = memguard_level(self.attained_work(request, request.run_start_output_tokens), base)
        return memguard_level(self.attained_work(request, request.num_output_tokens), base) > band

    def choose_victim(self, running: Sequence[Request], now: float) -> Request:
        free = [r for r in running if self.can_preempt(r, now)]
        return max(free or running, key=lambda r: (self.key(r, now), r.seq))


@register_policy("uniboost")
class UniBoostPolicy(UniBoostMemGuardPolicy):
    """Stage 4 (full UniBoost): MemGuard + gamma-Ada (see :class:`~headway.policies._boost.GammaAda`).

    gamma starts at ``gamma`` and is refitted every ``refit_every`` finishes from the
    last ``window`` TTLTs, clamped to ``[gamma_min, gamma_max]``; each change bumps
    ``key_epoch`` so queues re-key.
    """

    def __init__(
        self,
        *,
        gamma: float = 0.1,
        seconds_per_token: float = 0.02,
        prefill_weight: float = 1.0,
        hysteresis: float = 1.0,
        memguard_base: int = 32,
        window: int = 2000,
        refit_every: int = 100,
        min_samples: int = 200,
        gamma_min: float = 0.005,
        gamma_max: float = 5.0,
    ) -> None:
        super().__init__(
            gamma=gamma,
            seconds_per_token=seconds_per_token,
            prefill_weight=prefill_weight,
            hysteresis=hysteresis,
            memguard_base=memguard_base,
        )
        self.ada = GammaAda(
            self.gamma,
            window=window,
            refit_every=refit_every,
            min_samples=min_samples,
            gamma_min=gamma_min,
            gamma_max=gamma_max,
            name=self.name,
        )

    def on_finish(self, request: Request, now: float) -> None:
        if self.ada.observe(now - request.arrival_time):
            self.gamma = self.ada.gamma
            self.key_epoch += 1
