"""Training a length predictor: pairwise (PARS), pointwise or listwise (ListMLE) on one backbone.

All three losses see the same prompt-disjoint split and the same budget: each optimizer step encodes one
batch of ``batch_size`` training examples; the pairwise loss uses the pairs that :func:`make_pairs` draws
inside that batch (``partners`` per example, delta filter), the listwise loss the batch as one list, the
pointwise loss each example's standardized log length. ``pairs_from="global"`` instead draws the pair
set once over the whole training split (``max_pairs``) and steps through it ``batch_size // 2`` pairs at
a time, as PARS does; it encodes far more sequences per pair.

``mode="full"`` fine-tunes the encoder (AdamW, linear warm-up and decay, gradient clipping);
``mode="frozen"`` embeds every prompt once (cached in memory) and trains only the head, in seconds.
The checkpoint with the best validation Kendall tau_b is kept (validation prompts are disjoint from the
test prompts, which are only used for the final report; with several models' lengths, the mean of each
model's tau_b: :func:`validation_tau`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import torch

from headway.predict._embed import embed_ids, embed_prompts, embedding_tag, progress_bar
from headway.predict._errors import DataError, EncoderError, PredictError
from headway.predict._paths import (
    DEFAULT_PREDICTOR_NAME,
    DEFAULT_TRAIN_DATA,
    default_predictor_dir,
)
from headway.predict.data import (
    DEFAULT_DELTA,
    ExampleSet,
    Split,
    load_dataset,
    make_pairs,
    split_by_prompt,
)
from headway.predict.evaluate import Metrics, rank_metrics
from headway.predict.losses import LOSSES, list_mle_loss, margin_ranking_loss, pointwise_loss
from headway.predict.model import (
    LengthPredictor,
    check_checkpoint_target,
    load_encoder,
    position_limit,
    save_checkpoint,
    tokenize,
)

__all__ = [
    "DEFAULT_PREDICTOR_NAME",
    "TrainConfig",
    "TrainResult",
    "default_predictor_dir",
    "embed_prompts",
    "embedding_tag",
    "train_predictor",
]


Mode = Literal["full", "frozen"]


@dataclass
class TrainConfig:
    """Every setting of a training run; stored in the checkpoint's ``predictor.json``."""

    data: str = DEFAULT_TRAIN_DATA
    """A :func:`load_dataset` spec: ``alpaca_eval:MODEL``, ``alpaca_eval:mean`` (default), ``sharegpt``,
    ``codealpaca``, a JSONL path, or ``A+B``."""
    unit: str = "tokens"
    loss: str = "pairwise"
    mode: Mode = "full"
    encoder: str | None = None
    """Local Hugging Face encoder directory, or a packaged encoder's name (``"minilm"``, ``"mpnet"``:
    :data:`~headway.predict._paths.PACKAGED_ENCODERS`); ``None`` = the bundled MiniLM-L6."""
    encoder_layers: int | None = None
    """Keep only the encoder's first layers (``None``: all). Scoring time is about proportional to
    the layers kept (``benchmarks/results/predictor_layers.md``)."""
    pooling: str | None = None
    """``None``: ``"auto"`` (pooled [CLS]) when fine-tuning; ``"mean"`` in frozen mode, because a frozen
    sentence-transformers encoder (MiniLM) was trained for mean pooling: on alpaca_eval gpt4 held-out
    prompts the frozen pooled [CLS] reached Kendall tau_b 0.24, the mean 0.34."""
    max_length: int = 128
    epochs: int | None = None
    """``None``: 6 (full) or 60 (frozen)."""
    batch_size: int = 32
    micro_batch: int = 16
    """Examples per encoder forward (sorted by length, padded per micro-batch)."""
    pairs_from: Literal["batch", "global"] = "batch"
    partners: int = 16
    max_pairs: int = 10_000
    """Cap on the pair set when ``pairs_from="global"``."""
    delta: float = DEFAULT_DELTA
    margin: float = 1.0
    freeze_word_embeddings: bool = True
    """Full mode: keep the word-embedding matrix fixed (half of MiniLM's weights; faster, less overfit)."""
    lr: float | None = None
    """Encoder learning rate (full mode); ``None``: 5e-5."""
    head_lr: float | None = None
    """``None``: 1e-3 (full) or 3e-3 (frozen)."""
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    grad_clip: float = 1.0
    test_frac: float = 0.2
    val_frac: float = 0.1
    seed: int = 0
    threads: int = 2
    progress: bool = True
    pretrain: str | None = None
    """Full mode: first train the same model on this :func:`load_dataset` spec (e.g. ``sharegpt``) for
    ``pretrain_epochs``, then train on ``data`` from its fine-tuned encoder with a fresh head. On
    alpaca_eval consensus labels, one epoch on ShareGPT's 12,246 training prompts raised validation
    tau_b from 0.612 to 0.636 and held-out tau_b against gpt4 from 0.480 to 0.498
    (``benchmarks/results/predictor_pretrain.md``)."""
    pretrain_epochs: int = 1

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        if self.mode not in ("full", "frozen"):
            raise ValueError(f"unknown mode {self.mode!r}; choose full or frozen")
        if self.pairs_from not in ("batch", "global"):
            raise ValueError(f"pairs_from must be batch or global, got {self.pairs_from!r}")
        minimum = {"batch_size": 2, "micro_batch": 1, "max_length": 8, "partners": 1, "max_pairs": 1}
        for name, least in minimum.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.encoder_layers is not None and self.encoder_layers < 1:
            raise ValueError(f"encoder_layers must be >= 1, got {self.encoder_layers}")
        if not (0 <= self.seed < 2**32):
            raise ValueError(f"seed must be in 0..{2**32 - 1}, got {self.seed}")
        if not (0.0 <= self.delta < 1.0):
            raise ValueError(f"delta must be in [0, 1), got {self.delta}")
        for name in ("lr", "head_lr"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        for name in ("margin", "weight_decay", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        if not (0.0 <= self.warmup_frac <= 1.0):
            raise ValueError(f"warmup_frac must be in [0, 1], got {self.warmup_frac}")
        if not (0.0 <= self.test_frac < 1.0 and 0.0 <= self.val_frac < 1.0 and self.test_frac + self.val_frac < 1.0):
            raise ValueError(
                f"test_frac and val_frac must be in [0, 1) and sum below 1, got {self.test_frac} and {self.val_frac}"
            )
        if self.pretrain is not None and self.mode != "full":
            raise ValueError(f"pretrain needs mode='full' (a frozen encoder learns nothing from it), got {self.mode!r}")
        if self.pretrain_epochs < 1:
            raise ValueError(f"pretrain_epochs must be >= 1, got {self.pretrain_epochs}")

    @property
    def resolved_pooling(self) -> str:
        if self.pooling is not None:
            return self.pooling
        return "auto" if self.mode == "full" else "mean"

    @property
    def resolved_epochs(self) -> int:
        return self.epochs if self.epochs is not None else (6 if self.mode == "full" else 60)

    @property
    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else 5e-5

    @property
    def resolved_head_lr(self) -> float:
        return self.head_lr if self.head_lr is not None else (1e-3 if self.mode == "full" else 3e-3)

    def split(self, data: ExampleSet) -> Split:
        """``data`` split by prompt as this run splits it (``test_frac``, ``val_frac``, ``seed``)."""
        return split_by_prompt(data, self.test_frac, self.val_frac, self.seed)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("progress")
        d["epochs"] = self.resolved_epochs
        d["pooling"] = self.resolved_pooling
        d["lr"] = self.resolved_lr
        d["head_lr"] = self.resolved_head_lr
        return d


@dataclass
class TrainResult:
    path: Path
    config: TrainConfig
    train_seconds: float
    """Wall time of the whole run: tokenizing, (frozen) embedding, training, validation, saving."""
    embed_seconds: float
    cpu_seconds: float
    n_train: int
    n_val: int
    n_test: int
    steps: int
    pairs_seen: int
    distinct_pairs: int
    unit: str
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    test: Metrics | None = None


# ---------------------------------------------------------------------------------------------------------
# Training


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _batch_loss(
    cfg: TrainConfig,
    scores: torch.Tensor,
    rows: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.float64],
    targets: npt.NDArray[np.float64],
    groups: npt.NDArray[np.int64],
    rng: np.random.Generator,
    gen: torch.Generator,
    pairs: npt.NDArray[np.int64] | None = None,
) -> tuple[torch.Tensor | None, npt.NDArray[np.int64] | None]:
    """Loss of one batch; ``pairs`` holds batch-local pairs in global-pairs mode.

    Returns the loss (None when the batch has nothing to learn from) and the batch-local pairs used.
    """
    if cfg.loss == "pointwise":
        return pointwise_loss(scores, torch.from_numpy(targets[rows]).float()), None
    if cfg.loss == "listwise":
        losses = []
        for g in np.unique(groups[rows]):
            sel = np.flatnonzero(groups[rows] == g)
            if sel.size >= 2:
                idx = torch.from_numpy(sel)
                losses.append(list_mle_loss(scores[idx], torch.from_numpy(lengths[rows][sel]), gen))
        return (torch.stack(losses).mean() if losses else None), None
    if pairs is None:
        pairs = make_pairs(lengths[rows], cfg.partners, cfg.delta, rng, groups=groups[rows].tolist())
    if pairs.shape[0] == 0:
        return None, None
    a, b, label = (torch.from_numpy(pairs[:, k]) for k in range(3))
    return margin_ranking_loss(scores[a], scores[b], label, cfg.margin), pairs


def _lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def _finite_or_null(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in nested dicts, lists and tuples) replaced by None,
    so that ``predictor.json`` is strict JSON (``json.dumps`` would write ``NaN`` and ``-Infinity``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def _pretrain(
    cfg: TrainConfig, data: str, data_dir: str | Path | None, say: Callable[[str], None]
) -> tuple[TrainResult, Any, Any]:
    """Stage 1 of ``cfg.pretrain``: the same training on ``data`` (its own seeded split); returns its
    result and its fine-tuned encoder and tokenizer, for stage 2 to start from."""
    import tempfile

    from headway.predict.model import load_checkpoint

    stage1 = dataclasses.replace(cfg, data=data, epochs=cfg.pretrain_epochs, pretrain=None)
    say(f"pretraining on {data} for {cfg.pretrain_epochs} epoch(s)")
    with tempfile.TemporaryDirectory(prefix="headway-pretrain-") as tmp:
        result = train_predictor(stage1, Path(tmp) / "stage1", data_dir=data_dir, log=lambda m: say(f"  pretrain: {m}"))
        loaded = load_checkpoint(result.path)
    return result, loaded.model.encoder, loaded.tokenizer


def validation_tau(scores: npt.NDArray[np.float64], val: ExampleSet) -> float:
    """Kendall tau_b of ``scores`` on the validation examples, as the training ranks: within one model's
    lengths. Several models' lengths are ranked per model and their taus averaged (models with fewer
    than two examples, or a nan tau, left out): pooled, one model's longer answers would rank against
    another's, which no pair in training does; nan when no model has a tau."""
    models = [e.model for e in val]
    lengths = val.lengths()
    if len(set(models)) <= 1:
        return rank_metrics(scores, lengths).kendall_tau_b
    taus = []
    for m in dict.fromkeys(models):
        rows = [i for i, x in enumerate(models) if x == m]
        if len(rows) >= 2:
            tau = rank_metrics(scores[rows], lengths[rows]).kendall_tau_b
            if not math.isnan(tau):
                taus.append(tau)
    return float(np.mean(taus)) if taus else math.nan


def train_predictor(
    config: TrainConfig | None = None,
    out_dir: str | Path | None = None,
    *,
    data: ExampleSet | None = None,
    data_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train, keep the best-validation weights, save a checkpoint to ``out_dir`` (default
    ``~/.cache/headway/predictors/<DEFAULT_PREDICTOR_NAME>``) and report held-out test metrics.

    ``out_dir`` is checked first: a path that exists and is not a checkpoint (nor an empty directory)
    is refused (:func:`~headway.predict.model.check_checkpoint_target`); an existing checkpoint is
    replaced only once the new one is written. Training that diverges (a loss that is not finite)
    raises :class:`PredictError` and saves nothing."""
    cfg = config or TrainConfig()
    say = log or (lambda _m: None)
    out = check_checkpoint_target(out_dir if out_dir is not None else default_predictor_dir())
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    torch.set_num_threads(max(1, cfg.threads))
    _seed_everything(cfg.seed)
    dataset = data if data is not None else load_dataset(cfg.data, cfg.unit, data_dir)
    if dataset.unit != cfg.unit:
        raise DataError(f"{dataset.name}: data is in {dataset.unit}, config asks for {cfg.unit}")
    split = cfg.split(dataset)
    train = split.train
    if len(train) < 2:
        raise DataError(f"{dataset.name}: only {len(train)} training examples after the split")
    say(
        f"data {dataset.name}: {len(train)} train / {len(split.val)} val / {len(split.test)} test examples "
        f"(prompt-disjoint, seed {cfg.seed}); unit {dataset.unit_label}"
    )
    if len(split.val) < 2:
        say(
            f"warning: {len(split.val)} validation examples: val tau_b reads nan and the last epoch is kept "
            "(no epoch is chosen by validation); more data, or a larger val_frac, gives it some"
        )

    pretrained: TrainResult | None = None
    if cfg.pretrain is not None:
        pretrained, encoder, tokenizer = _pretrain(cfg, cfg.pretrain, data_dir, say)
        _seed_everything(cfg.seed)  # stage 2 draws as a run from this encoder would
    else:
        encoder, tokenizer = load_encoder(cfg.encoder, cfg.encoder_layers)
    limit = position_limit(cast(Any, encoder).config)
    if limit is not None and cfg.max_length > limit:
        raise EncoderError(
            f"max_length {cfg.max_length} is more than the encoder ({cfg.encoder or 'minilm'}) takes: "
            f"its position embeddings cover {limit} tokens; use --max-length {limit} or less"
        )
    model = LengthPredictor(encoder, cfg.resolved_pooling)
    pad_id = int(tokenizer.pad_token_id or 0)
    frozen = cfg.mode == "frozen"
    cache_tag = embedding_tag(cfg.encoder, model.pooling, cfg.max_length, cfg.encoder_layers)

    lengths = train.lengths()
    log_len = np.log(lengths)
    mu, sigma = float(log_len.mean()), float(log_len.std() or 1.0)
    targets = (log_len - mu) / sigma
    model_names = [e.model for e in train]
    group_ids = {m: i for i, m in enumerate(dict.fromkeys(model_names))}
    groups = np.array([group_ids[m] for m in model_names], dtype=np.int64)

    t_embed = time.perf_counter()
    train_ids: list[list[int]] = []
    train_emb: torch.Tensor | None = None
    feat_mu = feat_sd = torch.zeros(0)
    if frozen:
        raw = torch.from_numpy(
            embed_prompts(model, tokenizer, train.prompts(), cfg.max_length, 64, cfg.progress, cache_tag)
        )
        # the head trains on standardized features; the standardization is folded into it at the end
        feat_mu, feat_sd = raw.mean(0), raw.std(0).clamp_min(1e-6)
        train_emb = (raw - feat_mu) / feat_sd
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    else:
        train_ids = tokenize(tokenizer, train.prompts(), cfg.max_length)
    embed_seconds = time.perf_counter() - t_embed

    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(train)
    epochs = cfg.resolved_epochs
    global_pairs: npt.NDArray[np.int64] | None = None
    if cfg.loss == "pairwise" and cfg.pairs_from == "global":
        global_pairs = make_pairs(lengths, cfg.partners, cfg.delta, rng, groups=groups.tolist())
        if global_pairs.shape[0] > cfg.max_pairs:
            global_pairs = global_pairs[rng.choice(global_pairs.shape[0], cfg.max_pairs, replace=False)]
        per_step = max(1, cfg.batch_size // 2)
        steps_per_epoch = math.ceil(global_pairs.shape[0] / per_step)
        say(f"pair set: {global_pairs.shape[0]} pairs (delta {cfg.delta}), {per_step} pairs per step")
    else:
        steps_per_epoch = math.ceil(n / cfg.batch_size)
    total_steps = max(1, steps_per_epoch * epochs)

    head_params = list(model.head.parameters())
    groups_opt: list[dict[str, Any]] = [{"params": head_params, "lr": cfg.resolved_head_lr}]
    if not frozen:
        word_emb = cast(Any, model.encoder).get_input_embeddings() if cfg.freeze_word_embeddings else None
        if word_emb is not None:
            word_emb.weight.requires_grad_(False)
        trainable = [p for p in model.encoder.parameters() if p.requires_grad]
        groups_opt.append({"params": trainable, "lr": cfg.resolved_lr})
    opt = torch.optim.AdamW(groups_opt, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total_steps, int(cfg.warmup_frac * total_steps)))

    val = split.val
    val_ids = tokenize(tokenizer, val.prompts(), cfg.max_length) if len(val) and not frozen else []
    val_emb = (
        (
            torch.from_numpy(embed_prompts(model, tokenizer, val.prompts(), cfg.max_length, 64, False, cache_tag))
            - feat_mu
        )
        / feat_sd
        if len(val) and frozen
        else None
    )

    def score_val() -> float:
        if len(val) < 2:
            return math.nan
        model.eval()
        with torch.inference_mode():
            if val_emb is not None:
                s = model.score_embeddings(val_emb).numpy()
            else:
                s = model.score_embeddings(embed_ids(model, val_ids, list(range(len(val))), 64, pad_id)).numpy()
        return validation_tau(s, val)

    history: list[dict[str, float]] = []
    best_tau, best_epoch, best_state = -math.inf, 0, None
    pairs_seen = 0
    seen_pairs: set[int] = set()
    step = opt_steps = 0
    bar = progress_bar(total_steps, f"train {cfg.loss}/{cfg.mode}", cfg.progress)
    for epoch in range(1, epochs + 1):
        model.train()
        if frozen:
            model.encoder.eval()
        epoch_loss, epoch_batches = 0.0, 0
        if global_pairs is not None:
            order = rng.permutation(global_pairs.shape[0])
            per_step = max(1, cfg.batch_size // 2)
            batches = [global_pairs[order[k : k + per_step]] for k in range(0, order.size, per_step)]
        else:
            perm = rng.permutation(n)
            batches = [perm[k : k + cfg.batch_size] for k in range(0, n, cfg.batch_size)]
        for batch in batches:
            local_pairs = None
            if global_pairs is not None:
                rows, inv = np.unique(batch[:, :2], return_inverse=True)
                local_pairs = np.stack([inv.reshape(-1, 2)[:, 0], inv.reshape(-1, 2)[:, 1], batch[:, 2]], 1)
            else:
                rows = np.asarray(batch, dtype=np.int64)
            if rows.size < 2:
                continue
            if train_emb is not None:
                scores = model.score_embeddings(train_emb[torch.from_numpy(rows)])
            else:
                scores = model.score_embeddings(embed_ids(model, train_ids, rows.tolist(), cfg.micro_batch, pad_id))
            loss, used = _batch_loss(cfg, scores, rows, lengths, targets, groups, rng, gen, local_pairs)
            step += 1
            bar.update(1)
            if loss is None:
                with warnings.catch_warnings():  # no optimizer step yet when the first batches had no pairs
                    warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
                    sched.step()
                continue
            if not bool(torch.isfinite(loss.detach())):
                bar.close()
                raise PredictError(
                    f"training diverged: loss {float(loss.detach())} at epoch {epoch}, step {step} "
                    f"(lr {cfg.resolved_lr:g}, head_lr {cfg.resolved_head_lr:g}); nothing was saved"
                )
            if used is not None:
                pairs_seen += int(used.shape[0])
                ga, gb = rows[used[:, 0]], rows[used[:, 1]]
                seen_pairs.update((np.minimum(ga, gb) * n + np.maximum(ga, gb)).tolist())
            opt.zero_grad(set_to_none=True)
            cast(Any, loss).backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(
                    [p for g in groups_opt for p in g["params"] if p.requires_grad], cfg.grad_clip
                )
            opt.step()
            sched.step()
            opt_steps += 1
            epoch_loss += float(loss.detach())
            epoch_batches += 1
            bar.set_postfix(loss=f"{epoch_loss / max(1, epoch_batches):.4f}")
        val_tau = score_val()
        history.append({"epoch": epoch, "loss": epoch_loss / max(1, epoch_batches), "val_kendall_tau_b": val_tau})
        if not frozen or epoch % 50 == 0 or epoch == epochs:
            say(f"epoch {epoch}/{epochs}: loss {history[-1]['loss']:.4f}, val tau_b {val_tau:.4f}")
        # Keep the epoch with the best finite validation tau. A NaN tau (no validation set, or
        # scores that all tie) keeps the latest weights only while no epoch has had a finite one:
        # a run that collapses after a good epoch keeps the good epoch.
        if val_tau > best_tau or (math.isnan(val_tau) and not math.isfinite(best_tau)):
            best_tau, best_epoch = (val_tau if not math.isnan(val_tau) else best_tau), epoch
            best_state = copy.deepcopy(model.head.state_dict() if frozen else model.state_dict())
    bar.close()
    if opt_steps == 0:
        why = {
            "pairwise": f"no pair of examples (of one model) whose lengths differ by the delta {cfg.delta} or more",
            "listwise": "no two examples of one model in a batch",
        }.get(cfg.loss, "no batch of two or more examples")
        raise DataError(f"{dataset.name}: nothing to learn from ({why}); nothing was saved")
    if best_state is not None:
        if frozen:
            model.head.load_state_dict(best_state)
        else:
            model.load_state_dict(best_state)
    if frozen:
        with torch.no_grad():  # fold the feature standardization into the head: raw features in
            w = model.head.weight / feat_sd
            model.head.bias.sub_((w * feat_mu).sum())
            model.head.weight.copy_(w)
    model.eval()

    test_metrics: Metrics | None = None
    if len(split.test) >= 2:
        with torch.inference_mode():
            if frozen:
                emb = embed_prompts(model, tokenizer, split.test.prompts(), cfg.max_length, 64, False, cache_tag)
                s = model.score_embeddings(torch.from_numpy(emb)).numpy()
            else:
                ids = tokenize(tokenizer, split.test.prompts(), cfg.max_length)
                s = model.score_embeddings(embed_ids(model, ids, list(range(len(ids))), 64, pad_id)).numpy()
        test_metrics = rank_metrics(s, split.test.lengths(), cfg.delta, dataset.unit_label)

    train_seconds = time.perf_counter() - t_start
    cpu_seconds = time.process_time() - cpu_start
    meta = {
        "training": cfg.as_dict(),
        "data": {
            "name": dataset.name,
            "unit": dataset.unit,
            "unit_label": dataset.unit_label,
            "n_train": len(train),
            "n_val": len(val),
            "n_test": len(split.test),
            "notes": list(dataset.notes),
        },
        "target_standardization": {"log_mean": mu, "log_std": sigma},
        "result": {
            "train_seconds": round(train_seconds, 2),
            "cpu_seconds": round(cpu_seconds, 2),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "embed_seconds": round(embed_seconds, 2),
            "steps": step,
            "pairs_seen": pairs_seen,
            "distinct_pairs": len(seen_pairs),
            "best_epoch": best_epoch,
            "best_val_kendall_tau_b": best_tau,
            "history": history,
            "heldout_test": test_metrics.as_dict() if test_metrics else None,
        },
    }
    if pretrained is not None:
        meta["pretrain"] = {
            "data": cfg.pretrain,
            "epochs": cfg.pretrain_epochs,
            "n_train": pretrained.n_train,
            "train_seconds": round(pretrained.train_seconds, 2),
            "heldout_test": pretrained.test.as_dict() if pretrained.test else None,
        }
    path = save_checkpoint(
        model,
        tokenizer,
        out,
        fine_tuned=not frozen,
        encoder_path=cfg.encoder,
        encoder_layers=cfg.encoder_layers,
        max_length=cfg.max_length,
        meta=_finite_or_null(meta),
    )
    say(f"saved {path} ({train_seconds:.1f} s)")
    return TrainResult(
        path=path,
        config=cfg,
        train_seconds=train_seconds,
        embed_seconds=embed_seconds,
        cpu_seconds=cpu_seconds,
        n_train=len(train),
        n_val=len(val),
        n_test=len(split.test),
        steps=step,
        pairs_seen=pairs_seen,
        distinct_pairs=len(seen_pairs),
        unit=dataset.unit_label,
        history=history,
        best_epoch=best_epoch,
        test=test_metrics,
    )
