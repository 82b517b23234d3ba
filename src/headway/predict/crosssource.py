"""Cross-source evaluation: train a ranking head on each source of the shared data (and on mixes), measure
Kendall tau_b on every other source and model.

Sources (all read from the shared data folder, never copied):

- ``alpaca_eval``: 805 instructions; trained on the consensus length (geometric mean over its 227
  models), evaluated against four 2023-era chat models (:data:`ALPACA_EVAL_MODELS`);
- ``sharegpt``: the first :data:`SHAREGPT_PROMPTS` ShareGPT first turns, ChatGPT's answers; the other
  first turns (:data:`SHAREGPT_TRAIN_PROMPTS`) are used for training only, never evaluated;
- ``codealpaca``: CodeAlpaca-2k, text-davinci-003's answers;
- ``arena_hard_v2``: Arena-Hard v2.0 prompts with o3-mini's and Sky-T1-32B's lengths (Sky-T1's include
  its thinking).

Every prompt is embedded once (frozen encoder on ONNX Runtime, cached per source) and every head is a
closed-form ridge fit (:mod:`headway.predict.head`), so the whole matrix costs one embedding pass. A
source in the training set is evaluated on its held-out prompts (prompt-disjoint split, seed 0, 20 %);
other sources on all their prompts. A recipe is a feature set, a ridge penalty and a weighting of the
sources in a mix: ``equal`` (each source weighs the same) or ``sqrt`` (in proportion to the square root
of its number of training answers, so a large source counts more without drowning the others). A recipe
is judged by its mean tau_b on sources it did not train on, over the leave-one-source-out training sets.

No head trains on a prompt that a cell scores as unseen (:func:`exclude_shared_prompts`): prompts are
matched after normalisation (:func:`~headway.predict.data.normalized_prompt`), and one that a source
shares with another source (alpaca_eval's instructions include ShareGPT first turns), or with a held-out
prompt of its own, is evaluated but never trained on.
"""

from __future__ import annotations

import json
import math
import os
import time
import zipfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from headway._files import write_atomic
from headway.predict._errors import DataError
from headway.predict.data import _resolve_data_dir, load_dataset, normalized_prompt, prompt_key
from headway.predict.head import RidgeHead, feature_matrix, fit_ridge, rank_targets
from headway.predict.pairhead import MLP_HIDDEN, MlpHead, fit_pairwise, fit_pairwise_mlp

__all__ = [
    "ALPACA_EVAL_MODELS",
    "HEADS",
    "SOURCES",
    "TARGETS",
    "WEIGHTINGS",
    "CrossSourceResult",
    "Recipe",
    "Source",
    "cross_source_matrix",
    "embed_sources",
    "exclude_shared_prompts",
    "fit_recipe",
    "left_out_note",
    "load_source",
    "raw_linear",
]

SOURCES: tuple[str, ...] = ("alpaca_eval", "sharegpt", "codealpaca", "arena_hard_v2")
ALPACA_EVAL_MODELS: tuple[str, ...] = ("gpt4", "claude-2", "vicuna-13b-v1.3", "llama-2-70b-chat-hf")
"""2023-era chat models the alpaca_eval columns are measured against."""
SHAREGPT_PROMPTS = 3000
SHAREGPT_TRAIN_PROMPTS: int | None = None
"""ShareGPT first turns read (None: all 17,332); those past :data:`SHAREGPT_PROMPTS` (prompts not among
the evaluated ones) only add training examples when ShareGPT is in a training set."""
WEIGHTINGS: tuple[str, ...] = ("equal", "sqrt")
HEADS: tuple[str, ...] = ("ridge", "ranknet", "mlp")
"""``ridge``: regression on per-model targets (:data:`TARGETS`); ``ranknet``: RankNet's pairwise
logistic loss on pairs of one model's answers whose lengths differ by a relative 0.2
(:func:`~headway.predict.pairhead.fit_pairwise`); ``mlp``: one hidden layer on the same pairs
(:func:`~headway.predict.pairhead.fit_pairwise_mlp`, ``alpha`` is its weight decay)."""
TARGETS: tuple[str, ...] = ("rank", "zlog")
"""What a ridge head regresses, per source x model: ``rank``, rank-normal scores of the lengths
(:func:`~headway.predict.head.rank_targets`); ``zlog``, the z-scored log lengths."""
ARENA_FILES: tuple[str, ...] = ("o3-mini-2025-01-31.jsonl", "sky-t1-32b.jsonl")
TEST_FRAC = 0.2
SPLIT_SEED = 0


