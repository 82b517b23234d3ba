"""Shared plumbing for the policies in this package: parameter checks and scored requests."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from headway._optional import MissingExtraError, install_hint
from headway.core import Policy, Request
from headway.policies._scoring import SCORE_KEY, NoisyOracleScorer, PromptScorer, ScoreFn

__all__ = [
    "NoisyOracleSettings",
    "ScoredPolicy",
    "check_nonneg",
    "check_positive",
    "check_range",
    "check_seed",
    "noisy_oracle_defaults",
]


def _as_float(value: float) -> float:
    """``value`` (a number already checked) as float; an int too large for a float is infinite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def check_positive(name: str, value: float, policy: str) -> float:
    """``value`` as float if it is finite and > 0, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{policy}: {name} must be a number, got {value!r}")
    number = _as_float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{policy}: {name} must be a finite number > 0, got {value!r}")
    return number


def check_nonneg(name: str, value: float, policy: str) -> float:
    """``value`` as float if it is finite and >= 0, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{policy}: {name} must be a number, got {value!r}")
    number = _as_float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{policy}: {name} must be a finite number >= 0, got {value!r}")
    return number


def check_range(name: str, value: float, lo: float, hi: float, policy: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (lo <= value <= hi):
        raise ValueError(f"{policy}: {name} must be in [{lo}, {hi}], got {value!r}")
    return float(value)


def check_seed(value: int, policy: str) -> int:
    """``value`` as int if it is an integer (not a bool), else a ValueError naming ``seed``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{policy}: seed must be an integer, got {value!r}")
    return int(value)


def _check_finite(name: str, value: float, policy: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{policy}: {name} must be a number, got {value!r}")
    number = _as_float(value)
    if not math.isfinite(number):
        raise ValueError(f"{policy}: {name} must be a finite number, got {value!r}")
    return number


@dataclass(frozen=True)
class NoisyOracleSettings:
    """The settings of the noisy oracle (:class:`~headway.policies.NoisyOracleScorer`) a
    :class:`ScoredPolicy` scores with under ``scorer='noisy-oracle'``: Kendall ``tau`` (required
    there), ``seed``, ``log_mean`` and ``log_std``. Every scored policy takes them as keyword
    settings (``make_policy("pars", scorer="noisy-oracle", tau=0.8)``, on the command line
    ``--policy-arg pars.tau=0.8``); they are held here as given and checked by :meth:`checked`."""

    tau: float | None = None
    seed: int = 0
    log_mean: float = 5.0
    log_std: float = 1.0

    def given(self, *names: str) -> list[str]:
        """``name=value`` for each setting in ``names`` (default: all) away from its default."""
        out = []
        for name in names or tuple(_NOISY_ORACLE_FIELDS):
            value, default = getattr(self, name), _NOISY_ORACLE_FIELDS[name].default
            if default is None or value is None:
                same = value is default
            else:
                same = not isinstance(value, bool) and isinstance(value, (int, float)) and value == default
            if not same:
                out.append(f"{name}={value!r}")
        return out

    def checked(self, policy: str) -> NoisyOracleSettings:
        """The settings as numbers; a ValueError prefixed by ``policy`` names a bad or missing one."""
        if self.tau is None:
            raise ValueError(f"{policy}: scorer='noisy-oracle' needs tau (Kendall tau in [-1, 1])")
        tau = check_range("tau", self.tau, -1.0, 1.0, policy)
        seed = check_seed(self.seed, policy)
        log_std = check_positive("log_std", self.log_std, policy)
        return NoisyOracleSettings(tau, seed, _check_finite("log_mean", self.log_mean, policy), log_std)

    def scorer(self, oracle: Callable[[Request], int]) -> NoisyOracleScorer:
        """The noisy oracle over the true-length lookup ``oracle`` (settings :meth:`checked` first)."""
        if self.tau is None:
            raise ValueError("the noisy oracle needs tau (Kendall tau in [-1, 1])")
        return NoisyOracleScorer(self.tau, oracle, seed=self.seed, log_mean=self.log_mean, log_std=self.log_std)


_NOISY_ORACLE_FIELDS = {f.name: f for f in fields(NoisyOracleSettings)}


def _reject_unused(policy: str, scorer: str, **settings: object) -> None:
    """A ValueError naming the noisy-oracle ``settings`` given (not at their defaults) to a ``scorer``
    that does not use them."""
    given = NoisyOracleSettings(**settings).given(*settings)  # type: ignore[arg-type]
    if given:
        one = len(given) == 1
        raise ValueError(
            f"{policy}: {', '.join(given)} {'is' if one else 'are'} only used by scorer='noisy-oracle'; "
            f"{scorer} ignores {'it' if one else 'them'}"
        )


ScorerSetting = str | Callable[[Request], float] | None
"""What a scored policy's ``scorer`` setting takes (see :class:`ScoredPolicy`); not to be confused
with :class:`headway.predict.Scorer`, a trained length predictor."""


@functools.cache
def _spec_scorer(spec: str) -> PromptScorer:
    """The predictor ``spec`` names, loaded once per process (a simulation builds its policies more
    than once: to check the settings, then per run)."""
    from headway.predict._load import load_batch_scorer

    return PromptScorer(load_batch_scorer(spec), spec)


def _is_spec(scorer: str) -> bool:
    """Whether ``scorer`` is a scorer spec as the gateway's ``--scorer`` takes: a trained predictor
    (``default``, ``default:onnx-int8``, a checkpoint directory) or ``module:attr``."""
    from headway.predict._resolve import predictor_spec

    return predictor_spec(scorer) is not None or ":" in scorer


class ScoredPolicy(Policy):
    """A policy whose key uses a length score (see :mod:`headway.policies._scoring`).

    ``scorer``:

    - ``None`` (default): use ``request.score`` (precomputed by the engine or workload);
      a request without one is an error naming it;
    - ``"noisy-oracle"``: :class:`NoisyOracleScorer` with Kendall ``tau`` (required),
      ``seed``, ``log_mean`` and ``log_std``; makes this *instance* an oracle policy;
    - ``"oracle"``: the noisy oracle at ``tau = 1`` (exact log length);
    - a callable ``Request -> float`` (e.g. :func:`~headway.policies.batch_scorer`);
    - a scorer spec, as the gateway's ``--scorer`` takes: ``"default"`` (the predictor
      ``headway predictor train`` wrote to the cache, else the one shipped in the package) or
      ``"default:onnx-int8"`` (its int8 graph), a checkpoint ``"DIR[:BACKEND]"`` or
      ``"module:attr"``; it scores the request's prompt text, loaded once per process.

    ``tau``, ``seed``, ``log_mean`` and ``log_std`` set the noisy oracle only: given (away from
    their defaults) with another scorer they are refused (a ValueError naming them), not ignored.

    A precomputed ``request.score`` always wins, so a workload scored offline by
    :func:`~headway.policies.noisy_oracle_scores` needs no oracle at run time.
    """

    def __init__(
        self,
        *,
        scorer: ScorerSetting = None,
        tau: float | None = None,
        seed: int = 0,
        log_mean: float = 5.0,
        log_std: float = 1.0,
    ) -> None:
        self._score_fn: ScoreFn | None = None
        if scorer in ("noisy-oracle", "oracle"):
            if scorer == "oracle":
                _reject_unused(self.name, "scorer='oracle' (exact)", seed=seed, log_mean=log_mean, log_std=log_std)
                if tau is not None and (isinstance(tau, bool) or tau != 1):
                    raise ValueError(f"{self.name}: scorer='oracle' is exact; got tau={tau!r}")
                tau = 1.0
            settings = NoisyOracleSettings(tau, seed, log_mean, log_std).checked(self.name)
            # An instance-level flag: this instance reads true lengths, others of the
            # class (scoring from a predictor) do not. Engines check ``policy.oracle``.
            self.oracle = True
            self._score_fn = settings.scorer(self.true_output_tokens)
        elif isinstance(scorer, str) and _is_spec(scorer):
            _reject_unused(self.name, f"scorer={scorer!r}", tau=tau, seed=seed, log_mean=log_mean, log_std=log_std)
            try:
                self._score_fn = _spec_scorer(scorer)
            except MissingExtraError as exc:  # (names the extra to install)
                raise ValueError(f"{self.name}: scorer {scorer!r}: {exc}") from None
            except ImportError as exc:
                raise ValueError(
                    f"{self.name}: scorer {scorer!r} needs the predictor's packages ({install_hint('score')}): {exc}"
                ) from None
            except ValueError as exc:
                raise ValueError(f"{self.name}: {exc}") from None
        elif scorer is None or callable(scorer):
            # the noisy oracle's settings would be ignored: refuse them rather than drop them
            what = "scorer=None (request.score)" if scorer is None else "a callable scorer"
            _reject_unused(self.name, what, tau=tau, seed=seed, log_mean=log_mean, log_std=log_std)
            self._score_fn = scorer
        else:
            from headway.predict._resolve import not_a_spec_hint

            hint = not_a_spec_hint(scorer, ("default", "noisy-oracle", "oracle")) if isinstance(scorer, str) else ""
            if callable(getattr(scorer, "score", None)):  # a Scorer or ShippedPredictor: it scores prompts
                hint = f" (a {type(scorer).__name__} scores prompts: pass headway.policies.batch_scorer(it))"
            raise ValueError(
                f"{self.name}: unknown scorer {scorer!r}; use None (request.score), 'noisy-oracle', "
                f"'oracle', 'default' (the shipped predictor), a scorer spec or a callable Request -> float{hint}"
            )
        self.scorer = scorer

    def on_workload(self, requests: Sequence[Request]) -> None:
        if isinstance(self._score_fn, NoisyOracleScorer):  # its draws in bulk, for those it will score
            self._score_fn.prime([r.request_id for r in requests if r.score is None])

    def on_arrival(self, request: Request, now: float) -> None:
        self.score_of(request)

    def score_of(self, request: Request) -> float:
        """The request's score, computed once and cached in ``request.extra``."""
        cached = request.extra.get(SCORE_KEY)
        if cached is not None:
            return cached  # type: ignore[return-value]
        if request.score is not None:
            value = float(request.score)
        elif self._score_fn is not None:
            value = float(self._score_fn(request))
        else:
            raise ValueError(
                f"{self.name}: request {request.request_id!r} has no score; precompute "
                "request.score or pass scorer= (a callable, or 'noisy-oracle' with tau)"
            )
        if not math.isfinite(value):
            raise ValueError(f"{self.name}: score of request {request.request_id!r} is {value}")
        request.extra[SCORE_KEY] = value
        return value


def noisy_oracle_defaults(
    policy: str, kwargs: Mapping[str, Any] | None, *, tau: float, seed: int
) -> dict[str, Any] | None:
    """Settings for ``policy`` on a workload without scores: for a :class:`ScoredPolicy` given no
    ``scorer``, ``kwargs`` with a noisy-oracle scorer at Kendall ``tau`` and ``seed`` (settings in
    ``kwargs``, such as its own ``tau``, win); None for other policies or when a scorer is set.
    ``headway simulate`` and ``headway sweep`` both fill in scores this way."""
    from headway.core import get_policy_class

    given = dict(kwargs or {})
    if not issubclass(get_policy_class(policy), ScoredPolicy) or "scorer" in given:
        return None
    return {"scorer": "noisy-oracle", "tau": tau, "seed": seed, **given}
