"""rank-boost: partial-information gamma-Boost over a learned ranker's score buckets.

Yu & Scully's Boost with partial information: a job whose *label* is ``l`` (here: the
bucket of its predicted score) gets boost

    b_gamma(l) = (1/gamma) log( E[e^{gamma S} | L=l] / (E[e^{gamma S} | L=l] - 1) )

and the scheduler serves the smallest boosted arrival time ``a_i - b_gamma(l_i)``.
When the label pins the size, this is gamma-Boost; when it says nothing, every job gets
the same boost and the order is FCFS. A good ranker therefore moves the policy towards
SJF (mean) while the arrival time keeps the tail in check (long jobs age like FCFS).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any

import numpy as np

from headway.core import PolicyKey, Request, register_policy
from headway.policies._base import ScoredPolicy, check_nonneg, check_positive
from headway.policies._boost import GammaAda, b_gamma, b_gamma_from_log_mgf, check_gamma

__all__ = ["RankBoostPolicy"]


@register_policy("rank-boost")
class RankBoostPolicy(ScoredPolicy):
    """Key ``(a_i - b_gamma(bucket(score_i)),)``; non-preemptive.

    **Buckets.** ``num_buckets`` (8) score quantiles, fixed from the first ``warmup``
    (256) scores seen; until then every request is in one pooled bucket.

    **Learning E[e^{gamma S} | L].** Each finished request adds its size ``S = theta *
    max(generated, prefill_weight * prompt)`` seconds (UniBoost's work measure, theta =
    ``seconds_per_token``) to its bucket's window (last ``window`` = 1000). Every
    ``refit_every`` (50) finishes the per-bucket ``log E[e^{gamma S}]`` is recomputed
    (log-sum-exp), shrunk (in the log domain) towards the pooled value with weight ``prior_weight`` (20
    pseudo-samples) so thin buckets are not noisy, and ``key_epoch`` is bumped. Before
    any finish the boost is UniBoost's ``b_gamma(theta * prefill_weight * prompt)``.

    **gamma.** Fixed (``adaptive=False``) or gamma-Ada (default), refitted on the same
    schedule; units as UniBoost (1/s).
    """

    def __init__(
        self,
        *,
        gamma: float = 0.1,
        seconds_per_token: float = 0.02,
        prefill_weight: float = 1.0,
        num_buckets: int = 8,
        warmup: int = 256,
        window: int = 1000,
        refit_every: int = 50,
        prior_weight: float = 20.0,
        adaptive: bool = True,
        gamma_min: float = 0.005,
        gamma_max: float = 5.0,
        **scoring: Any,
    ) -> None:
        super().__init__(**scoring)  # scorer and the noisy oracle's settings (see ScoredPolicy)
        n = "rank-boost"
        self.gamma = check_gamma("gamma", gamma, n)
        self.seconds_per_token = check_positive("seconds_per_token", seconds_per_token, n)
        self.prefill_weight = check_nonneg("prefill_weight", prefill_weight, n)
        self.prior_weight = check_nonneg("prior_weight", prior_weight, n)
        for name, v in (
            ("num_buckets", num_buckets),
            ("warmup", warmup),
            ("window", window),
            ("refit_every", refit_every),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{n}: {name} must be an int >= 1, got {v!r}")
        if warmup < num_buckets:
            raise ValueError(f"{n}: warmup ({warmup}) must be >= num_buckets ({num_buckets})")
        self.num_buckets = num_buckets
        self.warmup = warmup
        self.refit_every = refit_every
        self.ada: GammaAda | None = (
            GammaAda(
                self.gamma,
                refit_every=refit_every,
                min_samples=200,
                gamma_min=gamma_min,
                gamma_max=gamma_max,
                name=n,
            )
            if adaptive
            else None
        )
        self._warm_scores: list[float] = []
        self.edges: list[float] | None = None
        self._sizes: list[deque[float]] = [deque(maxlen=window) for _ in range(num_buckets + 1)]
        self._boosts: list[float] | None = None  # per bucket; index num_buckets = pooled
        self._since = 0

    # ---------------------------------------------------------------- buckets
    def bucket(self, score: float) -> int:
        """Bucket index of ``score`` (``num_buckets`` = the pooled bucket, before warm-up ends)."""
        if self.edges is None:
            return self.num_buckets
        return bisect.bisect_right(self.edges, score)

    def on_arrival(self, request: Request, now: float) -> None:
        s = self.score_of(request)
        if self.edges is None:
            self._warm_scores.append(s)
            if len(self._warm_scores) >= self.warmup:
                qs = np.quantile(np.asarray(self._warm_scores), np.arange(1, self.num_buckets) / self.num_buckets)
                self.edges = [float(q) for q in qs]
                self._warm_scores = []
                if self._boosts is not None:
                    self._refit()
        request.extra["rank-boost.bucket"] = self.bucket(s)

    def size_of(self, request: Request) -> float:
        return self.seconds_per_token * max(
            float(request.num_output_tokens), self.prefill_weight * request.num_prompt_tokens, 1.0
        )

    def on_finish(self, request: Request, now: float) -> None:
        if self.ada is not None and self.ada.observe(now - request.arrival_time):
            self.gamma = self.ada.gamma
        if not request.output_tokens_known:  # no size to learn (its latency counted above)
            return
        b = request.extra.get("rank-boost.bucket")
        if not isinstance(b, int):
            b = self.bucket(self.score_of(request))
        size = self.size_of(request)
        self._sizes[b].append(size)
        if b != self.num_buckets:
            self._sizes[self.num_buckets].append(size)
        self._since += 1
        if self._since >= self.refit_every or self._boosts is None:
            self._since = 0
            self._refit()

    def _log_mgf(self, sizes: deque[float]) -> float:
        x = self.gamma * np.fromiter(sizes, dtype=float)
        m = float(x.max())
        return m + math.log(float(np.exp(x - m).mean()))

    def _refit(self) -> None:
        pooled = self._sizes[self.num_buckets]
        if not pooled:
            return
        lp = self._log_mgf(pooled)
        boosts: list[float] = []
        for b in range(self.num_buckets):
            sz = self._sizes[b]
            n = len(sz)
            if n == 0:
                lm = lp
            else:
                # shrink log E[e^{gamma S}] towards the pooled value (a linear-domain
                # mix would be dominated by the pooled long jobs)
                w = n / (n + self.prior_weight)
                lm = w * self._log_mgf(sz) + (1.0 - w) * lp
            boosts.append(b_gamma_from_log_mgf(lm, self.gamma))
        boosts.append(b_gamma_from_log_mgf(lp, self.gamma))
        self._boosts = boosts
        self.key_epoch += 1

    def boost_of(self, request: Request) -> float:
        b = request.extra.get("rank-boost.bucket")
        if not isinstance(b, int):
            b = self.bucket(self.score_of(request))
        if self.edges is not None and b == self.num_buckets:
            b = self.bucket(self.score_of(request))
            request.extra["rank-boost.bucket"] = b
        if self._boosts is None:
            return b_gamma(
                self.seconds_per_token * max(self.prefill_weight * request.num_prompt_tokens, 1.0), self.gamma
            )
        return self._boosts[b]

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.arrival_time - self.boost_of(request),)
