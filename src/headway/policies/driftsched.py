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

With ``adaptive=False`` (the *static* estimator) ``B`` stays 1. A finished request whose
output length the engine could not observe (``request.output_tokens_known`` False, set by
the gateway when a backend's answer has no ``usage``) teaches nothing.

Every policy takes the estimator's settings ``adaptive`` (a bool), ``alpha`` (``0 < alpha <= 1``),
``tenant_scale`` (tenant -> scale) and ``base_tokens`` (category -> tokens, all of
:data:`CATEGORIES`), or a ready ``estimator`` (:class:`DriftEstimator`) instead of them.

**Policies** (all non-preemptive, tiers from :class:`~headway.core.Tier`):

- ``tenant-fifo``: ``(arrival,)``;
- ``tenant-priority``: strict tiers ``(tier, arrival)``;
- ``tenant-weighted``: start-time fair queueing over tiers with weights 5/3/2 (per gateway
  replica: see :class:`TenantWeightedPolicy`);
- ``tenant-sjf``: ``(estimate,)``, re-keyed when ``B_runtime`` drifts;
- ``tenant-aging``: priority ``tier - rate x wait`` written time-invariantly as
  ``tier + rate x arrival`` (``rate`` = 1/30 tier per second of waiting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
        if base_tokens is not None and not isinstance(base_tokens, Mapping):
            raise ValueError(f"driftsched: base_tokens must be a mapping category -> tokens, got {base_tokens!r}")
        if tenant_scale is not None and not isinstance(tenant_scale, Mapping):
            raise ValueError(f"driftsched: tenant_scale must be a mapping tenant -> scale, got {tenant_scale!r}")
        base = dict(DEFAULT_BASE_TOKENS if base_tokens is None else base_tokens)
        missing = [c for c in CATEGORIES if c not in base]
        if missing:
            raise ValueError(f"driftsched: base_tokens lacks categories {missing}")
        unknown = [c for c in base if c not in CATEGORIES]
        if unknown:
            raise ValueError(f"driftsched: base_tokens has unknown categories {unknown}; valid: {list(CATEGORIES)}")
        for c, v in base.items():
            check_positive(f"base_tokens[{c!r}]", v, "driftsched")
        self.base = {c: float(base[c]) for c in CATEGORIES}
        self.tenant_scale = {
            k: check_positive(f"tenant_scale[{k!r}]", v, "driftsched") for k, v in (tenant_scale or {}).items()
        }
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            # alpha = 0 would freeze B at 1: the static estimator under another name
            raise ValueError(f"driftsched: alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        if not isinstance(adaptive, bool):
            raise ValueError(f"driftsched: adaptive must be true or false, got {adaptive!r}")
        self.adaptive = adaptive
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

    def __init__(
        self,
        *,
        estimator: DriftEstimator | None = None,
        adaptive: bool | None = None,
        alpha: float | None = None,
        tenant_scale: Mapping[str, float] | None = None,
        base_tokens: Mapping[str, float] | None = None,
    ) -> None:
        settings: dict[str, Any] = {
            k: v
            for k, v in (
                ("adaptive", adaptive),
                ("alpha", alpha),
                ("tenant_scale", tenant_scale),
                ("base_tokens", base_tokens),
            )
            if v is not None
        }
        if estimator is None:
            self.estimator = DriftEstimator(**settings)
        elif not isinstance(estimator, DriftEstimator):
            raise ValueError(f"{self.name}: estimator must be a DriftEstimator, got {estimator!r}")
        elif settings:
            raise ValueError(
                f"{self.name}: give either estimator= or the estimator's settings, not both "
                f"(got estimator= and {sorted(settings)})"
            )
        else:
            self.estimator = estimator

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
        self.learn(request)

    def learn(self, request: Request) -> bool:
        """Feed a finished request's output length to the estimator; False (nothing learned)
        when the engine could not observe it (``request.output_tokens_known``)."""
        if not request.output_tokens_known:
            return False
        self.estimator.observe(request, request.num_output_tokens)
        return True


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
    """Shortest estimated job first (DriftSched estimate).

    Keys of every queued request must be on one scale, so the key is the static estimate times
    ``B_runtime`` *as of the last re-key* (a snapshot), not as of each request's arrival. Once
    some category's live ``B`` has moved by more than ``rekey_drift`` (relative, default 5 %)
    from the snapshot, the snapshot is renewed and ``key_epoch`` bumped, so queues re-key every
    waiting request; checked at finishes, at most once per ``rekey_every`` learning finishes
    (as gamma-Ada's refits are). Long jobs may wait indefinitely under a stream of short ones:
    that is SJF; ``tenant-aging`` bounds waiting by tier instead.
    """

    def __init__(
        self,
        *,
        rekey_drift: float = 0.05,
        rekey_every: int = 50,
        **estimator: Any,
    ) -> None:
        super().__init__(**estimator)  # estimator=, or its settings (see _TenantPolicy)
        self.rekey_drift = check_positive("rekey_drift", rekey_drift, "tenant-sjf")
        if isinstance(rekey_every, bool) or not isinstance(rekey_every, int) or rekey_every < 1:
            raise ValueError(f"tenant-sjf: rekey_every must be an int >= 1, got {rekey_every!r}")
        self.rekey_every = rekey_every
        self.key_b = dict(self.estimator.b_runtime)
        """``B_runtime`` per category as of the last re-key: the scale of every cached key."""
        self._since_rekey = 0

    def key(self, request: Request, now: float) -> PolicyKey:
        est = self.estimator
        static = request.extra.get("driftsched.static")
        if not isinstance(static, float):
            static = est.static_estimate(request)
            request.extra["driftsched.static"] = static
        return (static * self.key_b[est.category(request)],)

    def on_finish(self, request: Request, now: float) -> None:
        if not self.learn(request):
            return
        self._since_rekey += 1
        if self._since_rekey < self.rekey_every:
            return
        b, snap = self.estimator.b_runtime, self.key_b
        if any(abs(b[c] - snap[c]) > self.rekey_drift * snap[c] for c in CATEGORIES):
            self.key_b = dict(b)
            self._since_rekey = 0
            self.key_epoch += 1


@register_policy("tenant-aging")
class TenantAgingPolicy(_TenantPolicy):
    """Priority ``tier - rate x wait``; keyed as ``tier + rate x arrival`` (time-invariant)."""

    def __init__(
        self,
        *,
        rate: float = 1.0 / 30.0,
        **estimator: Any,
    ) -> None:
        super().__init__(**estimator)  # estimator=, or its settings (see _TenantPolicy)
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
    Tags are fixed at arrival, so keys are time-invariant. ``weights``: a mapping tier ->
    weight (``{"premium": 5, ...}``) or a sequence in tier order (``[5, 3, 2]``).

    The virtual time and the last finish tags live in this instance. Gateway replicas sharing
    one Redis queue share them in Redis instead (:class:`~headway.core.SharedStartTags`):
    the queue draws each start tag there, so tags from every replica are comparable and
    the shares hold across replicas.
    """

    def __init__(
        self,
        *,
        weights: Mapping[str | int, float] | Sequence[float] = (5.0, 3.0, 2.0),
        share: str = "requests",
        **estimator: Any,
    ) -> None:
        super().__init__(**estimator)  # estimator=, or its settings (see _TenantPolicy)
        self.weights = self._parse_weights(weights)
        if share not in ("requests", "tokens"):
            raise ValueError(f"tenant-weighted: share must be 'requests' or 'tokens', got {share!r}")
        self.share = share
        self.virtual_time = 0.0
        self._last_finish = {t: 0.0 for t in Tier}

    @staticmethod
    def _parse_weights(weights: object) -> dict[Tier, float]:
        items: list[tuple[Tier, object]]
        if isinstance(weights, Mapping):
            items = []
            for k, v in weights.items():
                try:
                    items.append((Tier.parse(k), v))
                except ValueError as exc:
                    raise ValueError(f"tenant-weighted: weights key {k!r}: {exc}") from None
            missing = [t.name.lower() for t in Tier if t not in {t for t, _ in items}]
            if missing:
                raise ValueError(f"tenant-weighted: weights lack tiers {missing}")
        elif isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
            if len(weights) != len(Tier):
                raise ValueError(
                    f"tenant-weighted: weights needs {len(Tier)} values "
                    f"({', '.join(t.name.lower() for t in Tier)}), got {weights!r}"
                )
            items = list(zip(Tier, weights, strict=True))
        else:
            raise ValueError(
                f"tenant-weighted: weights must be a mapping tier -> weight or a sequence of {len(Tier)} weights "
                f"in tier order, got {weights!r}"
            )
        w: dict[Tier, float] = {}
        for t, x in items:
            name = f"weights[{t.name.lower()}]"
            try:
                if isinstance(x, bool):
                    raise TypeError("a bool is no weight")
                value = float(x)  # type: ignore[arg-type]
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"tenant-weighted: {name} must be a number, got {x!r}") from None
            w[t] = check_positive(name, value, "tenant-weighted")
        return w

    def on_arrival(self, request: Request, now: float) -> None:
        super().on_arrival(request, now)
        _, increment = self.tag_flow(request)
        start = max(self.virtual_time, self._last_finish[request.tier])
        self._last_finish[request.tier] = start + increment
        self.set_start_tag(request, start)

    # SharedStartTags: a shared queue draws the tags from shared state instead
    def tag_flow(self, request: Request) -> tuple[str, float]:
        cost = 1.0 if self.share == "requests" else self.estimate_of(request)
        return request.tier.name.lower(), cost / self.weights[request.tier]

    def set_start_tag(self, request: Request, start: float) -> None:
        request.extra["driftsched.start_tag"] = float(start)

    def start_tag(self, request: Request) -> float | None:
        tag = request.extra.get("driftsched.start_tag")
        return tag if isinstance(tag, float) else None

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        tag = self.start_tag(request)
        if tag is not None and tag > self.virtual_time:
            self.virtual_time = tag

    def key(self, request: Request, now: float) -> PolicyKey:
        tag = self.start_tag(request)
        if tag is None:
            self.on_arrival(request, now)
            tag = self.start_tag(request)
        return (tag,)  # type: ignore[return-value]
