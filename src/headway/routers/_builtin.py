"""The built-in routers (see :mod:`headway.routers` for the interface they implement)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from headway.core import Request
from headway.routers._base import (
    CLASS_SHIFT,
    LENGTH_CLASSES,
    Estimator,
    Router,
    SeededRouter,
    TargetLoad,
    length_class,
    register_router,
)

__all__ = [
    "LeastOutstandingRouter",
    "LeastTokensRouter",
    "LengthAwareRouter",
    "PowerOfTwoRouter",
    "RandomRouter",
    "RoundRobinRouter",
]


# ------------------------------------------------------------------ built-ins
@register_router("round-robin")
class RoundRobinRouter(Router):
    """Targets in turn. Speeds differ: smooth weighted round-robin (nginx), weights = speeds.

    With candidates, targets outside them are skipped for this decision (their turn
    credit is kept).
    """

    def __init__(self, *, estimate_fn: Estimator | None = None) -> None:
        super().__init__(estimate_fn=estimate_fn)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._next = 0
        self._credit: list[float] = []

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        n = len(targets)
        if uniform:
            k = self._next % n
            every = isinstance(candidates, range) and candidates == range(n)  # no candidates given: O(1)
            allowed = set() if every else set(candidates)
            if not every and allowed != set(range(n)):
                for _ in range(n):  # the next allowed target in turn (choose/route checked that there is one)
                    if k in allowed:
                        break
                    k = (k + 1) % n
                else:
                    raise ValueError(f"{self.name}: no candidate among the {n} targets: {list(candidates)}")
            self._next = k + 1
            return k
        # smooth weighted round-robin: add each weight, take the max, subtract the total
        if len(self._credit) != n:
            self._credit = [0.0] * n
        credit = self._credit
        total = 0.0
        best = candidates[0]
        for i in candidates:
            w = targets[i].speed
            credit[i] += w
            total += w
            if credit[i] > credit[best]:
                best = i
        credit[best] -= total
        return best


@register_router("random")
class RandomRouter(SeededRouter):
    """A random target (probability proportional to speed; uniform on a homogeneous fleet)."""

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        u = self._uniform()
        m = len(candidates)
        if uniform:
            return candidates[min(int(u * m), m - 1)]
        x = u * sum(targets[i].speed for i in candidates)
        for i in candidates:
            x -= targets[i].speed
            if x < 0.0:
                return i
        return candidates[-1]


@register_router("least-outstanding")
class LeastOutstandingRouter(Router):
    """The target with the fewest outstanding requests (``(requests + 1) / speed``).

    Ties rotate: the scan starts after the previous pick, so equally loaded (e.g. idle)
    targets take turns.
    """

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        order = self._rotated(candidates)
        best = pos = 0
        if uniform:
            fewest = 1 << 62
            for j, i in enumerate(order):
                n = targets[i].outstanding_requests
                if n < fewest:
                    best, pos, fewest = i, j, n
                    if n == 0:
                        break
        else:
            best_load = math.inf
            for j, i in enumerate(order):
                t = targets[i]
                load = (t.outstanding_requests + 1) / t.speed
                if load < best_load:
                    best, pos, best_load = i, j, load
        self._picked(pos)
        return best


@register_router("power-of-two")
class PowerOfTwoRouter(SeededRouter):
    """Power of two choices: two distinct random targets, the one with fewer outstanding requests.

    Load is ``(requests + 1) / speed``; ties go to the first drawn. One candidate: it.
    """

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        m = len(candidates)
        if m == 1:
            return candidates[0]
        a = min(int(self._uniform() * m), m - 1)
        b = min(int(self._uniform() * (m - 1)), m - 2)
        if b >= a:
            b += 1
        ia, ib = candidates[a], candidates[b]
        ta, tb = targets[ia], targets[ib]
        la = (ta.outstanding_requests + 1) / ta.speed
        lb = (tb.outstanding_requests + 1) / tb.speed
        return ib if lb < la else ia


@register_router("least-tokens")
class LeastTokensRouter(Router):
    """The target with the fewest outstanding tokens (prompt + expected output, over speed).

    Compares ``(outstanding_tokens + this request's tokens) / speed``; ties: fewer
    outstanding requests, then rotating (as ``least-outstanding``).
    """

    uses_estimate = True

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        mine = request.num_prompt_tokens + length
        order = self._rotated(candidates)
        best = pos = 0
        best_load = (math.inf, 0)
        for j, i in enumerate(order):
            t = targets[i]
            load = ((t.outstanding_tokens + mine - self._saved_tokens(request, i)) / t.speed, t.outstanding_requests)
            if load < best_load:
                best, pos, best_load = i, j, load
        self._picked(pos)
        self._sent(request, best)
        return best

    def _saved_tokens(self, request: Request, target: int) -> float:
        """Tokens of ``request`` that ``target`` need not compute (none here; a cache-aware subclass's)."""
        return 0

    def _sent(self, request: Request, target: int) -> None:
        """``request`` was routed to ``target`` (a subclass's bookkeeping)."""


@register_router("length-aware")
class LengthAwareRouter(Router):
    """Keeps short and long requests apart: each request goes where its size least delays shorter work.

    A request's size ``L`` is its prompt plus expected output tokens (the work it
    brings: prefill chunks plus one decode step per output token, each step slowed by
    its context); ``L_j`` are the sizes outstanding on target ``k``. For each pair of
    co-located requests the shorter one is delayed: by ``min(L, L_j)`` when they
    share the batch (processor sharing), and by up to the longer one's extra
    ``|L - L_j|`` when the longer one holds batch slots, KV memory and the prefill
    budget ahead of it (head-of-line blocking). The router sends the request where
    the sum of those delays is least::

        cost_k = ( sum_j min(L, L_j)  +  separation * sum_j |L - L_j| ) / speed_k

    ``separation`` weighs mixing sizes against plain sharing: 0 balances like-for-like
    (a short request goes where fewest requests are, a long one where least work is),
    1 gives ``sum_j max(L, L_j)``; larger values keep sizes apart more strictly. The
    default, 1/2, is where the two terms add up to ``(L + L_j) / 2`` per pair::

        cost_k = (L * n_k + W_k) / (2 speed_k)      (n_k requests, W_k tokens outstanding)

    so a short request follows the outstanding *tokens* (it avoids targets holding long
    work) and a long one the outstanding *count* (it joins the few long requests rather
    than many short ones): sizes separate with O(1) work per target. Ties: fewer
    outstanding tokens, then rotating (as ``least-outstanding``); an idle target costs 0.

    Other values need the size distribution per target: sums are evaluated per
    power-of-two size class (:data:`LENGTH_CLASSES`; exact across classes, within one
    class ``min``/``max`` of the class totals) from suffix sums the tracker keeps, so a
    decision stays O(targets). The expected output comes from ``estimate_fn`` / the
    policy / the prompt length (see the module docs).

    Measured on the Splitwise conversation trace (``benchmarks/bench_fleet.py``):
    sizes must include the prompt. Separating by expected *output* alone concentrates
    decode-heavy requests and slowed PARS's fleet by up to 30%.
    """

    uses_estimate = True

    def __init__(self, *, separation: float = 0.5, estimate_fn: Estimator | None = None) -> None:
        super().__init__(estimate_fn=estimate_fn)
        if (
            isinstance(separation, bool)
            or not isinstance(separation, int | float)
            or not (math.isfinite(separation) and separation >= 0.0)
        ):
            raise ValueError(f"length-aware: separation must be a finite number >= 0, got {separation!r}")
        self.separation = float(separation)
        self.needs_length_sums = self.separation != 0.5

    def cost(self, size: float, target: TargetLoad) -> float:
        """``cost_k`` of sending a request of ``size`` tokens to ``target``."""
        n = target.outstanding_requests
        if n == 0:
            return 0.0
        if not self.needs_length_sums:
            return 0.5 * (size * n + target.outstanding_tokens) / target.speed
        c = length_class(size)
        n_c, w_c = target.class_requests[c], target.class_tokens[c]
        n_hi, w_hi = target.longer_requests[c], target.longer_tokens[c]
        w = target.outstanding_tokens
        sum_min = (w - w_hi - w_c) + size * n_hi + min(size * n_c, w_c)
        sum_abs = size * n + w - 2.0 * sum_min  # |a - b| = a + b - 2 min(a, b)
        return (sum_min + self.separation * sum_abs) / target.speed

    def _choose(
        self,
        request: Request,
        length: float,
        targets: Sequence[TargetLoad],
        candidates: Sequence[int],
        uniform: bool,
    ) -> int:
        # cost() inlined (this runs per arrival and target): with S = sum_j min(L, L_j),
        # sum_j |L - L_j| = L n + W - 2 S, so cost = sep (L n + W) + (1 - 2 sep) S.
        size = request.num_prompt_tokens + length
        c = int(size).bit_length() - CLASS_SHIFT if size >= 1.0 else 0  # length_class() inlined
        c = 0 if c < 0 else (c if c < LENGTH_CLASSES else LENGTH_CLASSES - 1)
        sep = self.separation
        k_min = 1.0 - 2.0 * sep
        order = self._rotated(candidates)
        best = pos = 0
        best_cost = best_tokens = math.inf
        if not self.needs_length_sums:  # separation 1/2: cost = (L n + W) / 2, no classes needed
            for j, i in enumerate(order):
                t = targets[i]
                n = t.outstanding_requests
                w = t.outstanding_tokens
                if not n and uniform:  # an idle target: nothing beats it
                    best, pos = i, j
                    break
                cost = size * n + w
                tokens = w
                if not uniform:
                    cost /= t.speed
                    tokens = (w + size) / t.speed
                if cost < best_cost or (cost == best_cost and tokens < best_tokens):
                    best, pos, best_cost, best_tokens = i, j, cost, tokens
            self._picked(pos)
            return best
        for j, i in enumerate(order):
            t = targets[i]
            n = t.outstanding_requests
            w = t.outstanding_tokens
            if not n:
                if uniform:  # an idle target: nothing beats it (cost 0, fewest tokens)
                    best, pos = i, j
                    break
                cost = 0.0
            else:
                w_c = t.class_tokens[c]
                same = size * t.class_requests[c]
                s_min = w - t.longer_tokens[c] - w_c + size * t.longer_requests[c] + (same if same < w_c else w_c)
                cost = sep * (size * n + w) + k_min * s_min
                if not uniform:
                    cost /= t.speed
            if cost <= best_cost:
                tokens = w if uniform else (w + size) / t.speed
                if cost < best_cost or tokens < best_tokens:
                    best, pos, best_cost, best_tokens = i, j, cost, tokens
        self._picked(pos)
        return best

    def describe(self) -> dict[str, Any]:
        return {"separation": self.separation}
