"""Length scores for score-ranked policies, and the noisy oracle used in simulation studies.

**Scorer protocol.** A *score* is a float where higher means a longer expected response
(the predictor's output: a log-length regression, a ranker's logit, ...). A policy gets
the score of a request, once, at ``on_arrival`` from the first of:

1. ``request.score`` when the engine or the workload precomputed it (the simulator
   copies :attr:`headway.workload.RequestSpec.score`; the gateway can batch-score);
2. the policy's ``scorer``: any callable ``Request -> float``. Use
   :func:`batch_scorer` to adapt a text predictor with ``score(prompts) -> array``
   (``headway.predict.Scorer``), or :class:`NoisyOracleScorer` in simulation; a scorer
   spec such as ``"default"`` (see :class:`~headway.policies._base.ScoredPolicy`) is
   loaded into a :class:`PromptScorer`.

The score is cached in ``request.extra[SCORE_KEY]`` so keys never recompute it.

**Noisy oracle.** Studies without prompt text need scores with a *chosen* rank quality.
:class:`NoisyOracleScorer` draws, per request, ``score = mu + rho (log L - mu) +
sigma sqrt(1 - rho^2) eps`` with ``rho = sin(pi tau / 2)`` and ``eps ~ N(0, 1)``: when
``log L`` is Gaussian with standard deviation ``sigma`` this is a Gaussian copula whose
Kendall tau with ``L`` is exactly ``tau`` (Greiner's relation ``tau = (2/pi) asin rho``).
The noise is a pure function of ``(seed, request_id)``, so runs are bit-reproducible in
any engine. For a whole workload known in advance, :func:`noisy_oracle_scores` instead
uses normal scores of the ranks (exact for any length distribution) and calibrates rho
by bisection so that the *sample* tau-b hits the target.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from headway._optional import require
from headway.core import Request
from headway.policies._draws import normals_from_states, seed_states

__all__ = [
    "SCORE_KEY",
    "BatchTextScorer",
    "NoisyOracleScorer",
    "PromptScorer",
    "RequestNormals",
    "ScoreFn",
    "batch_scorer",
    "kendall_tau",
    "noisy_oracle_scores",
    "request_normal",
    "request_normals",
    "request_seed_states",
    "tau_to_rho",
]

SCORE_KEY = "headway.score"
"""``request.extra`` key under which policies cache a request's score."""

ScoreFn = Callable[[Request], float]
"""A scorer: maps a request to its length score (higher = longer)."""


class BatchTextScorer(Protocol):
    """What ``headway.predict`` scorers look like: prompts in, one score per prompt out."""

    def score(self, prompts: Sequence[str]) -> Any: ...


class PromptScorer:
    """A :data:`ScoreFn` scoring a request's prompt text with a batch function ``list[str] -> scores``
    (a batch of one); ``name`` is what its repr shows (a scorer spec such as ``"default"``)."""

    def __init__(self, score_batch: Callable[[list[str]], Any], name: str) -> None:
        self._score_batch = score_batch
        self.name = name

    def __call__(self, request: Request) -> float:
        if request.prompt is None:
            raise ValueError(f"request {request.request_id!r} has no prompt text; a text predictor cannot score it")
        return float(np.asarray(self._score_batch([request.prompt]), dtype=float).reshape(-1)[0])

    def __repr__(self) -> str:
        return f"PromptScorer({self.name!r})"


def batch_scorer(predictor: BatchTextScorer) -> ScoreFn:
    """Adapt a batch text scorer (``score(prompts) -> array``) to a per-request :data:`ScoreFn`."""
    return PromptScorer(predictor.score, type(predictor).__name__)


def tau_to_rho(tau: float) -> float:
    """Pearson correlation of a bivariate normal whose Kendall tau is ``tau``."""
    return math.sin(math.pi * tau / 2.0)