@dataclass(frozen=True)
class Source:
    """Distinct prompts of one source; ``train`` and ``evals`` map a model to lengths aligned with
    ``prompts`` (NaN where that model has no answer; in ``train``, also where the prompt is not trained on)."""

    name: str
    prompts: tuple[str, ...]
    train: dict[str, npt.NDArray[np.float64]]
    evals: dict[str, npt.NDArray[np.float64]]
    test: npt.NDArray[np.bool_] = field(repr=False)
    """Held-out prompts (prompt-disjoint split) used when this source is also trained on."""
    extra_prompts: tuple[str, ...] = ()
    """More prompts of the source, for training only (embedded as ``<name>:extra``)."""
    extra_train: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    """Lengths aligned with ``extra_prompts``, per training model (NaN: not trained on)."""


def _table(rows: Sequence[tuple[str, str, float]]) -> tuple[tuple[str, ...], dict[str, npt.NDArray[np.float64]]]:
    prompts: dict[str, int] = {}
    for prompt, _, _ in rows:
        prompts.setdefault(prompt, len(prompts))
    out: dict[str, npt.NDArray[np.float64]] = {}
    for prompt, model, length in rows:
        col = out.setdefault(model, np.full(len(prompts), np.nan))
        col[prompts[prompt]] = length
    return tuple(prompts), out


def _align(prompts: Sequence[str], rows: Sequence[tuple[str, str, float]]) -> dict[str, npt.NDArray[np.float64]]:
    where = {p: i for i, p in enumerate(prompts)}
    out: dict[str, npt.NDArray[np.float64]] = {}
    for prompt, model, length in rows:
        if prompt in where:
            out.setdefault(model, np.full(len(prompts), np.nan))[where[prompt]] = length
    return out


def _rows(spec: str, data_dir: Path) -> list[tuple[str, str, float]]:
    data = load_dataset(spec, "tokens", data_dir)
    return [(e.prompt, e.model or data.name, float(e.length)) for e in data.examples]


