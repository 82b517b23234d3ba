"""How well scores rank output lengths: Kendall tau_b, Spearman, pair accuracy; the cross-model matrix.

The metrics functions need only numpy and scipy. Everything that runs a model imports torch lazily.

Honest ceiling: the same prompt answered twice by the same model (Vicuna-7B, ``sequence_scheduling``)
has a length rank correlation of only about 0.8 (Spearman), see :func:`resampling_ceiling`; no predictor
of a sampled length can be perfect.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from headway.predict._errors import DataError
from headway.predict.data import DEFAULT_DELTA, ExampleSet, _check_delta, _resolve_data_dir, load_dataset

if TYPE_CHECKING:
    from headway.predict.score import Scorer
    from headway.predict.shipped import ShippedPredictor
    from headway.predict.train import TrainConfig

__all__ = [
    "MatrixResult",
    "Metrics",
    "cross_model_matrix",
    "evaluate_scorer",
    "format_metrics",
    "pair_accuracy",
    "rank_metrics",
    "resampling_ceiling",
]

_EXACT_PAIR_LIMIT = 5_000
_SAMPLED_PAIRS = 1_000_000


@dataclass(frozen=True)
class Metrics:
    """Rank agreement of predicted scores with true lengths on ``n`` examples."""

    kendall_tau_b: float
    spearman: float
    pair_accuracy: float
    n: int
    n_pairs: int
    """Pairs that pass the delta filter (``|a - b| / max(a, b) >= delta``) and were scored."""
    delta: float
    unit: str
    pairs_sampled: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pair_accuracy(
    scores: npt.ArrayLike,
    lengths: npt.ArrayLike,
    delta: float = DEFAULT_DELTA,
    *,
    seed: int = 0,
) -> tuple[float, int, bool]:
    """Share of pairs passing the delta filter whose longer member has the higher score (score ties
    count one half). Exact over all pairs up to 5,000 examples, else over 1,000,000 sampled pairs.

    Returns ``(accuracy, pairs counted, sampled?)``; accuracy is NaN when no pair passes.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(lengths, dtype=np.float64)
    n = s.size
    if n != y.size:
        raise ValueError(f"pair_accuracy: {n} scores for {y.size} lengths")
    correct = 0.0
    total = 0
    if n <= _EXACT_PAIR_LIMIT:
        for start in range(0, n, 1024):
            a = np.arange(start, min(start + 1024, n))[:, None]
            b = np.arange(n)[None, :]
            upper = b > a
            ya, yb = y[a], y[b]
            keep = upper & (ya != yb) & (np.abs(ya - yb) / np.maximum(ya, yb) >= delta)
            diff = np.sign(s[a] - s[b]) * np.sign(ya - yb)
            correct += float(np.sum((diff > 0) & keep)) + 0.5 * float(np.sum((diff == 0) & keep))
            total += int(keep.sum())
        sampled = False
    else:
        rng = np.random.default_rng(seed)
        a = rng.integers(0, n, _SAMPLED_PAIRS)
        b = rng.integers(0, n, _SAMPLED_PAIRS)
        ya, yb = y[a], y[b]
        keep = (a != b) & (ya != yb) & (np.abs(ya - yb) / np.maximum(ya, yb) >= delta)
        diff = np.sign(s[a] - s[b]) * np.sign(ya - yb)
        correct = float(np.sum((diff > 0) & keep)) + 0.5 * float(np.sum((diff == 0) & keep))
        total = int(keep.sum())
        sampled = True
    return (correct / total if total else math.nan), total, sampled


