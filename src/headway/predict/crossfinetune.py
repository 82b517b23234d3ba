"""Cross-source generalization by fine-tuning the encoder on a mix of sources.

For each held-out source (leave one source out), the top ``top_layers`` transformer layers of the encoder
and a linear head are fine-tuned end to end with PARS's margin ranking loss on a balanced mix of the other
sources, then Kendall tau_b is measured on the held-out source (all its prompts, every model) and on the
held-out split of the training sources (:mod:`headway.predict.crosssource` defines the sources, the
split and the table).

The encoder is cut in two (:func:`split_encoder`): the lower layers are never trained, so their outputs
are computed once per prompt, forward only, and cached (:func:`lower_states`, in memory and on disk);
each training step then runs only the top layers on the cached states. Scores from the cached states are
those of the full forward (the lower layers are deterministic in eval mode, and padded positions are
masked out of attention and pooling either way).

Pairs follow PARS's rule (:func:`group_pairs`): two answers of one source x model whose lengths differ by
a relative ``delta`` (0.2) or more. Each step draws ``batch_size`` prompts shared among the training
sources (equally, or in proportion to the square root of their training answers), from one model of
each source, and uses every valid pair inside each source's draw. Runs are seeded (numpy, torch) and
deterministic on CPU for a given thread count. ``device="cuda"`` trains on a GPU instead (the same
recipe; scores differ from the CPU's in the last bits).
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from headway.predict._chunks import _length_sorted_batches
from headway.predict._embed import run_length_sorted
from headway.predict._errors import DataError
from headway.predict._finetune_recipe import HEAD_INITS, WEIGHTINGS, FinetuneRecipe
from headway.predict._paths import encoder_path
from headway.predict.crosssource import SOURCES, CrossSourceResult, Source, _tau, exclude_shared_prompts
from headway.predict.head import fit_ridge, rank_targets
from headway.predict.losses import margin_ranking_loss
from headway.predict.model import LengthPredictor, load_encoder, mean_pool, pad_batch, position_limit, tokenize

__all__ = [
    "HEAD_INITS",
    "WEIGHTINGS",
    "FinetuneRecipe",
    "FoldResult",
    "MixModel",
    "finetune_all",
    "finetune_fold",
    "group_pairs",
    "lower_states",
    "merged_predictor",
    "split_encoder",
    "training_device",
]

# ---------------------------------------------------------------------------------------------------------
# The encoder cut in two


class _Passthrough(nn.Module):
    """Stands in for the encoder's embeddings: the top half's input is already a hidden state."""

    def forward(self, *args: Any, inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if inputs_embeds is None:
            raise ValueError("the top layers take inputs_embeds (cached lower-layer states)")
        return inputs_embeds


def split_encoder(encoder: nn.Module, top_layers: int) -> tuple[nn.Module, nn.Module]:
    """``(lower, top)``: a copy of ``encoder`` that keeps its embeddings and all but the top
    ``top_layers`` layers, and ``encoder`` itself reduced to those top layers (its embeddings replaced
    by a pass-through, its pooler dropped: scores mean-pool the last layer). ``top(inputs_embeds=
    lower(...).last_hidden_state, attention_mask=...)`` is the full forward."""
    layers = cast(Any, encoder).encoder.layer
    if not 1 <= top_layers <= len(layers):
        raise ValueError(f"top_layers must be 1..{len(layers)} (the encoder's layer count), got {top_layers}")
    cut = len(layers) - top_layers
    lower = copy.deepcopy(encoder)
    cast(Any, lower).encoder.layer = nn.ModuleList(list(cast(Any, lower).encoder.layer)[:cut])
    top = cast(Any, encoder)
    top.encoder.layer = nn.ModuleList(list(layers)[cut:])
    top.embeddings = _Passthrough()
    if getattr(top, "pooler", None) is not None:
        top.pooler = None
    if getattr(lower, "pooler", None) is not None:
        cast(Any, lower).pooler = None
    lower.eval()
    for p in lower.parameters():
        p.requires_grad_(False)
    return lower, encoder


def training_device(device: str) -> torch.device:
    """``device`` as torch names it (``cpu``, ``cuda``, ``cuda:1``); ValueError naming it when torch cannot
    parse it or has no CUDA device here."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch sees no CUDA device here")
    return dev


