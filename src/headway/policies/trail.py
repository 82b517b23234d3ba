"""TRAIL: SRPT on refined length predictions with limited preemption (Shahout et al., ICLR'25)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

from headway._optional import require
from headway.core import Policy, PolicyKey, Request, register_policy
from headway.policies._base import ScoredPolicy, check_nonneg, check_positive
from headway.policies._scoring import RequestNormals

__all__ = ["TrailOraclePolicy", "TrailPolicy", "lognormal_residual_mean"]

_NS = "trail"


@functools.cache
def _log_ndtr() -> Callable[[float], Any]:
    """scipy's ``log_ndtr``, imported once (a refinement runs per request, often many times)."""
    return cast("Callable[[float], Any]", require("scipy.special", "sim", "TRAIL's length refinement").log_ndtr)


def lognormal_residual_mean(mu: float, sigma: float, g: float) -> float:
    """``E[L | L > g]`` for ``log L ~ N(mu, sigma^2)`` (the Bayesian refinement of TRAIL)."""
    log_ndtr = _log_ndtr()

    if g <= 0.0:
        return math.exp(mu + sigma * sigma / 2.0)
    lg = math.log(g)
    log_num = mu + sigma * sigma / 2.0 + float(log_ndtr((mu + sigma * sigma - lg) / sigma))
    log_den = float(log_ndtr((mu - lg) / sigma))
    mean = math.exp(log_num - log_den)
    return g if g > mean else mean  # max(mean, g) without the call: the same value (even NaN)


@register_policy("trail")
class TrailPolicy(ScoredPolicy):
    """Key ``(predicted remaining output tokens,)``; preemptive with TRAIL's limit.

    - Initial prediction ``p0 = exp(score)`` tokens (the scorer must give log predicted
      tokens: the noisy oracle does; a ranker's logits need calibration first).
    - Refinement: TRAIL re-predicts from the model's embeddings every token. Without
      the model, the simulation refines in the Bayesian way: the prediction ``P`` is a
      lognormal prior ``N(log p0, sigma^2)`` (``prediction_sigma``: the predictor's
      log-space error, default 1.0); once ``g`` generated tokens exceed ``P`` the
      prediction becomes ``E[L | L > g]``. Between refinements the key ``P - g`` only
      improves; the refinement (a worse key) is announced by :meth:`rekey_after_tokens`.
    - Limited preemption: a running request may be preempted only while
      ``g <= c * p0`` (``c = 0.8``), early, when its KV footprint is small.
    """

    preemptive = True
    displacement = "pause"
    displacement_source = (
        "TRAIL (Shahout et al., ICLR'25): a preempted request's KV cache stays in GPU memory, which is "
        "why its preemption is limited to early in a request's life, when that cache is small"
    )
    # the key P - g falls by one per generated token until the refinement, announced by
    # rekey_after_tokens, which on_progress makes only there; the limit g <= c * p0 only lapses
    running_keys = "countdown"
    progress_at_hints = True

    def __init__(
        self,
        *,
        c: float = 0.8,
        prediction_sigma: float = 1.0,
        **scoring: Any,
    ) -> None:
        super().__init__(**scoring)  # scorer and the noisy oracle's settings (see ScoredPolicy)
        self.c = check_nonneg("c", c, "trail")
        self.prediction_sigma = check_positive("prediction_sigma", prediction_sigma, "trail")
        # the refinement's scipy, imported now rather than at the first refinement in the middle of a
        # run: a missing one fails here, and a simulation's CPU time does not count an import
        _log_ndtr()

    def _pred(self, request: Request) -> list[float]:
        st = request.extra.get(_NS)
        if not isinstance(st, list):
            st = self._start(request)
        return st

    def _start(self, request: Request) -> list[float]:
        """The request's state ``[initial prediction, current predicted total]``, made from its score
        (at its arrival) and kept in ``request.extra``: ``min(max(exp(min(score, log(max(max_tokens,
        1)) + 1)), 1), max_tokens)``, its min and max written out as comparisons, the same values
        (here and in the refinement below: CPython's builtin min and max parse their arguments as
        keywords at each call: a call costs about four times the comparison)."""
        max_tokens = request.max_tokens
        score = self.score_of(request)
        # clamped before exp (a score of 800 would overflow it): above log(max_tokens) + 1 the
        # prediction is capped at max_tokens anyway
        cap = math.log(1 if max_tokens < 1 else max_tokens) + 1.0
        p0 = math.exp(cap if cap < score else score)
        if p0 < 1.0:
            p0 = 1.0
        top = float(max_tokens)
        if top < p0:
            p0 = top
        st = [p0, p0]
        request.extra[_NS] = st
        return st

    def on_arrival(self, request: Request, now: float) -> None:
        self._pred(request)  # (ScoredPolicy's on_arrival: _pred scores it)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        st = request.extra.get(_NS)  # _pred's common case inlined here and below: hot paths
        if not isinstance(st, list):
            st = self._pred(request)
        g = request.num_output_tokens
        if g >= st[1]:
            # min(max(refined, g + 1.0), float(max(max_tokens, g + 1))), written out
            refined = lognormal_residual_mean(math.log(st[0]), self.prediction_sigma, g)
            low = g + 1.0
            if low > refined:
                refined = low
            max_tokens = request.max_tokens
            top = float(g + 1 if g + 1 > max_tokens else max_tokens)
            st[1] = top if top < refined else refined

    def key(self, request: Request, now: float) -> PolicyKey:
        st = request.extra.get(_NS)
        if not isinstance(st, list):
            st = self._pred(request)
        left = st[1] - request.num_output_tokens
        return (0.0 if left < 0.0 else left,)  # max(left, 0.0) without the call: the same value (even NaN)

    def rekey_after_tokens(self, request: Request) -> int | None:
        st = request.extra.get(_NS)
        if not isinstance(st, list):
            st = self._pred(request)
        after = math.ceil(st[1] - request.num_output_tokens)
        return 1 if after < 1 else after

    def can_preempt(self, request: Request, now: float) -> bool:
        st = request.extra.get(_NS)
        if not isinstance(st, list):
            st = self._pred(request)
        return request.num_output_tokens <= self.c * st[0]


