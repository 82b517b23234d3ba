"""DriftSched (Palaniappan, 2026): multi-tenant QoS scheduling under runtime token drift.

**Estimator.** A prompt is classified into one of :data:`CATEGORIES` (the request's
``category`` when given, else keyword rules on the prompt text, else its length), and
its output tokens are estimated as

    T = T_base(category) x B_runtime(category) x S_tenant x F_input

- ``T_base``: static per-category budgets (:data:`DEFAULT_BASE_TOKENS`);
- ``B_runtime``: runtime drift correction, learned online from finished requests as an
  EMA of the observed/base ratio ``r = observed / (T_base x S_tenant x F_input)``,
  each ratio clamped to ``[ratio_min, ratio_max]`` (0.1, 10) and ``B`` itself to the
  same range: ``B <- (1 - alpha) B + alpha r`` with ``alpha = 0.1``;
- ``S_tenant``: a fixed per-tenant scale (default 1);
- ``F_input = clip((prompt tokens / 256)^0.25, 0.5, 2)``: longer inputs ask for longer
  answers, sub-linearly.

With ``adaptive=False`` (the *static* estimator) ``B`` stays 1.

**Policies** (all non-preemptive, tiers from :class:`~headway.core.Tier`):

- ``tenant-fifo``: ``(arrival,)``;
- ``tenant-priority``: strict tiers ``(tier, arrival)``;
- ``tenant-weighted``: start-time fair queueing over tiers with weights 5/3/2;
- ``tenant-sjf``: ``(estimate,)``;
- ``tenant-aging``: priority ``tier - rate x wait`` written time-invariantly as
  ``tier + rate x arrival`` (``rate`` = 1/30 tier per second of waiting).
"""

from __future__ import annotations

from collections.abc import Mapping

from headway.core import Policy, PolicyKey, Request, Tier, register_policy
from headway.policies._base import check_positive, check_range

__all__ = [
    "CATEGORIES",
    "DEFAULT_BASE_TOKENS",
    "DriftEstimator",
    "TenantAgingPolicy",
    "TenantFIFOPolicy",
    "TenantPriorityPolicy",
    "TenantSJFPolicy",
    "TenantWeightedPolicy",
    "classify_prompt",
]

CATEGORIES: tuple[str, ...] = ("short_qa", "summary", "technical", "report")

DEFAULT_BASE_TOKENS: dict[str, float] = {
    "short_qa": 64.0,
    "summary": 192.0,
    "technical": 384.0,
    "report": 768.0,
}
"""Static output budgets per category (tokens): the admission-time guess before drift."""

_KEYWORDS: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    # (category, single-word cues, phrase cues); checked in this order
    (
        "summary",
        frozenset({"summarize", "summarise", "summary", "tldr", "tl;dr", "condense", "abstract", "recap"}),
        ("key points",),
    ),
    (
        "report",
        frozenset({"report", "essay", "comprehensive", "proposal", "whitepaper"}),
        (
            "write a detailed",
            "write an detailed",
            "write a long",
            "write a comprehensive",
            "in detail",
            "white paper",
            "blog post",
        ),
    ),
    (
        "technical",
        frozenset(
            {
                "code",
                "function",
                "python",
                "java",
                "javascript",
                "sql",
                "algorithm",
                "implement",
                "debug",
                "compile",
                "class",
                "api",
                "regex",
                "bash",
                "error",
                "derive",
                "proof",
                "equation",
            }
        ),
        ("explain how",),
    ),
)
_PUNCT = str.maketrans({c: " " for c in "!\"#$%&'()*+,-./:<=>?@[\\]^_`{|}~\n\t"})


def classify_prompt(prompt: str | None, num_prompt_tokens: int = 0, category: str | None = None) -> str:
    """Category of a request: the given ``category`` if valid, else keyword rules, else length."""
    if category in CATEGORIES:
        return category
    if prompt:
        lower = prompt.lower()
        words = set(lower.translate(_PUNCT).split())
        for cat, cue_words, phrases in _KEYWORDS:
            if not cue_words.isdisjoint(words) or any(ph in lower for ph in phrases):
                return cat
    if num_prompt_tokens >= 1024:
        return "summary"  # long inputs without cues are mostly documents to digest
    return "short_qa"