def rank_metrics(
    scores: npt.ArrayLike,
    lengths: npt.ArrayLike,
    delta: float = DEFAULT_DELTA,
    unit: str = "tokens",
) -> Metrics:
    """Kendall tau_b and Spearman (scipy) of scores against lengths, and delta-filtered pair accuracy."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(lengths, dtype=np.float64)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"rank_metrics: scores {s.shape} and lengths {y.shape} must be equal 1-d")
    if s.size < 2 or np.all(s == s[0]) or np.all(y == y[0]):
        tau = rho = math.nan
    else:
        tau = float(stats.kendalltau(s, y, variant="b").statistic)
        rho = float(stats.spearmanr(s, y).statistic)
    acc, n_pairs, sampled = pair_accuracy(s, y, delta)
    return Metrics(tau, rho, acc, int(s.size), n_pairs, delta, unit, sampled)


def format_metrics(m: Metrics, title: str = "") -> str:
    head = f"{title}\n" if title else ""
    sampled = " (sampled pairs)" if m.pairs_sampled else ""
    return (
        f"{head}  examples            {m.n}\n"
        f"  length unit         {m.unit}\n"
        f"  Kendall tau_b       {m.kendall_tau_b:.4f}\n"
        f"  Spearman            {m.spearman:.4f}\n"
        f"  pair accuracy       {m.pair_accuracy:.4f}  on {m.n_pairs} pairs with "
        f"|a-b|/max(a,b) >= {m.delta}{sampled}"
    )


_PROGRESS_CHUNK = 256
"""Prompts scored per progress-bar update in :func:`evaluate_scorer`."""


def evaluate_scorer(
    scorer: Scorer | ShippedPredictor, data: ExampleSet, delta: float = DEFAULT_DELTA, *, progress: bool = False
) -> dict[str | None, Metrics]:
    """Score ``data`` and compute metrics overall (key ``None``) and per model when it has several.
    ``scorer`` is a :class:`~headway.predict.Scorer` or a :class:`~headway.predict.ShippedPredictor`
    (what :func:`~headway.predict.default_scorer` returns).
    ``progress`` shows a progress bar on stderr while scoring (when it is a terminal); ``delta`` must be in
    [0, 1)."""
    _check_delta(delta)
    if len(data) == 0:
        raise DataError(f"{data.name}: nothing to evaluate")
    prompts = data.prompts()
    if progress:
        from tqdm.auto import tqdm

        parts = []
        with tqdm(  # disable=None: no bar when stderr is not a terminal
            total=len(prompts), desc="scoring", unit="prompt", leave=False, dynamic_ncols=True, disable=None
        ) as bar:
            for k in range(0, len(prompts), _PROGRESS_CHUNK):
                parts.append(scorer.score(prompts[k : k + _PROGRESS_CHUNK]))
                bar.update(len(parts[-1]))
        scores = np.concatenate(parts)
    else:
        scores = scorer.score(prompts)
    lengths = data.lengths()
    out: dict[str | None, Metrics] = {None: rank_metrics(scores, lengths, delta, data.unit_label)}
    models = data.models()
    if len(models) > 1:
        tags = np.array([e.model or "" for e in data.examples])
        for model in models:
            sel = tags == (model or "")
            out[model] = rank_metrics(scores[sel], lengths[sel], delta, data.unit_label)
    return out


# ---------------------------------------------------------------------------------------------------------
# The ceiling


def resampling_ceiling(data_dir: str | Path | None = None) -> dict[str, float]:
    """Rank agreement of two samples of the same prompts from the same model (Vicuna-7B at temperatures
    0.7 and 0.5, 10,000 prompts, ``sequence_scheduling``): an upper bound for any length predictor."""
    path = _resolve_data_dir(data_dir) / "sequence_scheduling" / "alpaca-val-10k-length.json"
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = json.loads(path.read_text())
    a = np.array([r["L_t0.7"] for r in rows], dtype=np.float64)
    b = np.array([r["L_t0.5"] for r in rows], dtype=np.float64)
    m = rank_metrics(a, b)
    return {
        "spearman": m.spearman,
        "kendall_tau_b": m.kendall_tau_b,
        "pair_accuracy": m.pair_accuracy,
        "n": float(m.n),
    }


# ---------------------------------------------------------------------------------------------------------
# Cross-model matrix


DEFAULT_EVAL_MODELS: tuple[str, ...] = (
    "gpt4",
    "gpt-4o-2024-05-13",
    "claude-3-opus-20240229",
    "claude-2.1",
    "Meta-Llama-3-70B-Instruct",
    "Meta-Llama-3-8B-Instruct",
    "Mistral-7B-Instruct-v0.2",
    "Mixtral-8x7B-Instruct-v0.1",
    "Qwen2-72B-Instruct",
    "Qwen1.5-7B-Chat",
    "gemma-7b-it",
    "llama-2-70b-chat-hf",
)


@dataclass
class MatrixResult:
    """Kendall tau_b (and Spearman, pair accuracy) of predictors trained on one model's lengths,
    evaluated on held-out prompts against other models' lengths."""

    train_model: str
    eval_models: list[str]
    losses: list[str]
    mode: str
    unit: str
    delta: float
    n_test_prompts: int
    cells: dict[tuple[str, str], Metrics]
    """``(loss, eval_model) -> Metrics``; loss ``"oracle"`` scores by the training model's true length."""
    train_seconds: dict[str, float]
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    ceiling: dict[str, float] = field(default_factory=dict)
    command: str = ""

    def to_markdown(self) -> str:
        rows = [*self.losses, "oracle"]
        lines = [
            f"# Length predictor: trained on `{self.train_model}` (alpaca_eval), evaluated across models",
            "",
        ]
        if self.command:
            lines += ["Command:", "", "```", self.command, "```", ""]
        lines += [
            f"- length unit: {self.unit}; held-out prompts (prompt-disjoint split): {self.n_test_prompts}",
            f"- encoder mode: {self.mode}; pair accuracy on pairs with |a-b|/max(a,b) >= {self.delta}",
            "- training time, wall s (CPU s of the training process): "
            + ", ".join(f"{k} {v:.0f} ({self.cpu_seconds.get(k, math.nan):.0f})" for k, v in self.train_seconds.items())
            + "; wall time depends on what else runs on the machine",
            "- `oracle` ranks by the training model's own true lengths (what a perfect predictor of "
            f"`{self.train_model}` would score on the other models)",
        ]
        if self.ceiling:
            lines.append(
                "- resampling ceiling (same prompts, same model, two samples; sequence_scheduling): "
                f"Spearman {self.ceiling['spearman']:.3f}, Kendall tau_b {self.ceiling['kendall_tau_b']:.3f}"
            )
        for metric, label in (
            ("kendall_tau_b", "Kendall tau_b"),
            ("spearman", "Spearman"),
            ("pair_accuracy", "pair accuracy"),
        ):
            lines += ["", f"## {label}", ""]
            lines.append("| eval model | " + " | ".join(rows) + " |")
            lines.append("|---|" + "---:|" * len(rows))
            for model in self.eval_models:
                mark = " (train)" if model == self.train_model else ""
                vals = [getattr(self.cells[(r, model)], metric) for r in rows]
                lines.append(f"| {model}{mark} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
            cross = [m for m in self.eval_models if m != self.train_model]
            if cross:
                means = [float(np.mean([getattr(self.cells[(r, m)], metric) for m in cross])) for r in rows]
                lines.append("| **mean, other models** | " + " | ".join(f"{v:.3f}" for v in means) + " |")
        return "\n".join(lines) + "\n"


def _check_matrix_checkpoint(path: Path, meta: dict[str, Any], loss: str, data_name: str, cfg: TrainConfig) -> None:
    tr = meta.get("training", {})
    wanted = {
        "loss": loss,
        "seed": cfg.seed,
        "test_frac": cfg.test_frac,
        "val_frac": cfg.val_frac,
        "unit": cfg.unit,
    }
    wrong = {k: (tr.get(k), v) for k, v in wanted.items() if tr.get(k) != v}
    if meta.get("data", {}).get("name") != data_name:
        wrong["data"] = (meta.get("data", {}).get("name"), data_name)
    if wrong:
        detail = ", ".join(f"{k}: has {a!r}, matrix needs {b!r}" for k, (a, b) in wrong.items())
        raise DataError(f"{path}: not trained like this matrix ({detail})")


def cross_model_matrix(
    train_model: str = "gpt4",
    eval_models: Sequence[str] = DEFAULT_EVAL_MODELS,
    losses: Sequence[str] = ("pairwise", "pointwise", "listwise"),
    base_config: TrainConfig | None = None,
    data_dir: str | Path | None = None,
    out_root: str | Path | None = None,
    delta: float = DEFAULT_DELTA,
    log: Callable[[str], None] = print,
    checkpoints: dict[str, str | Path] | None = None,
) -> MatrixResult:
    """Train one predictor per loss on ``train_model``'s lengths (same split, same backbone, same
    budget), then score the held-out prompts once and compare against every eval model's lengths.

    ``checkpoints`` maps a loss to an already trained checkpoint to use instead of training; it must have
    been trained on ``alpaca_eval:<train_model>`` with the same split (seed, fractions) and unit, and the
    loss must be one of ``losses`` (ValueError otherwise). The checkpoints trained are kept under
    ``out_root``; without one, in a temporary directory deleted at the end.
    """
    import contextlib
    import dataclasses
    import tempfile

    from headway.predict.score import Scorer
    from headway.predict.train import TrainConfig, train_predictor

    base = base_config or TrainConfig()
    unused = sorted(set(checkpoints or {}) - set(losses))
    if unused:
        raise ValueError(f"checkpoints given for {', '.join(unused)}, which is not among the losses {list(losses)}")
    # "mean" (or "mean:A,B"): the per-prompt consensus of several models (load_alpaca_eval_consensus)
    train_data = load_dataset(f"alpaca_eval:{train_model}", base.unit, data_dir)
    split = base.split(train_data)
    test_prompts = split.test.prompts()
    evals = {m: base.split(load_dataset(f"alpaca_eval:{m}", base.unit, data_dir)) for m in eval_models}
    kept = contextlib.nullcontext(str(out_root)) if out_root else None
    with kept or tempfile.TemporaryDirectory(prefix="headway-matrix-") as where:
        root = Path(where)
        cells: dict[tuple[str, str], Metrics] = {}
        seconds: dict[str, float] = {}
        scores_by_loss: dict[str, dict[str, float]] = {}
        modes: set[str] = set()
        cpu: dict[str, float] = {}
        epochs: dict[str, Any] = {}
        for loss in losses:
            cfg = dataclasses.replace(base, loss=loss, data=f"alpaca_eval:{train_model}")
            given = (checkpoints or {}).get(loss)
            if given is not None:
                path = Path(given)
                scorer = Scorer.from_checkpoint(path, threads=cfg.threads)
                _check_matrix_checkpoint(path, scorer.meta, loss, train_data.name, cfg)
                seconds[loss] = float(scorer.meta.get("result", {}).get("train_seconds", math.nan))
                cpu[loss] = float(scorer.meta.get("result", {}).get("cpu_seconds", math.nan))
                log(f"using {path} for {loss} (trained in {seconds[loss]:.0f} s)")
            else:
                log(f"training {loss} ({cfg.mode}) on alpaca_eval:{train_model} ...")
                result = train_predictor(cfg, out_dir=root / f"{train_model}-{loss}-{cfg.mode}", data=train_data)
                seconds[loss] = result.train_seconds
                cpu[loss] = result.cpu_seconds
                scorer = Scorer.from_checkpoint(result.path, threads=cfg.threads)
            modes.add("full" if scorer.meta.get("encoder", {}).get("fine_tuned") else "frozen")
            epochs[loss] = scorer.meta.get("training", {}).get("epochs")
            scores = scorer.score(test_prompts)
            scores_by_loss[loss] = dict(zip(test_prompts, scores.tolist(), strict=True))
    oracle = {e.prompt: float(e.length) for e in split.test}
    scores_by_loss["oracle"] = oracle
    unit = train_data.unit_label
    for model, msplit in evals.items():
        # the eval model's held-out examples whose prompt the training model also answered
        test = [e for e in msplit.test if e.prompt in oracle]
        lengths = np.array([e.length for e in test], dtype=np.float64)
        for loss, table in scores_by_loss.items():
            s = np.array([table[e.prompt] for e in test], dtype=np.float64)
            cells[(loss, model)] = rank_metrics(s, lengths, delta, unit)
    return MatrixResult(
        train_model=train_model,
        eval_models=list(eval_models),
        losses=list(losses),
        mode=" + ".join(sorted(modes)) + " (epochs: " + ", ".join(f"{k} {v}" for k, v in epochs.items()) + ")",
        unit=unit,
        delta=delta,
        n_test_prompts=len({e.prompt for e in split.test}),
        cells=cells,
        train_seconds=seconds,
        cpu_seconds=cpu,
        ceiling=resampling_ceiling(data_dir),
    )