def load_source(name: str, data_dir: str | Path | None = None, *, max_extra: int | None = None) -> Source:
    """One of :data:`SOURCES`; DataError naming the source when its files are missing. ``max_extra``
    keeps at most that many training-only prompts (the first; None: all)."""
    if max_extra is not None and max_extra < 0:
        raise DataError(f"max_extra must be >= 0, got {max_extra}")
    root = _resolve_data_dir(data_dir)
    if name == "alpaca_eval":
        prompts, evals = _table(_rows("alpaca_eval:" + ",".join(ALPACA_EVAL_MODELS), root))
        train = _align(prompts, [(p, "consensus", n) for p, _, n in _rows("alpaca_eval:mean", root)])
    elif name == "sharegpt":
        spec = "sharegpt" if SHAREGPT_TRAIN_PROMPTS is None else f"sharegpt:{SHAREGPT_TRAIN_PROMPTS}"
        rows_all = [(p, "chatgpt", n) for p, _, n in _rows(spec, root)]
        prompts, evals = _table(rows_all[:SHAREGPT_PROMPTS])
        seen = set(prompts)
        extra_rows = [r for r in rows_all[SHAREGPT_PROMPTS:] if r[0] not in seen]
        extra_prompts, extra_train = _table(extra_rows)
        if max_extra is not None:
            extra_prompts = extra_prompts[:max_extra]
            extra_train = {m: v[:max_extra] for m, v in extra_train.items()}
        keys = [prompt_key(p) for p in prompts]
        test = np.array([_held_out(k) for k in keys], dtype=bool)
        return Source(name, prompts, evals, evals, test, extra_prompts, extra_train)
    elif name == "codealpaca":
        prompts, evals = _table([(p, "text-davinci-003", n) for p, _, n in _rows("codealpaca:2k", root)])
        train = evals
    elif name == "arena_hard_v2":
        rows: list[tuple[str, str, float]] = []
        for fname in ARENA_FILES:
            path = root / "arena_hard_v2" / fname
            if not path.is_file():
                raise DataError(f"arena_hard_v2: {path} not found")
            with path.open(encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        rec = json.loads(line)
                        rows.append((str(rec["prompt"]), str(rec["model"]), float(rec["output_tokens"])))
        prompts, evals = _table(rows)
        train = evals
    else:
        raise DataError(f"unknown source {name!r}; choose from {', '.join(SOURCES)}")
    keys = [prompt_key(p) for p in prompts]
    test = np.array([_held_out(k) for k in keys], dtype=bool)
    return Source(name, prompts, train, evals, test)


def exclude_shared_prompts(sources: Sequence[Source]) -> tuple[list[Source], dict[str, int]]:
    """``sources`` with no training length on a prompt that some cell scores as unseen, and how many
    training prompts of each source that left out.

    Prompts match when their :func:`~headway.predict.data.normalized_prompt` texts are equal. A prompt of a
    source outside its held-out split is not trained on when it matches a prompt of another source (scored
    in full when that source is not trained on) or a held-out prompt of its own source; a training-only
    prompt is not trained on when it matches a prompt of any source, its own included (those are all
    evaluated). Their training lengths become NaN; prompts, held-out splits and evaluation lengths stay as
    they were, so every prompt is still scored and the embedding caches still apply.
    """
    keys = {src.name: [normalized_prompt(p) for p in src.prompts] for src in sources}
    owners: dict[str, set[str]] = defaultdict(set)
    for src in sources:
        for key in keys[src.name]:
            owners[key].add(src.name)
    out: list[Source] = []
    left_out: dict[str, int] = {}
    for src in sources:
        held = {k for k, t in zip(keys[src.name], src.test.tolist(), strict=True) if t}
        drop = np.array(
            [
                not t and (bool(owners[k] - {src.name}) or k in held)
                for k, t in zip(keys[src.name], src.test.tolist(), strict=True)
            ],
            dtype=bool,
        )
        drop_extra = np.array([normalized_prompt(p) in owners for p in src.extra_prompts], dtype=bool)
        left_out[src.name] = _trained(src.train, drop) + _trained(src.extra_train, drop_extra)
        out.append(
            replace(
                src,
                train={m: np.where(drop, np.nan, v) for m, v in src.train.items()},
                extra_train={m: np.where(drop_extra, np.nan, v) for m, v in src.extra_train.items()},
            )
        )
    return out, left_out


def left_out_note(left_out: Mapping[str, int]) -> str:
    """One line for a result's notes: the training prompts :func:`exclude_shared_prompts` left out."""
    counts = ", ".join(f"{name} {n}" for name, n in left_out.items())
    return (
        "training prompts left out because they match, case-folded and with whitespace and end punctuation "
        f"ignored, a prompt scored as unseen (another source's, or a held-out one of their own): {counts}"
    )


def _trained(lengths: Mapping[str, npt.NDArray[np.float64]], drop: npt.NDArray[np.bool_]) -> int:
    """How many of the prompts in ``drop`` some model has a training length for."""
    if not lengths or not drop.any():
        return 0
    return int((drop & np.any([np.isfinite(v) for v in lengths.values()], axis=0)).sum())


def _held_out(key: str) -> bool:
    from headway.predict.data import _unit_interval

    return _unit_interval(SPLIT_SEED, key) < TEST_FRAC


def embed_sources(
    sources: Sequence[Source],
    embed: Callable[[Sequence[str]], npt.NDArray[np.float32]],
    cache: Path | None,
    say: Callable[[str], None] | None = None,
) -> dict[str, npt.NDArray[np.float32]]:
    """Embeddings per source (and of its training-only prompts, as ``<source>:extra``), computed once and
    kept in ``cache/<source>-<tag>.npz`` when given. ``say`` hears a line before and after each part that
    is not in the cache (embedding one can take minutes), and one for each part read from it."""
    out: dict[str, npt.NDArray[np.float32]] = {}
    for src in sources:
        parts = [(src.name, src.prompts)] + ([(f"{src.name}:extra", src.extra_prompts)] if src.extra_prompts else [])
        for name, prompts in parts:
            digest = prompt_key("\x00".join(prompts))[:16]
            path = cache / f"{name.replace(':', '-')}-{digest}.npz" if cache is not None else None
            cached = _read_cached(path, len(prompts)) if path is not None else None
            if cached is not None:
                out[name] = cached
                if say is not None:
                    say(f"  {name}: {len(prompts)} prompts, embeddings read from the cache")
                continue
            if say is not None:
                say(f"  {name}: embedding {len(prompts)} prompts ...")
            start = time.perf_counter()
            out[name] = embed(prompts)
            if say is not None:
                say(f"  {name}: embedded {len(prompts)} prompts in {time.perf_counter() - start:.1f} s")
            if path is not None:
                _write_cached(path, out[name])
    return out


def _read_cached(path: Path, rows: int) -> npt.NDArray[np.float32] | None:
    """The embeddings cached at ``path``, or None when there are none: no file, or one that is not a whole
    cache of ``rows`` rows (left by a run stopped while writing it: only a cache, so computed again)."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as fh, np.load(fh, allow_pickle=False) as z:  # (closed here when not a zip)
            emb: npt.NDArray[np.float32] = z["emb"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return emb if emb.ndim == 2 and emb.shape[0] == rows else None


def _write_cached(path: Path, emb: npt.NDArray[np.float32]) -> None:
    """Write ``emb`` to ``path`` through a temporary file renamed into place: an interrupted write leaves
    no cache file that a later run would read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, emb=emb)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Recipe:
    """A feature set, an L2 penalty, the weighting of sources in a mix (:data:`WEIGHTINGS`), the head
    (:data:`HEADS`) and, for a ridge head, its targets (:data:`TARGETS`). ``alpha`` is the penalty per
    training prompt for ridge and RankNet heads (ridge's scale), the weight decay on the mean pair loss
    for an MLP."""

    features: str
    alpha: float
    weighting: str = "equal"
    head: str = "ridge"
    target: str = "rank"

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"Recipe.weighting: unknown {self.weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
        if not self.alpha > 0:
            raise ValueError(f"Recipe.alpha must be > 0, got {self.alpha!r}")
        if self.head not in HEADS:
            raise ValueError(f"Recipe.head: unknown {self.head!r}; choose one of {', '.join(HEADS)}")
        if self.target not in TARGETS:
            raise ValueError(f"Recipe.target: unknown {self.target!r}; choose one of {', '.join(TARGETS)}")
        if self.head != "ridge" and self.target != "rank":
            raise ValueError(f"Recipe.target {self.target!r} applies to ridge heads only, not {self.head!r}")

    @property
    def label(self) -> str:
        base = f"{self.features}, alpha {self.alpha:g}"
        if self.head == "ranknet":
            base += ", RankNet pairs"
        if self.head == "mlp":
            base = f"{self.features}, decay {self.alpha:g}, MLP {MLP_HIDDEN} on RankNet pairs"
        if self.target == "zlog":
            base += ", z-scored log length"
        return base if self.weighting == "equal" else f"{base}, sources by sqrt(n)"