class MixModel(nn.Module):
    """The top layers and a linear head over their mean-pooled last layer."""

    def __init__(self, top: nn.Module) -> None:
        super().__init__()
        self.top = top
        self.head = nn.Linear(int(cast(Any, top).config.hidden_size), 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def pooled(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The mean-pooled last layer that the head scores."""
        return mean_pool(self.top(inputs_embeds=states, attention_mask=mask).last_hidden_state, mask)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.head(self.pooled(states, mask))).squeeze(-1)


def _pad_states(states: Sequence[npt.NDArray[np.float32]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(s.shape[0] for s in states)
    out = np.zeros((len(states), width, states[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(states), width), dtype=np.int64)
    for row, s in enumerate(states):
        out[row, : s.shape[0]] = s
        mask[row, : s.shape[0]] = 1
    return torch.from_numpy(out), torch.from_numpy(mask)


def score_states(
    model: MixModel,
    states: Sequence[npt.NDArray[np.float32]],
    micro: int = 64,
    *,
    grad: bool = False,
    pooled: bool = False,
) -> torch.Tensor:
    """Scores of cached lower-layer states (or, with ``pooled``, the features the head scores), in order
    (length-sorted micro-batches, padded per batch)."""

    device = model.head.weight.device

    def run(chunk: list[int]) -> torch.Tensor:
        x, mask = _pad_states([states[c] for c in chunk])
        x, mask = x.to(device), mask.to(device)
        return model.pooled(x, mask) if pooled else model(x, mask)

    with torch.set_grad_enabled(grad):
        return run_length_sorted([s.shape[0] for s in states], micro, run)


# ---------------------------------------------------------------------------------------------------------
# Lower-layer cache


def lower_states(
    lower: nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_length: int,
    *,
    cache: Path | None = None,
    tag: str = "",
    batch_size: int = 32,
    truncation: str = "head",
) -> list[npt.NDArray[np.float32]]:
    """The lower layers' last hidden state of each prompt, unpadded (``(tokens, hidden)`` float32),
    computed forward only in length-sorted batches; kept in ``cache/<digest>.npz`` when ``cache`` is
    given (``tag`` names the encoder and cut: a different one never reads these); prompts cut to
    ``max_length`` tokens as ``truncation`` says (:data:`~headway.predict._finetune_recipe.TRUNCATIONS`)."""
    cut = f"{max_length}" if truncation == "head" else f"{max_length}:{truncation}"
    digest = hashlib.sha256(f"{tag}|{cut}|".encode() + "\x00".join(prompts).encode()).hexdigest()[:20]
    path = cache / f"{digest}.npz" if cache is not None else None
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as z:
            flat, offsets = z["states"], z["offsets"]
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(prompts))]
    ids = tokenize(tokenizer, prompts, max_length, truncation)
    pad_id = int(tokenizer.pad_token_id or 0)
    out: list[npt.NDArray[np.float32]] = [np.zeros((0, 0), dtype=np.float32)] * len(prompts)
    lower.eval()
    device = next(lower.parameters()).device
    with torch.inference_mode():
        for chunk in _length_sorted_batches([len(x) for x in ids], batch_size):
            input_ids, mask = pad_batch([ids[c] for c in chunk], pad_id)
            hidden = lower(
                input_ids=torch.from_numpy(input_ids).to(device), attention_mask=torch.from_numpy(mask).to(device)
            )
            h = hidden.last_hidden_state.float().cpu().numpy()
            for row, c in enumerate(chunk):
                out[c] = np.ascontiguousarray(h[row, : len(ids[c])])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.concatenate([[0], np.cumsum([s.shape[0] for s in out])]).astype(np.int64)
        tmp = path.with_name(f".{path.stem}.tmp.npz")
        np.savez(tmp, states=np.concatenate(out), offsets=offsets)
        tmp.replace(path)
    return out


# ---------------------------------------------------------------------------------------------------------
# Pairs and the balanced mix


def group_pairs(lengths: npt.NDArray[np.float64], groups: Sequence[Any], delta: float) -> npt.NDArray[np.int64]:
    """Every pair ``(a, b, a_longer)`` with ``a < b`` of one group (a source x model) whose lengths
    differ by a relative ``delta`` or more: ``|la - lb| / max(la, lb) >= delta``."""
    lens = np.asarray(lengths, dtype=np.float64)
    if len(groups) != lens.size:
        raise DataError(f"group_pairs: {len(groups)} groups for {lens.size} lengths")
    a, b = np.triu_indices(lens.size, k=1)
    same = np.array([groups[i] == groups[j] for i, j in zip(a.tolist(), b.tolist(), strict=True)], dtype=bool)
    la, lb = lens[a], lens[b]
    gap = np.abs(la - lb) / np.maximum(np.maximum(la, lb), 1e-12)
    keep = same & (gap >= delta) & (la != lb)
    return np.stack([a[keep], b[keep], (la[keep] > lb[keep]).astype(np.int64)], axis=1).astype(np.int64)


@dataclass(frozen=True)
class _Group:
    source: str
    model: str
    rows: npt.NDArray[np.int64]
    """Indices into the source's training states."""
    lengths: npt.NDArray[np.float64]


def _training_groups(src: Source) -> tuple[list[_Group], list[str]]:
    """The source's training answers per model (held-out split left out; its training-only prompts
    added), and the training prompts they index."""
    keep = ~src.test
    prompts = [p for p, k in zip(src.prompts, keep.tolist(), strict=True) if k] + list(src.extra_prompts)
    n_main = int(keep.sum())
    groups = []
    for model, lengths in src.train.items():
        main = lengths[keep]
        rows = [np.flatnonzero(np.isfinite(main) & (main > 0))]
        lens = [main[rows[0]]]
        if src.extra_prompts and model in src.extra_train:
            extra = src.extra_train[model]
            sel = np.flatnonzero(np.isfinite(extra) & (extra > 0))
            rows.append(sel + n_main)
            lens.append(extra[sel])
        r, ln = np.concatenate(rows).astype(np.int64), np.concatenate(lens)
        if r.size >= 2:
            groups.append(_Group(src.name, model, r, ln))
    return groups, prompts


def _ridge_head(
    model: MixModel,
    train_sets: Sequence[tuple[list[_Group], list[npt.NDArray[np.float32]], float]],
    alpha: float,
) -> None:
    """Set the head to a ridge fit on the pooled features of the untrained top layers."""
    model.eval()
    xs, ys, ws = [], [], []
    for groups, states, share in train_sets:
        feats = score_states(model, states, pooled=True).cpu().numpy().astype(np.float64)
        for g in groups:
            xs.append(feats[g.rows])
            ys.append(rank_targets(g.lengths))
            ws.append(np.full(g.rows.size, share / (g.rows.size * len(groups))))
    # one penalty in every direction (fit_ridge's isotropic scaling), as raw weights on the pooled features
    head = fit_ridge(
        np.vstack(xs), np.concatenate(ys), kind="text", alpha=alpha, sample_weight=np.concatenate(ws), isotropic=True
    )
    w = head.weights / head.scale
    b = head.bias - float(head.mean @ w)
    with torch.no_grad():
        model.head.weight.copy_(torch.from_numpy(w).float().unsqueeze(0))
        model.head.bias.fill_(b)


@dataclass
class FoldResult:
    """One held-out-source fold (``held_out`` None: trained on every source): tau_b per ``source:model``
    column, which columns are in-source (the held-out split of a training source), and what the run cost."""

    held_out: str | None
    taus: dict[str, float]
    in_source: set[str]
    train_seconds: float
    lower_seconds: float
    steps: int
    pairs_seen: int
    loss_first: float
    loss_last: float


def finetune_fold(
    recipe: FinetuneRecipe,
    sources: Sequence[Source],
    held_out: str,
    *,
    cache: Path | None = None,
    threads: int = 2,
    log: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> FoldResult:
    """Fine-tune on every source but ``held_out`` and measure tau_b on all of them (``held_out``: all
    its prompts; the others: their held-out split). ``device``: where torch trains (``cpu``, ``cuda``)."""
    names = [s.name for s in sources]
    if held_out not in names:
        raise DataError(f"held-out source {held_out!r} is not among the sources ({', '.join(names)})")
    return _finetune(recipe, sources, held_out, cache=cache, threads=threads, log=log, device=device)[0]


def finetune_all(
    recipe: FinetuneRecipe,
    sources: Sequence[Source],
    out_dir: str | Path,
    *,
    cache: Path | None = None,
    threads: int = 2,
    log: Callable[[str], None] | None = None,
    meta: dict[str, Any] | None = None,
    device: str = "cpu",
) -> FoldResult:
    """Fine-tune on the training prompts of every source (no source held out; each one's held-out split
    still left out and scored, so the tau_b returned are all in-source) and save the result to
    ``out_dir`` as a predictor checkpoint (:func:`merged_predictor`; ``meta`` is added to its
    ``predictor.json``), which :func:`headway.predict.shipped.pack_checkpoint` packs."""
    from headway.predict.model import check_checkpoint_target, save_checkpoint

    check_checkpoint_target(out_dir)  # refused before the training, not after
    if recipe.truncation != "head":  # the scorers read a prompt's first max_length tokens
        raise ValueError(f"FinetuneRecipe.truncation {recipe.truncation!r}: a checkpoint is scored on a prompt's head")
    fold, model = _finetune(recipe, sources, None, cache=cache, threads=threads, log=log, device=device)
    predictor, tokenizer = merged_predictor(recipe, model.cpu())
    info = {
        "recipe": recipe.label,
        "trained_on": [s.name for s in sources],
        "held_out_tau_b": fold.taus,
        "steps": fold.steps,
        "pairs_seen": fold.pairs_seen,
    }
    save_checkpoint(
        predictor,
        tokenizer,
        out_dir,
        fine_tuned=True,
        encoder_path=encoder_path(recipe.encoder),
        encoder_layers=recipe.encoder_layers,
        max_length=recipe.max_length,
        meta={"finetune": info, **(meta or {})},
    )
    return fold


def merged_predictor(recipe: FinetuneRecipe, model: MixModel) -> tuple[LengthPredictor, Any]:
    """The full encoder (``recipe.encoder`` reloaded, cut to ``recipe.encoder_layers`` if set, its top
    ``recipe.top_layers`` layers replaced by ``model``'s fine-tuned ones; every other weight, the pooler
    included, the base's own) and ``model``'s head, mean pooling: a
    :class:`~headway.predict.model.LengthPredictor` that scores as ``model`` does on the cached
    lower-layer states. Returns it (eval mode) and the encoder's tokenizer."""
    encoder, tokenizer = load_encoder(recipe.encoder, recipe.encoder_layers)
    layers = cast(Any, encoder).encoder.layer
    tuned = cast(Any, model.top).encoder.layer
    if len(tuned) != recipe.top_layers or len(layers) < len(tuned):
        raise ValueError(f"the model has {len(tuned)} fine-tuned layers, the recipe {recipe.top_layers}")
    cut = len(layers) - len(tuned)
    for k, layer in enumerate(tuned):
        layers[cut + k].load_state_dict(layer.state_dict())
    predictor = LengthPredictor(encoder, pooling="mean")
    predictor.head.load_state_dict(model.head.state_dict())
    return predictor.eval(), tokenizer


def _finetune(
    recipe: FinetuneRecipe,
    sources: Sequence[Source],
    held_out: str | None,
    *,
    cache: Path | None,
    threads: int,
    log: Callable[[str], None] | None,
    device: str = "cpu",
) -> tuple[FoldResult, MixModel]:
    """The fine-tuning run behind :func:`finetune_fold` (``held_out`` a source) and :func:`finetune_all`
    (``held_out`` None): the fold's result and the trained model. It never trains on prompts
    :func:`~headway.predict.crosssource.exclude_shared_prompts` leaves out."""
    say = log or (lambda _m: None)
    sources, _ = exclude_shared_prompts(sources)
    torch.set_num_threads(max(1, threads))
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    dev = training_device(device)
    encoder, tokenizer = load_encoder(recipe.encoder, recipe.encoder_layers)
    limit = position_limit(cast(Any, encoder).config)
    if limit is not None and recipe.max_length > limit:
        raise ValueError(f"FinetuneRecipe.max_length {recipe.max_length} is more than {recipe.encoder} takes ({limit})")
    lower, top = split_encoder(encoder, recipe.top_layers)
    lower.to(dev)
    tag = f"{recipe.encoder}|top={recipe.top_layers}"
    if recipe.encoder_layers is not None:
        tag += f"|layers={recipe.encoder_layers}"
    if dev.type != "cpu":
        tag += f"|{dev.type}"  # states computed on a GPU differ from the CPU's in the last bits

    t0 = time.perf_counter()
    eval_states = {
        s.name: lower_states(
            lower, tokenizer, s.prompts, recipe.max_length, cache=cache, tag=tag, truncation=recipe.truncation
        )
        for s in sources
    }
    train_sets = []
    for src in sources:
        if src.name == held_out:
            continue
        groups, prompts = _training_groups(src)
        main = [st for st, k in zip(eval_states[src.name], (~src.test).tolist(), strict=True) if k]
        extra = (
            lower_states(
                lower,
                tokenizer,
                src.extra_prompts,
                recipe.max_length,
                cache=cache,
                tag=tag,
                truncation=recipe.truncation,
            )
            if src.extra_prompts
            else []
        )
        states = main + extra
        assert len(states) == len(prompts)
        answers = sum(g.rows.size for g in groups)
        if groups:
            train_sets.append((src.name, groups, states, math.sqrt(answers) if recipe.weighting == "sqrt" else 1.0))
    lower_seconds = time.perf_counter() - t0
    if not train_sets:
        raise DataError(f"no training answers outside {held_out}" if held_out else "no training answers")
    total_w = sum(w for *_, w in train_sets)
    shares = [max(2, round(recipe.batch_size * w / total_w)) for *_, w in train_sets]
    say(
        f"held out {held_out or 'nothing'}: lower layers cached in {lower_seconds:.0f} s; per step "
        + ", ".join(f"{name} {k}" for (name, *_), k in zip(train_sets, shares, strict=True))
    )

    model = MixModel(top).to(dev)
    if recipe.head_init == "ridge":
        _ridge_head(model, [(groups, states, w) for _, groups, states, w in train_sets], recipe.ridge_alpha)
    model.train(recipe.dropout)
    params = [p for p in model.top.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": params, "lr": recipe.lr}, {"params": list(model.head.parameters()), "lr": recipe.head_lr}],
        weight_decay=recipe.weight_decay,
    )
    warmup = max(1, int(0.1 * recipe.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: (k + 1) / warmup if k < warmup else max(0.0, (recipe.steps - k) / max(1, recipe.steps - warmup))
    )
    losses: list[float] = []
    pairs_seen = 0
    t1 = time.perf_counter()
    for step in range(recipe.steps):
        batch_states: list[npt.NDArray[np.float32]] = []
        batch_lengths: list[float] = []
        batch_groups: list[tuple[str, str]] = []
        weights: dict[tuple[str, str], float] = {}
        for (_, groups, states, w), k in zip(train_sets, shares, strict=True):
            g = groups[int(rng.integers(len(groups)))]
            pick = rng.choice(g.rows.size, size=min(k, g.rows.size), replace=False)
            batch_states += [states[int(r)] for r in g.rows[pick]]
            batch_lengths += g.lengths[pick].tolist()
            batch_groups += [(g.source, g.model)] * pick.size
            weights[(g.source, g.model)] = w
        pairs = group_pairs(np.asarray(batch_lengths), batch_groups, recipe.delta)
        if pairs.shape[0] == 0:
            sched.step()
            continue
        scores = score_states(model, batch_states, micro=16, grad=True)
        loss = torch.zeros((), device=dev)
        for key, w in weights.items():
            sel = [i for i, (a, _, _) in enumerate(pairs.tolist()) if batch_groups[a] == key]
            if sel:
                p = torch.from_numpy(pairs[sel]).to(dev)
                loss = loss + (w / total_w) * margin_ranking_loss(
                    scores[p[:, 0]], scores[p[:, 1]], p[:, 2], recipe.margin
                )
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if recipe.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params + list(model.head.parameters()), recipe.grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        pairs_seen += int(pairs.shape[0])
        if (step + 1) % max(1, recipe.steps // 10) == 0:
            recent = float(np.mean(losses[-max(1, recipe.steps // 10) :]))
            say(f"  step {step + 1}/{recipe.steps}: loss {recent:.4f} ({time.perf_counter() - t1:.0f} s)")
    train_seconds = time.perf_counter() - t1

    model.eval()
    taus: dict[str, float] = {}
    in_source: set[str] = set()
    for src in sources:
        scores_all = score_states(model, eval_states[src.name]).cpu().numpy().astype(np.float64)
        mask = np.ones(len(src.prompts), dtype=bool) if src.name == held_out else src.test
        for m, lengths in src.evals.items():
            col = f"{src.name}:{m}"
            taus[col] = _tau(scores_all[mask], lengths[mask])
            if src.name != held_out:
                in_source.add(col)
    n = max(1, len(losses) // 10)
    fold = FoldResult(
        held_out,
        taus,
        in_source,
        train_seconds,
        lower_seconds,
        recipe.steps,
        pairs_seen,
        float(np.mean(losses[:n])) if losses else math.nan,
        float(np.mean(losses[-n:])) if losses else math.nan,
    )
    return fold, model


def fold_table(
    recipe: FinetuneRecipe, sources: Sequence[Source], folds: Sequence[FoldResult], baseline: CrossSourceResult | None
) -> CrossSourceResult:
    """The folds as a cross-source result (rows ``all but <source>``, or ``all sources`` for a run that
    held none out), with ``baseline``'s fixed rows."""
    columns = [f"{s.name}:{m}" for s in sources for m in s.evals]
    mix = "the other sources" if any(f.held_out for f in folds) else "every source"
    result = CrossSourceResult(
        columns,
        {},
        {},
        {s.name: len(s.prompts) for s in sources},
        title=f"Length predictors across sources, encoder fine-tuned on a mix of {mix}",
    )
    if baseline is not None:
        for key in baseline.rows:
            if key[1] in baseline.baselines:
                result.rows[key], result.in_source[key] = baseline.rows[key], baseline.in_source[key]
                result.baselines.add(key[1])
    for fold in sorted(folds, key=lambda f: SOURCES.index(f.held_out) if f.held_out in SOURCES else len(SOURCES)):
        key = (f"all but {fold.held_out}" if fold.held_out else "all sources", recipe.label)
        result.rows[key], result.in_source[key] = fold.taus, fold.in_source
    return result