class DriftEstimator:
    """``T = T_base(cat) x B_runtime(cat) x S_tenant x F_input`` with online ``B_runtime``."""

    def __init__(
        self,
        *,
        base_tokens: Mapping[str, float] | None = None,
        tenant_scale: Mapping[str, float] | None = None,
        alpha: float = 0.1,
        adaptive: bool = True,
        ratio_min: float = 0.1,
        ratio_max: float = 10.0,
        input_ref: float = 256.0,
        input_exponent: float = 0.25,
    ) -> None:
        base = dict(DEFAULT_BASE_TOKENS if base_tokens is None else base_tokens)
        missing = [c for c in CATEGORIES if c not in base]
        if missing:
            raise ValueError(f"driftsched: base_tokens lacks categories {missing}")
        for c, v in base.items():
            check_positive(f"base_tokens[{c!r}]", v, "driftsched")
        self.base = {c: float(base[c]) for c in CATEGORIES}
        self.tenant_scale = {
            k: check_positive(f"tenant_scale[{k!r}]", v, "driftsched") for k, v in (tenant_scale or {}).items()
        }
        self.alpha = check_range("alpha", alpha, 0.0, 1.0, "driftsched")
        self.adaptive = bool(adaptive)
        self.ratio_min = check_positive("ratio_min", ratio_min, "driftsched")
        self.ratio_max = check_positive("ratio_max", ratio_max, "driftsched")
        if self.ratio_min >= self.ratio_max:
            raise ValueError(f"driftsched: ratio_min ({ratio_min}) must be < ratio_max ({ratio_max})")
        self.input_ref = check_positive("input_ref", input_ref, "driftsched")
        self.input_exponent = check_range("input_exponent", input_exponent, 0.0, 2.0, "driftsched")
        self.b_runtime = {c: 1.0 for c in CATEGORIES}

    def input_factor(self, num_prompt_tokens: int) -> float:
        factor: float = (num_prompt_tokens / self.input_ref) ** self.input_exponent
        return min(max(factor, 0.5), 2.0)

    def category(self, request: Request) -> str:
        """The request's category, classified once and cached in ``request.extra``."""
        cat = request.extra.get("driftsched.category")
        if not isinstance(cat, str):
            cat = classify_prompt(request.prompt, request.num_prompt_tokens, request.category)
            request.extra["driftsched.category"] = cat
        return cat

    def static_estimate(self, request: Request) -> float:
        """``T_base x S_tenant x F_input`` (``B_runtime`` = 1)."""
        return (
            self.base[self.category(request)]
            * self.tenant_scale.get(request.tenant_id, 1.0)
            * self.input_factor(request.num_prompt_tokens)
        )

    def estimate(self, request: Request) -> float:
        return self.static_estimate(request) * self.b_runtime[self.category(request)]

    def observe(self, request: Request, observed_tokens: int) -> None:
        """Feedback from a finished request: EMA of its clamped observed/base ratio."""
        if not self.adaptive:
            return
        cat = self.category(request)
        ratio = min(max(observed_tokens / self.static_estimate(request), self.ratio_min), self.ratio_max)
        b = (1.0 - self.alpha) * self.b_runtime[cat] + self.alpha * ratio
        self.b_runtime[cat] = min(max(b, self.ratio_min), self.ratio_max)


_EST_KEY = "driftsched.estimate"


class _TenantPolicy(Policy):
    """Shared estimator plumbing: every tenant policy estimates at arrival and learns at finish."""

    def __init__(self, *, estimator: DriftEstimator | None = None, adaptive: bool = True, alpha: float = 0.1) -> None:
        self.estimator = estimator if estimator is not None else DriftEstimator(adaptive=adaptive, alpha=alpha)

    def on_arrival(self, request: Request, now: float) -> None:
        est = self.estimator
        static = est.static_estimate(request)
        request.extra["driftsched.static"] = static
        request.extra[_EST_KEY] = static * est.b_runtime[est.category(request)]

    def estimate_of(self, request: Request) -> float:
        est = request.extra.get(_EST_KEY)
        if not isinstance(est, float):
            est = self.estimator.estimate(request)
            request.extra[_EST_KEY] = est
        return est

    def on_finish(self, request: Request, now: float) -> None:
        self.estimator.observe(request, request.num_output_tokens)