def fit_recipe(
    recipe: Recipe,
    sources: Sequence[Source],
    embeddings: dict[str, npt.NDArray[np.float32]],
    *,
    held_out_only: bool = True,
) -> RidgeHead | MlpHead:
    """Fit on the sources' training prompts (the held-out split left out when ``held_out_only``) and their
    training-only ones; each source weighs the same in total (``equal``) or in proportion to the square
    root of its training answers (``sqrt``), and inside a source each training model the same. Ridge
    targets and pairs are formed inside one source x model only."""
    xs, ys, ws = [], [], []
    pair_groups: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]] = []
    for src in sources:
        keep = ~src.test if held_out_only else np.ones(len(src.prompts), dtype=bool)
        x_all = feature_matrix(recipe.features, src.prompts, embeddings[src.name])
        x_extra = (
            feature_matrix(recipe.features, src.extra_prompts, embeddings[f"{src.name}:extra"])
            if src.extra_prompts
            else None
        )
        groups = []
        for model, lengths in src.train.items():
            sel = keep & np.isfinite(lengths)
            x, y = x_all[sel], lengths[sel]
            if x_extra is not None and model in src.extra_train:
                more = np.isfinite(src.extra_train[model])
                x, y = np.vstack([x, x_extra[more]]), np.concatenate([y, src.extra_train[model][more]])
            if len(y) >= 2:
                groups.append((x, y))
        total = sum(len(y) for _, y in groups)
        share = math.sqrt(total) if recipe.weighting == "sqrt" else 1.0
        for x, y in groups:
            xs.append(x)
            ys.append(rank_targets(y) if recipe.target == "rank" else _zlog(y))
            ws.append(np.full(len(y), share / (len(y) * len(groups))))
            pair_groups.append((x, y, share / len(groups)))
    if not xs:
        raise DataError("no training examples")
    if recipe.head == "ranknet":
        return fit_pairwise(pair_groups, kind=recipe.features, alpha=recipe.alpha)
    if recipe.head == "mlp":
        return fit_pairwise_mlp(pair_groups, kind=recipe.features, decay=recipe.alpha)
    return fit_ridge(
        np.vstack(xs), np.concatenate(ys), kind=recipe.features, alpha=recipe.alpha, sample_weight=np.concatenate(ws)
    )


