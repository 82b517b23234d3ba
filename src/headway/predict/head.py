"""A linear ranking head over frozen prompt features: features, ridge fit, rank targets, saving.

The head scores ``features(prompt) @ weights``; higher means a longer answer. It is fitted in closed form
(ridge regression on per-group rank-normal targets, so only the order of lengths inside one model's
answers matters), which takes milliseconds on cached encoder embeddings: cross-source evaluation, the
shipped predictor and online learning all use it. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from headway._files import write_atomic

__all__ = [
    "FEATURE_SETS",
    "PROMPT_CUES",
    "FeatureSet",
    "RidgeHead",
    "cue_features",
    "extra_features",
    "feature_matrix",
    "fit_ridge",
    "rank_targets",
]

FeatureSet = Literal["text", "text+length", "length", "text+cues"]
FEATURE_SETS: tuple[str, ...] = get_args(FeatureSet)
"""``text``: the encoder's pooled embedding; ``length``: the prompt's size (log characters, log words,
log lines); ``text+length``: both; ``text+cues``: the embedding and :func:`cue_features`."""

_F32 = npt.NDArray[np.float32]
_F64 = npt.NDArray[np.float64]


def extra_features(prompts: Sequence[str]) -> _F64:
    """Prompt-size features, ``(n, 3)``: log1p of characters, whitespace words and lines."""
    return np.array(
        [[math.log1p(len(p)), math.log1p(len(p.split())), math.log1p(p.count("\n") + 1)] for p in prompts],
        dtype=np.float64,
    ).reshape(len(prompts), 3)


PROMPT_CUES: dict[str, re.Pattern[str]] = {
    "code": re.compile(
        r"```|\bdef |\bfunction\b|\bclass |#include|\bSELECT\b|\bpython\b|\bjavascript\b|\bjava\b|\bc\+\+"
        r"|\bcode\b|\bscript\b|\bSQL\b|\bregex\b|\bimplement",
        re.I,
    ),
    "list": re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s", re.M),
    "detail": re.compile(r"step[- ]by[- ]step|\bsteps\b|in detail|detailed|comprehensive|thorough", re.I),
    "math": re.compile(
        r"\d\s*[-+*/^=]\s*\d|\bsolve\b|\bequation|\bprove\b|\bcalculate|\bprobability|\bintegral|\\frac|\$", re.I
    ),
    "long_form": re.compile(
        r"\bessay\b|\bstory\b|\barticle\b|\bblog\b|\bpoem\b|\bletter\b|\breport\b|\bplan\b|\bguide\b"
        r"|\boutline\b|\bwords\b",
        re.I,
    ),
    "short": re.compile(
        r"\bone word\b|\bsingle word\b|\byes or no\b|\bbriefly\b|\bshort\b|\bconcise\b|\bin one sentence\b"
        r"|\bonly\b|\bjust\b",
        re.I,
    ),
    "question_end": re.compile(r"\?\s*$"),
    "wh_start": re.compile(r"^\s*(?:what|who|when|where|which|is|are|does|do|can|how many)\b", re.I),
    "classify": re.compile(
        r"\bclassify\b|\bidentify\b|\bcategor|\bsentiment\b|\btrue or false\b|\bwhich of\b|\bchoose\b", re.I
    ),
    "rewrite": re.compile(r"\brewrite\b|\brephrase\b|\bparaphrase\b|\btranslate\b|\bcorrect\b|\bedit\b|\bsummar", re.I),
}
"""Cues in a prompt's text that may say how long its answer is on any source: code, a list, a request
for detail or steps, math, a long-form genre, a request for brevity, a closed question, a
classification, a rewrite of given text. Written once from the task kinds, not tuned on any source."""


def cue_features(prompts: Sequence[str]) -> _F64:
    """``(n, len(PROMPT_CUES) + 1)``: 1.0 where each of :data:`PROMPT_CUES` occurs, then log1p of the
    whitespace words. The last few prompt lists' rows are kept: cross-source evaluation asks for the
    same lists once per training set."""
    out: _F64 = _cue_rows(tuple(prompts)).copy()
    return out


@functools.lru_cache(maxsize=16)
def _cue_rows(prompts: tuple[str, ...]) -> _F64:
    rows = [
        [float(rx.search(p) is not None) for rx in PROMPT_CUES.values()] + [math.log1p(len(p.split()))] for p in prompts
    ]
    return np.array(rows, dtype=np.float64).reshape(len(prompts), len(PROMPT_CUES) + 1)


def feature_matrix(kind: str, prompts: Sequence[str], embeddings: _F32 | _F64 | None) -> _F64:
    """Features of ``kind`` (one of :data:`FEATURE_SETS`) for ``prompts`` whose pooled embeddings are
    ``embeddings`` (rows aligned; unused, may be None, for ``length``)."""
    if kind not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {kind!r}; choose one of {', '.join(FEATURE_SETS)}")
    if kind == "length":
        return extra_features(prompts)
    if embeddings is None or len(embeddings) != len(prompts):
        raise ValueError(f"feature set {kind!r} needs one embedding row per prompt")
    emb = np.asarray(embeddings, dtype=np.float64)
    if kind == "text+cues":
        return np.hstack([emb, cue_features(prompts)])
    return emb if kind == "text" else np.hstack([emb, extra_features(prompts)])


_NORMAL = NormalDist()


def rank_targets(lengths: npt.ArrayLike, groups: Sequence[Hashable] | None = None) -> _F64:
    """Rank-normal targets: inside each group (one model's answers), lengths' average ranks mapped to
    standard normal quantiles, so every group has the same scale and ties stay tied."""
    y = np.asarray(lengths, dtype=np.float64)
    out = np.zeros_like(y)
    tags = np.zeros(len(y), dtype=np.int64) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    for g in np.unique(tags):
        sel = np.flatnonzero(tags == g)
        ranks = _average_ranks(y[sel])
        # the standard library's normal quantile: online learning runs with the score extra, without scipy
        out[sel] = [_NORMAL.inv_cdf(q) for q in (ranks - 0.5) / len(sel)]
    return out


def _average_ranks(values: _F64) -> _F64:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1, dtype=np.float64)
    uniq, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(uniq))
    counts = np.bincount(inverse, minlength=len(uniq))
    out: _F64 = sums[inverse] / counts[inverse]
    return out


@dataclass(frozen=True)
class RidgeHead:
    """``score(X) = ((X - mean) / scale) @ weights + bias``; ``features`` names the feature set."""

    features: str
    mean: _F64
    scale: _F64
    weights: _F64
    bias: float
    alpha: float
    n_train: int

    def __post_init__(self) -> None:
        if self.features not in FEATURE_SETS:
            raise ValueError(f"RidgeHead.features: unknown feature set {self.features!r}")
        d = len(self.weights)
        if self.mean.shape != (d,) or self.scale.shape != (d,):
            raise ValueError(f"RidgeHead: mean {self.mean.shape}, scale {self.scale.shape}, weights ({d},) differ")
        if not np.all(np.isfinite(self.weights)) or not math.isfinite(self.bias):
            raise ValueError("RidgeHead: weights and bias must be finite")

    @property
    def dim(self) -> int:
        return len(self.weights)

    def score(self, features: _F64 | _F32) -> _F64:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"RidgeHead.score: expected (n, {self.dim}) features, got {x.shape}")
        out: _F64 = ((x - self.mean) / self.scale) @ self.weights + self.bias
        return out

    def to_bytes(self, meta: dict[str, Any] | None = None) -> bytes:
        """The head as an ``.npz`` archive (float32 arrays and a JSON header)."""
        header = {"features": self.features, "bias": self.bias, "alpha": self.alpha, "n_train": self.n_train}
        header["meta"] = meta or {}
        buf = io.BytesIO()
        np.savez_compressed(
            buf,
            mean=self.mean.astype(np.float32),
            scale=self.scale.astype(np.float32),
            weights=self.weights.astype(np.float32),
            header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8),
        )
        return buf.getvalue()

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(p, self.to_bytes(meta))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "head") -> tuple[RidgeHead, dict[str, Any]]:
        """``(head, meta)`` from :meth:`to_bytes` output; ValueError naming ``where`` when unreadable."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                header = json.loads(bytes(z["header"]).decode())
                head = cls(
                    features=str(header["features"]),
                    mean=z["mean"].astype(np.float64),
                    scale=z["scale"].astype(np.float64),
                    weights=z["weights"].astype(np.float64),
                    bias=float(header["bias"]),
                    alpha=float(header["alpha"]),
                    n_train=int(header["n_train"]),
                )
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: not a ranking head ({exc})") from None
        return head, dict(header.get("meta") or {})

    @classmethod
    def load(cls, path: str | Path) -> tuple[RidgeHead, dict[str, Any]]:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise ValueError(f"{p}: cannot read the ranking head ({exc.strerror})") from None
        return cls.from_bytes(data, str(p))


def fit_ridge(
    features: _F64,
    targets: _F64,
    *,
    kind: str,
    alpha: float = 10.0,
    sample_weight: _F64 | None = None,
    column_alpha: npt.ArrayLike | None = None,
    isotropic: bool = False,
) -> RidgeHead:
    """Weighted ridge regression of ``targets`` on standardized ``features`` (closed form, float64).

    Weights are rescaled to sum to the number of samples before ``alpha`` (the L2 penalty) applies, so
    its strength does not depend on how they are normalized. ``column_alpha`` (one positive penalty per
    feature) replaces ``alpha`` column by column: a few strong features (an offline score, the prompt's
    size) can then be shrunk less than hundreds of embedding dimensions. ``isotropic`` divides every
    centred feature by one overall spread instead of its own, so one penalty holds in every direction
    (per-feature scaling gives near-constant features huge raw weights: harmless for a frozen head,
    but a fine-tuning run started from it blows up).
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or len(y) < 2:
        raise ValueError(f"fit_ridge: need (n, d) features and n >= 2 targets, got {x.shape} and {y.shape}")
    if not alpha > 0:
        raise ValueError(f"fit_ridge: alpha must be > 0, got {alpha}")
    penalty = np.full(x.shape[1], float(alpha)) if column_alpha is None else np.asarray(column_alpha, dtype=np.float64)
    if penalty.shape != (x.shape[1],) or not np.all(penalty > 0):
        raise ValueError(f"fit_ridge: column_alpha must hold {x.shape[1]} positive penalties, got {penalty.shape}")
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if w.shape != y.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError("fit_ridge: sample_weight must be non-negative, one per target, not all zero")
    w = w * (len(y) / w.sum())
    mean = (w @ x) / w.sum()
    if isotropic:
        spread = float(np.sqrt((w @ ((x - mean) ** 2).sum(axis=1)) / (w.sum() * x.shape[1])))
        scale = np.full(x.shape[1], spread if spread >= 1e-12 else 1.0)
    else:
        scale = np.sqrt((w @ (x - mean) ** 2) / w.sum())
        scale[scale < 1e-12] = 1.0
    z = (x - mean) / scale
    y_mean = float(w @ y / w.sum())
    gram = (z * w[:, None]).T @ z + np.diag(penalty)
    coef = np.linalg.solve(gram, (z * w[:, None]).T @ (y - y_mean))
    return RidgeHead(kind, mean, scale, coef, y_mean, float(alpha), len(y))