@register_policy("tenant-fifo")
class TenantFIFOPolicy(_TenantPolicy):
    """FIFO across all tenants (the estimator still learns, for reporting)."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.arrival_time,)


@register_policy("tenant-priority")
class TenantPriorityPolicy(_TenantPolicy):
    """Strict tiers: Premium before Standard before Batch, FIFO within a tier."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (int(request.tier), request.arrival_time)


@register_policy("tenant-sjf")
class TenantSJFPolicy(_TenantPolicy):
    """Shortest estimated job first (DriftSched estimate at arrival)."""

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.estimate_of(request),)


@register_policy("tenant-aging")
class TenantAgingPolicy(_TenantPolicy):
    """Priority ``tier - rate x wait``; keyed as ``tier + rate x arrival`` (time-invariant)."""

    def __init__(
        self,
        *,
        rate: float = 1.0 / 30.0,
        estimator: DriftEstimator | None = None,
        adaptive: bool = True,
        alpha: float = 0.1,
    ) -> None:
        super().__init__(estimator=estimator, adaptive=adaptive, alpha=alpha)
        self.rate = check_positive("rate", rate, "tenant-aging")

    def key(self, request: Request, now: float) -> PolicyKey:
        return (int(request.tier) + self.rate * request.arrival_time,)


@register_policy("tenant-weighted")
class TenantWeightedPolicy(_TenantPolicy):
    """Weighted tier shares by start-time fair queueing (SFQ, Goyal et al.).

    At arrival a request gets a start tag ``S = max(v, F_last[tier])`` and finish tag
    ``F = S + cost / weight[tier]`` (``F_last[tier] <- F``); the queue orders by ``S``.
    ``v`` (virtual time) is the start tag of the last request that began service (seen
    at its first ``on_progress``). Backlogged tiers are thus served in proportion to
    their weights (default Premium/Standard/Batch = 5/3/2). ``cost`` is 1 per request
    (``share="requests"``) or the DriftSched token estimate (``share="tokens"``).
    Tags are fixed at arrival, so keys are time-invariant.
    """

    def __init__(
        self,
        *,
        weights: Mapping[str | int, float] | tuple[float, float, float] = (5.0, 3.0, 2.0),
        share: str = "requests",
        estimator: DriftEstimator | None = None,
        adaptive: bool = True,
        alpha: float = 0.1,
    ) -> None:
        super().__init__(estimator=estimator, adaptive=adaptive, alpha=alpha)
        if isinstance(weights, tuple):
            if len(weights) != len(Tier):
                raise ValueError(f"tenant-weighted: need {len(Tier)} weights, got {weights!r}")
            w = {t: float(x) for t, x in zip(Tier, weights, strict=True)}
        else:
            w = {Tier.parse(k): float(v) for k, v in weights.items()}
            missing = [t.name.lower() for t in Tier if t not in w]
            if missing:
                raise ValueError(f"tenant-weighted: weights lack tiers {missing}")
        for t, x in w.items():
            check_positive(f"weights[{t.name.lower()}]", x, "tenant-weighted")
        if share not in ("requests", "tokens"):
            raise ValueError(f"tenant-weighted: share must be 'requests' or 'tokens', got {share!r}")
        self.weights = w
        self.share = share
        self.virtual_time = 0.0
        self._last_finish = {t: 0.0 for t in Tier}

    def on_arrival(self, request: Request, now: float) -> None:
        super().on_arrival(request, now)
        cost = 1.0 if self.share == "requests" else self.estimate_of(request)
        start = max(self.virtual_time, self._last_finish[request.tier])
        self._last_finish[request.tier] = start + cost / self.weights[request.tier]
        request.extra["driftsched.start_tag"] = start

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        tag = request.extra.get("driftsched.start_tag")
        if isinstance(tag, float) and tag > self.virtual_time:
            self.virtual_time = tag

    def key(self, request: Request, now: float) -> PolicyKey:
        tag = request.extra.get("driftsched.start_tag")
        if not isinstance(tag, float):
            self.on_arrival(request, now)
            tag = request.extra["driftsched.start_tag"]
        return (tag,)  # type: ignore[return-value]