def _zlog(lengths: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Log lengths standardized to mean 0 and spread 1 (all 0 when they are all equal)."""
    logs = np.log(np.maximum(lengths, 1.0))
    spread = float(logs.std())
    out: npt.NDArray[np.float64] = (logs - logs.mean()) / spread if spread > 0 else np.zeros_like(logs)
    return out


def raw_linear(head: RidgeHead) -> tuple[npt.NDArray[np.float64], float]:
    """``(w, b)`` with ``x @ w + b == head.score(x)`` on raw (not standardized) features."""
    w = head.weights / head.scale
    return w, float(head.bias - head.mean @ w)


def _tau(scores: npt.NDArray[np.float64], lengths: npt.NDArray[np.float64]) -> float:
    sel = np.isfinite(lengths)
    if sel.sum() < 2:
        return math.nan
    return float(stats.kendalltau(scores[sel], lengths[sel], variant="b").statistic)


PROMPT_LENGTH = "prompt length (no training)"


@dataclass
class CrossSourceResult:
    """tau_b per (training set, recipe) and eval column ``source:model``; ``in_source`` marks columns
    measured on held-out prompts of a source that was trained on."""

    columns: list[str]
    rows: dict[tuple[str, str], dict[str, float]]
    in_source: dict[tuple[str, str], set[str]]
    n_prompts: dict[str, int]
    baselines: set[str] = field(default_factory=lambda: {PROMPT_LENGTH})
    """Rows that are fixed scorers, not recipes (listed once, under training set ``-``)."""
    command: str = ""
    notes: list[str] = field(default_factory=list)
    title: str = "Length predictors across sources: train on one source (or a mix), rank every other"
    """The first heading of the markdown (distinct per result file)."""

    def source_mean(self, key: tuple[str, str], source: str) -> float:
        """Mean tau_b over ``source``'s models in row ``key`` (NaN when it was trained on)."""
        vals = [
            tau
            for col, tau in self.rows[key].items()
            if col.split(":", 1)[0] == source and col not in self.in_source[key] and math.isfinite(tau)
        ]
        return float(np.mean(vals)) if vals else math.nan

    def held_out_mean(self, key: tuple[str, str]) -> float:
        """Mean over sources not trained on of the source's mean tau_b over its models."""
        vals = [v for v in (self.source_mean(key, s) for s in self.n_prompts) if math.isfinite(v)]
        return float(np.mean(vals)) if vals else math.nan

    def held_out_source(self, recipe: str, source: str) -> float:
        """tau_b on ``source`` of the recipe trained on all other sources (a baseline: on ``source``)."""
        key = (_BASELINE_TRAIN, recipe) if recipe in self.baselines else (f"all but {source}", recipe)
        return self.source_mean(key, source) if key in self.rows else math.nan

    def recipe_score(self, recipe: str) -> float:
        """Mean over sources of :meth:`held_out_source`: each source predicted by a head that never saw it."""
        vals = [self.held_out_source(recipe, s) for s in self.n_prompts]
        vals = [v for v in vals if math.isfinite(v)]
        return float(np.mean(vals)) if vals else math.nan

    def best_recipe(self) -> str:
        recipes = sorted({k[1] for k in self.rows if k[1] not in self.baselines})
        return max(recipes, key=lambda r: (self.recipe_score(r), r))

    def to_markdown(self, chosen: str | None = None) -> str:
        chosen = chosen or self.best_recipe()
        lines = [f"# {self.title}", ""]
        if self.command:
            lines += ["Command:", "", "```", self.command, "```", ""]
        lines += [f"- {n}" for n in self.notes]
        lines += [
            "- cells: Kendall tau_b between scores and true output lengths; *italic* = held-out prompts of a "
            "source in the training set (prompt-disjoint, 20 %); plain = a source not trained on (all prompts)",
            "- prompts per source: " + ", ".join(f"{k} {v}" for k, v in self.n_prompts.items()),
            "",
            "## Recipes: tau_b on each source when trained on the other three (mean over its models)",
            "",
            "| recipe | " + " | ".join(f"{s} (held out)" for s in SOURCES) + " | **mean** |",
            "|---|" + "---:|" * (len(SOURCES) + 1),
        ]
        for recipe in sorted({k[1] for k in self.rows}, key=lambda r: -self.recipe_score(r)):
            cells = [self._fmt(self.held_out_source(recipe, s)) for s in SOURCES]
            mark = " (chosen)" if recipe == chosen else ""
            lines.append(
                f"| {recipe}{mark} | " + " | ".join(cells) + f" | **{self._fmt(self.recipe_score(recipe))}** |"
            )
        lines += ["", f"## Every training set, recipe `{chosen}` (and baselines)", ""]
        lines += ["| trained on | " + " | ".join(self.columns) + " | mean, sources not trained on |"]
        lines += ["|---|" + "---:|" * (len(self.columns) + 1)]
        for key in self.rows:
            if key[1] != chosen and key[1] not in self.baselines:
                continue
            name = key[0] if key[1] == chosen else key[1]
            if key[1] in self.baselines and key[0] != _BASELINE_TRAIN:
                continue
            cells = []
            for col in self.columns:
                v = self._fmt(self.rows[key].get(col, math.nan))
                cells.append(f"*{v}*" if col in self.in_source[key] else v)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {self._fmt(self.held_out_mean(key))} |")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _fmt(v: float) -> str:
        return "n/a" if not math.isfinite(v) else f"{v:.3f}"


_BASELINE_TRAIN = "-"


def training_sets() -> list[tuple[str, tuple[str, ...]]]:
    """Each source alone, all but one, and all."""
    sets: list[tuple[str, tuple[str, ...]]] = [(s, (s,)) for s in SOURCES]
    sets += [(f"all but {s}", tuple(x for x in SOURCES if x != s)) for s in SOURCES]
    sets.append(("all", SOURCES))
    return sets


def cross_source_matrix(
    sources: Sequence[Source],
    embeddings: dict[str, npt.NDArray[np.float32]],
    recipes: Sequence[Recipe],
    *,
    extra_scorers: Mapping[str, Callable[[Sequence[str]], npt.NDArray[np.float64]]] | None = None,
    extra_trained_on: Mapping[str, Sequence[str]] | None = None,
) -> CrossSourceResult:
    """The matrix for ``recipes`` (and the prompt-length baseline, and ``extra_scorers``: fixed scorers
    such as a trained checkpoint, reported as trained on the sources ``extra_trained_on`` names for
    them, alpaca_eval where it names none: those are scored on their held-out split only). Heads never
    train on prompts :func:`exclude_shared_prompts` leaves out."""
    sources, _ = exclude_shared_prompts(sources)
    by_name = {s.name: s for s in sources}
    columns = [f"{s.name}:{m}" for s in sources for m in s.evals]
    result = CrossSourceResult(columns, {}, {}, {s.name: len(s.prompts) for s in sources})

    def evaluate(
        key: tuple[str, str], trained: Sequence[str], score: Callable[[Source], npt.NDArray[np.float64]]
    ) -> None:
        result.rows[key], result.in_source[key] = {}, set()
        for src in sources:
            s = score(src)
            mask = src.test if src.name in trained else np.ones(len(src.prompts), dtype=bool)
            for model, lengths in src.evals.items():
                col = f"{src.name}:{model}"
                result.rows[key][col] = _tau(s[mask], lengths[mask])
                if src.name in trained:
                    result.in_source[key].add(col)

    def prompt_length(src: Source) -> npt.NDArray[np.float64]:
        return feature_matrix("length", src.prompts, None)[:, 0]

    evaluate((_BASELINE_TRAIN, PROMPT_LENGTH), (), prompt_length)
    for name, fn in (extra_scorers or {}).items():
        result.baselines.add(name)
        evaluate((_BASELINE_TRAIN, name), (extra_trained_on or {}).get(name, ("alpaca_eval",)), _fixed_scorer(fn))
    for recipe in recipes:
        for set_name, members in training_sets():
            if any(m not in by_name for m in members):
                continue
            head = fit_recipe(recipe, [by_name[m] for m in members], embeddings)
            evaluate((set_name, recipe.label), members, _head_scorer(head, embeddings))
    return result


def _fixed_scorer(
    fn: Callable[[Sequence[str]], npt.NDArray[np.float64]],
) -> Callable[[Source], npt.NDArray[np.float64]]:
    return lambda src: np.asarray(fn(src.prompts), dtype=np.float64)


def _head_scorer(
    head: RidgeHead | MlpHead, embeddings: Mapping[str, npt.NDArray[np.float32]]
) -> Callable[[Source], npt.NDArray[np.float64]]:
    return lambda src: head.score(feature_matrix(head.features, src.prompts, embeddings[src.name]))


def write_result(result: CrossSourceResult, path: str | Path, chosen: str | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, result.to_markdown(chosen))
    return p


def recipe_grid(
    features: Sequence[str],
    alphas: Sequence[float],
    weightings: Sequence[str] = ("equal",),
    heads: Sequence[str] = ("ridge",),
    targets: Sequence[str] = ("rank",),
    decays: Sequence[float] = (0.01,),
) -> list[Recipe]:
    """Every combination; pair heads once per feature set, penalty and weighting (they have no targets),
    an MLP head with each of ``decays`` instead of ``alphas``."""
    kinds = [(h, t) for h in heads for t in (targets if h == "ridge" else ("rank",))]
    return [
        Recipe(f, a, w, h, t)
        for h, t in kinds
        for w in weightings
        for f in features
        for a in (decays if h == "mlp" else alphas)
    ]


def summary(result: CrossSourceResult) -> dict[str, Any]:
    return {r: result.recipe_score(r) for r in sorted({k[1] for k in result.rows})}