def request_normal(seed: int, request_id: str, salt: str = "") -> float:
    """A standard normal draw that is a pure function of ``(seed, request_id, salt)``.

    Uses numpy's ``default_rng`` seeded from a BLAKE2 hash, so the value does not
    depend on arrival order, the engine, or Python's hash randomization. The hash's 64 bits
    are handed to ``SeedSequence`` as their two little-endian 32-bit words, the words
    ``default_rng(int.from_bytes(digest, "little"))`` makes of them (a high word of 0 is the
    pool's own padding), without its conversion of a Python int: the same draw, bit for bit,
    in less time (this runs once per request).
    """
    words = np.frombuffer(_digest(seed, request_id, salt), dtype="<u4")
    return float(np.random.Generator(np.random.PCG64(np.random.SeedSequence(words))).standard_normal())


def _digest(seed: int, request_id: str, salt: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x1f{salt}\x1f{request_id}".encode(), digest_size=8).digest()


def request_seed_states(seed: int, request_ids: Sequence[str], salt: str = "") -> dict[str, NDArray[np.uint64]]:
    """The generator seeds of :func:`request_normal`'s draws for many requests, computed at once
    (:mod:`headway.policies._draws`): ``normal_from_state(states[id])`` is
    ``request_normal(seed, id, salt)``, bit for bit, in about a fifth of its time."""
    ids = list(request_ids)
    return dict(zip(ids, _seed_state_rows(seed, ids, salt), strict=True))


def request_normals(seed: int, request_ids: Sequence[str], salt: str = "") -> dict[str, float]:
    """:func:`request_normal` for many requests, drawn at once (:mod:`headway.policies._draws`):
    the same values, bit for bit, in a small part of the time."""
    ids = list(request_ids)
    return dict(zip(ids, normals_from_states(_seed_state_rows(seed, ids, salt)).tolist(), strict=True))


def _seed_state_rows(seed: int, ids: list[str], salt: str) -> NDArray[np.uint64]:
    return seed_states(np.frombuffer(_digests(seed, ids, salt), dtype="<u4").reshape(-1, 2))


def _digests(seed: int, ids: list[str], salt: str) -> bytes:
    """:func:`_digest` of each id, joined: the hash of the shared prefix is taken once and copied per
    id (BLAKE2 hashes a message fed in parts as it hashes it whole: the same digests, in about half
    the time of one hash object per id; this runs per request of a workload at ``on_workload``)."""
    prefix = hashlib.blake2b(f"{seed}\x1f{salt}\x1f".encode(), digest_size=8)
    out = []
    for i in ids:
        h = prefix.copy()
        h.update(i.encode())
        out.append(h.digest())
    return b"".join(out)


class RequestNormals:
    """:func:`request_normal` with one ``seed`` and ``salt``, whose draws can be prepared in bulk
    (:meth:`prime`, :func:`request_normals`); a prepared draw is used once, then let go, and a
    request not prepared is drawn one at a time: the same values either way."""

    __slots__ = ("_draws", "salt", "seed")

    def __init__(self, seed: int, salt: str) -> None:
        self.seed = seed
        self.salt = salt
        self._draws: dict[str, float] = {}

    def prime(self, request_ids: Sequence[str]) -> None:
        self._draws = request_normals(self.seed, request_ids, self.salt)

    def __len__(self) -> int:
        """Prepared draws not used yet."""
        return len(self._draws)

    def __call__(self, request_id: str) -> float:
        draw = self._draws.pop(request_id, None)
        return request_normal(self.seed, request_id, self.salt) if draw is None else draw


def _check_tau(tau: float) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (-1.0 <= tau <= 1.0):
        raise ValueError(f"tau must be in [-1, 1], got {tau!r}")
    return float(tau)


def _check_seed(seed: int) -> int:
    """``seed`` as int if it is an integer (not a bool): 1.7 or '3' is an error, not truncated or parsed."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return int(seed)


def _finite(name: str, value: float) -> float:
    """``value`` as float if it is a finite number (not a bool), else a ValueError naming ``name``."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        with contextlib.suppress(OverflowError):  # an int too large for a float stays NaN: refused
            number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


class NoisyOracleScorer:
    """Scores with a target Kendall tau against the true output length (simulation only).

    ``oracle`` is the true-length lookup (a bound policy's ``true_output_tokens``).
    ``log_mean``/``log_std`` describe the log output lengths of the workload: tau is
    exact when they match and log lengths are Gaussian, close otherwise (the test
    suite measures it on real length distributions). Defaults: ``log_mean = 5.0``
    (e^5 = 148 tokens) and ``log_std = 1.0``, typical of chat workloads (Azure conv:
    median 129 tokens; alpaca_eval models: median log-std about 0.9).
    """

    def __init__(
        self,
        tau: float,
        oracle: Callable[[Request], int],
        *,
        seed: int = 0,
        log_mean: float = 5.0,
        log_std: float = 1.0,
    ) -> None:
        self.tau = _check_tau(tau)
        self.seed = _check_seed(seed)
        self.log_std = _finite("log_std", log_std)
        if not self.log_std > 0.0:
            raise ValueError(f"log_std must be a finite number > 0, got {log_std!r}")
        self.log_mean = _finite("log_mean", log_mean)
        self.rho = tau_to_rho(self.tau)
        self._noise_scale = self.log_std * math.sqrt(max(0.0, 1.0 - self.rho * self.rho))
        self._oracle = oracle
        self._normals = RequestNormals(self.seed, "score")

    def prime(self, request_ids: Sequence[str]) -> None:
        """Prepare the noise of these requests in bulk (:class:`RequestNormals`): the same
        draws :meth:`__call__` makes one at a time, in less time (the simulator's ``on_workload``)."""
        if self._noise_scale != 0.0:
            self._normals.prime(request_ids)

    def __call__(self, request: Request) -> float:
        length = self._oracle(request)
        log_len = math.log(1 if length < 1 else length)  # max(length, 1) without the call (once per request)
        eps = 0.0 if self._noise_scale == 0.0 else self._normals(request.request_id)
        return self.log_mean + self.rho * (log_len - self.log_mean) + self._noise_scale * eps

    def __repr__(self) -> str:
        return f"NoisyOracleScorer(tau={self.tau}, seed={self.seed}, log_std={self.log_std})"


def kendall_tau(x: Sequence[float] | NDArray[Any], y: Sequence[float] | NDArray[Any]) -> float:
    """Kendall's tau-b of two samples (ties handled as scipy does)."""
    kendalltau = require("scipy.stats", "sim", "Kendall's tau").kendalltau
    res = kendalltau(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    return float(res.statistic)


def noisy_oracle_scores(
    lengths: Sequence[int] | NDArray[Any], tau: float, *, seed: int = 0, tol: float = 0.005
) -> NDArray[np.float64]:
    """Scores for a whole workload whose sample Kendall tau-b with ``lengths`` is ``tau``.

    Normal scores of the (average) ranks of ``log lengths`` are mixed with fixed
    Gaussian noise, ``s = rho z + sqrt(1 - rho^2) eps``; rho starts at
    ``sin(pi tau / 2)`` and is refined by bisection until the sample tau is within
    ``tol`` (ties in the lengths lower tau-b below the copula's tau, which the
    bisection compensates). Scores are returned in log-length units
    (``mean(log L) + std(log L) * s``) so ``exp(score)`` reads as a length guess.
    """
    ndtri = require("scipy.special", "sim", "the noisy-oracle scorer").ndtri
    rankdata = require("scipy.stats", "sim", "the noisy-oracle scorer").rankdata

    tau = _check_tau(tau)
    lens = np.asarray(lengths, dtype=float)
    if lens.ndim != 1 or len(lens) < 2:
        raise ValueError(f"need at least two lengths, got shape {lens.shape}")
    if np.any(lens <= 0):
        raise ValueError("lengths must be positive")
    log_l = np.log(lens)
    n = len(lens)
    z = ndtri((rankdata(log_l) - 0.5) / n)
    z = (z - z.mean()) / (z.std() or 1.0)
    eps = np.random.default_rng(seed).standard_normal(n)

    def mix(rho: float) -> NDArray[np.float64]:
        return np.asarray(rho * z + math.sqrt(max(0.0, 1.0 - rho * rho)) * eps, dtype=np.float64)

    lo, hi = -1.0, 1.0
    rho = tau_to_rho(tau)
    for _ in range(40):
        got = kendall_tau(mix(rho), lens)
        if abs(got - tau) <= tol:
            break
        if got < tau:
            lo = rho
        else:
            hi = rho
        rho = (lo + hi) / 2.0
    s = mix(rho)
    return np.asarray(log_l.mean() + (log_l.std() or 1.0) * s, dtype=np.float64)
