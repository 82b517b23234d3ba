"""A first-look scorer: hashed word n-grams and a ridge regression, distilled from a trained predictor.

The encoder scores a prompt in milliseconds, and in batches; this scores one in tens of
microseconds, on the caller's thread. It is fitted to mimic a checkpoint's own scores, from
prompts only: no lengths are used. It ranks worse than the encoder (held-out Kendall tau_b
printed by ``headway predictor distill``), so it is meant for decisions made before the
encoder's score is known: the gateway's ``--scorer-order fast`` scores the prompts it
expects to be shortest first.

Files, next to the checkpoint's: ``fast.npy`` (float32 weights, one per hash bucket plus one for
the prompt's log length) and ``fast.json`` (settings, fit statistics, and the SHA-256 of both
``fast.npy`` and the checkpoint weights it mimics: a stale or modified file never loads).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.predict._errors import CheckpointError, DataError
from headway.predict._paths import file_sha256

__all__ = ["FAST_FILE", "FastScorer", "distill_fast", "ensure_fast", "load_fast"]

FAST_FILE = "fast.npy"
_SIDECAR = "fast.json"
_FORMAT = "headway-fast-scorer"
_VERSION = 1
_WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9]")
_MAX_WORDS = 64
_LEAD_WORDS = 8


def _features(prompt: str, buckets: int) -> tuple[list[int], list[float]]:
    """Hashed features of one prompt: its first 64 words and word pairs, its first 8 words again
    (how a prompt starts says much about its answer), L2-normalized; then its log word count
    in the extra last slot (index ``buckets``)."""
    words = _WORD.findall(prompt.lower())
    head = words[:_MAX_WORDS]
    keys = [f"u:{w}" for w in head]
    keys += [f"b:{a} {b}" for a, b in itertools.pairwise(head)]
    keys += [f"s:{w}" for w in head[:_LEAD_WORDS]]
    counts: dict[int, float] = {}
    mask = buckets - 1
    for k in keys:
        h = zlib.crc32(k.encode()) & mask
        counts[h] = counts.get(h, 0.0) + 1.0
    norm = math.sqrt(sum(v * v for v in counts.values())) or 1.0
    idx = list(counts)
    vals = [v / norm for v in counts.values()]
    idx.append(buckets)
    vals.append(math.log1p(len(words)) / 5.0)
    return idx, vals


def _matrix(prompts: Sequence[str], buckets: int) -> Any:
    from scipy import sparse

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, p in enumerate(prompts):
        idx, v = _features(p, buckets)
        rows.extend([i] * len(idx))
        cols.extend(idx)
        vals.extend(v)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(prompts), buckets + 1))


@dataclass(frozen=True, eq=False)
class FastScorer:
    """``score(prompt) = bias + weights . features(prompt)``; see the module docstring."""

    weights: npt.NDArray[np.float32]
    bias: float
    meta: dict[str, Any]

    def __post_init__(self) -> None:
        n = self.weights.shape[0] - 1
        if self.weights.ndim != 1 or n < 2 or n & (n - 1):
            raise ValueError(f"fast scorer weights must be 2**k + 1 floats, got shape {self.weights.shape}")

    @property
    def buckets(self) -> int:
        return int(self.weights.shape[0] - 1)

    def score_one(self, prompt: str) -> float:
        idx, vals = _features(prompt, self.buckets)
        w = self.weights
        return self.bias + math.fsum(float(w[i]) * v for i, v in zip(idx, vals, strict=True))

    def score(self, prompts: Sequence[str]) -> npt.NDArray[np.float64]:
        return np.array([self.score_one(p) for p in prompts], dtype=np.float64)


def _fit(prompts: Sequence[str], targets: npt.NDArray[np.float64], buckets: int, alpha: float) -> tuple[Any, float]:
    """Ridge regression on the hashed features (intercept = the targets' mean, not penalized)."""
    from scipy.sparse.linalg import lsqr

    x = _matrix(prompts, buckets)
    bias = float(np.mean(targets))
    w = lsqr(x, targets - bias, damp=math.sqrt(alpha), atol=1e-8, btol=1e-8, iter_lim=5000)[0]
    return w.astype(np.float32), bias


def _problem(ckpt: Path, weights_sha: str | None) -> str | None:
    from headway.predict.score import _derived_problem

    stale = "stale fast scorer (the checkpoint's weights changed since it was distilled)"
    source = ("weights_sha256", weights_sha)
    return _derived_problem(ckpt / FAST_FILE, ckpt / _SIDECAR, "fast scorer", source, "fast_sha256", stale)


def _checkpoint_hashes(checkpoint: str | Path) -> tuple[Path, dict[str, Any], str | None]:
    from headway.predict.model import read_checkpoint_meta, verify_checkpoint_files

    p = Path(checkpoint).expanduser().resolve()
    meta = read_checkpoint_meta(p)
    return p, meta, verify_checkpoint_files(p, meta).get("model.safetensors")


def load_fast(checkpoint: str | Path) -> FastScorer:
    """The fast scorer distilled from ``checkpoint``; :class:`CheckpointError` if it is missing,
    stale or corrupt (``headway predictor distill --model DIR`` makes one)."""
    p, _, weights_sha = _checkpoint_hashes(checkpoint)
    problem = _problem(p, weights_sha)
    if problem is not None:
        raise CheckpointError(f"{p}: {problem}; run `headway predictor distill --model {p}`")
    info = json.loads((p / _SIDECAR).read_text())
    try:
        weights = np.load(p / FAST_FILE, allow_pickle=False)
        return FastScorer(weights.astype(np.float32, copy=False), float(info["bias"]), info)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{p / FAST_FILE}: unusable fast scorer ({exc})") from exc


def _training_prompts(meta: dict[str, Any], data: str | None, data_dir: str | Path | None) -> tuple[list[str], str]:
    """Distinct prompts to distill on: ``data`` (a :func:`~headway.predict.data.load_dataset` spec), all of
    it; else the train and validation parts of the data the checkpoint was trained on (never its
    held-out test prompts)."""
    from headway.predict.data import load_dataset, split_by_prompt

    training = meta.get("training") or {}
    if data is not None:
        examples = list(load_dataset(data, "tokens", data_dir).examples)
        source = data
    else:
        spec = training.get("data")
        if not isinstance(spec, str):
            raise DataError("the checkpoint records no training data; pass the prompts to distill on (--data)")
        split = split_by_prompt(
            load_dataset(spec, str(training.get("unit", "tokens")), data_dir),
            float(training.get("test_frac", 0.2)),
            float(training.get("val_frac", 0.1)),
            int(training.get("seed", 0)),
        )
        examples = [*split.train.examples, *split.val.examples]
        source = f"{spec} (train + val parts of the checkpoint's split)"
    prompts = list(dict.fromkeys(ex.prompt for ex in examples))
    if len(prompts) < 10:
        raise DataError(f"{source}: {len(prompts)} distinct prompts; distilling needs at least 10")
    return prompts, source


def _tau(scores: Any, lengths: Any) -> float:
    from scipy import stats

    return round(float(stats.kendalltau(np.asarray(scores), np.asarray(lengths), variant="b").statistic), 4)


def _heldout_report(p: Path, meta: dict[str, Any], fast: FastScorer, encoder: Callable[[list[str]], Any],
                    data_dir: str | Path | None) -> dict[str, Any]:  # fmt: skip
    """Kendall tau_b of the fast scorer and of the encoder on the checkpoint's held-out test prompts."""
    from headway.predict.data import load_dataset, split_by_prompt

    training = meta.get("training") or {}
    test = split_by_prompt(
        load_dataset(str(training["data"]), str(training.get("unit", "tokens")), data_dir),
        float(training.get("test_frac", 0.2)),
        float(training.get("val_frac", 0.1)),
        int(training.get("seed", 0)),
    ).test.examples
    prompts = [ex.prompt for ex in test]
    lengths = [ex.length for ex in test]
    return {
        "data": str(training["data"]),
        "n": len(test),
        "fast_kendall_tau_b": _tau(fast.score(prompts), lengths),
        "encoder_kendall_tau_b": _tau(encoder(prompts), lengths),
    }


def distill_fast(
    checkpoint: str | Path,
    *,
    data: str | None = None,
    data_dir: str | Path | None = None,
    alpha: float = 0.3,
    buckets: int = 1 << 18,
    log: Callable[[str], None] | None = print,
) -> FastScorer:
    """Fit the fast scorer of ``checkpoint`` to the checkpoint's own scores (torch backend) on its
    training prompts (or on ``data``), save it next to the weights and return it."""
    from headway.predict.score import Scorer

    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if buckets < 2 or buckets & (buckets - 1):
        raise ValueError(f"buckets must be a power of two >= 2, got {buckets}")
    p, meta, weights_sha = _checkpoint_hashes(checkpoint)
    prompts, source = _training_prompts(meta, data, data_dir)
    t0 = time.perf_counter()
    encoder = Scorer.from_checkpoint(p, "torch")
    targets = np.asarray(encoder.score(prompts), dtype=np.float64)
    weights, bias = _fit(prompts, targets, buckets, alpha)
    fit_s = time.perf_counter() - t0
    info: dict[str, Any] = {
        "format": _FORMAT,
        "version": _VERSION,
        "buckets": buckets,
        "alpha": alpha,
        "bias": bias,
        "distilled_on": {"data": source, "prompts": len(prompts)},
        "fit_kendall_tau_b_vs_encoder": None,
        "seconds": round(fit_s, 2),
    }
    fast = FastScorer(weights, bias, info)
    info["fit_kendall_tau_b_vs_encoder"] = _tau(fast.score(prompts), targets)
    if data is None and "data" in (meta.get("training") or {}):
        info["heldout"] = _heldout_report(p, meta, fast, encoder.score, data_dir)
    tmp = p / f".{FAST_FILE}.tmp.npy"
    np.save(tmp, weights, allow_pickle=False)
    tmp.replace(p / FAST_FILE)
    info["weights_sha256"] = weights_sha
    info["fast_sha256"] = file_sha256(p / FAST_FILE)
    (p / _SIDECAR).write_text(json.dumps(info, indent=2) + "\n")
    if log:
        log(f"distilled {p / FAST_FILE} from {len(prompts)} prompts of {source} in {fit_s:.1f} s")
        held = info.get("heldout")
        if held:
            log(
                f"held-out {held['data']} ({held['n']} prompts): Kendall tau_b {held['fast_kendall_tau_b']:.3f} "
                f"(fast) vs {held['encoder_kendall_tau_b']:.3f} (encoder, torch)"
            )
    return fast


def ensure_fast(checkpoint: str | Path, *, log: Callable[[str], None] | None = print) -> FastScorer:
    """:func:`load_fast`, distilling first (from the checkpoint's training data) when the fast
    scorer is missing, stale or corrupt (it is derived from the checkpoint, as its ONNX export is)."""
    p, _, weights_sha = _checkpoint_hashes(checkpoint)
    problem = _problem(p, weights_sha)
    if problem is not None:
        if log:
            log(f"{p}: {problem}; distilling one")
        distill_fast(p, log=log)
    return load_fast(p)