@register_policy("trail-oracle")
class TrailOraclePolicy(Policy):
    """TRAIL+: SRPT on the *true* remaining length, optionally noisy, with TRAIL's limit.

    Key ``((L - g) * f,)`` where ``f = exp(noise * eps)`` is fixed per request
    (Gaussian noise in log space, ``eps`` from ``seed`` and the request id); with
    ``noise = 0`` (default) this is SRPT with perfect knowledge. The key only shrinks,
    so no rekey hints. Preemptible while ``g <= c * L * f`` (``c = 0.8``).
    """

    oracle = True
    preemptive = True
    displacement = "pause"
    displacement_source = TrailPolicy.displacement_source

    def __init__(self, *, c: float = 0.8, noise: float = 0.0, seed: int = 0) -> None:
        self.c = check_nonneg("c", c, "trail-oracle")
        self.noise = check_nonneg("noise", noise, "trail-oracle")
        self.seed = int(seed)
        self._normals = RequestNormals(self.seed, "trail")

    def on_workload(self, requests: Sequence[Request]) -> None:
        if self.noise != 0.0:  # the noise draws in bulk: the same values _factor draws one at a time
            self._normals.prime([r.request_id for r in requests])

    def _factor(self, request: Request) -> float:
        if self.noise == 0.0:
            return 1.0
        f = request.extra.get(_NS)
        if not isinstance(f, float):
            f = math.exp(self.noise * self._normals(request.request_id))
            request.extra[_NS] = f
        return f

    def key(self, request: Request, now: float) -> PolicyKey:
        return ((self.true_output_tokens(request) - request.num_output_tokens) * self._factor(request),)

    def can_preempt(self, request: Request, now: float) -> bool:
        initial = self.true_output_tokens(request) * self._factor(request)
        return request.num_output_tokens <= self.c * initial
