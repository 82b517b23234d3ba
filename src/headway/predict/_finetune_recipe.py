"""The recipe of ``headway predictor cross-source-finetune``: a frozen, validated config, torch-free so the
command line can be built without the ``predict`` extra's heavy imports."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HEAD_INITS", "TRUNCATIONS", "WEIGHTINGS", "FinetuneRecipe"]

WEIGHTINGS: tuple[str, ...] = ("equal", "sqrt")
TRUNCATIONS: tuple[str, ...] = ("head", "head-tail")
"""Which ``max_length`` tokens of a longer prompt are read (:func:`headway.predict.model.tokenize`):
``head``, its first; ``head-tail``, its first half and its last half, so a long prompt whose question
comes after pasted text keeps the question."""
HEAD_INITS: tuple[str, ...] = ("random", "ridge")


@dataclass(frozen=True)
class FinetuneRecipe:
    """One fine-tuning recipe; every field is validated, and the error names the bad value."""

    encoder: str = "minilm"
    """A packaged encoder's name (``minilm``, ``mpnet``) or a local Hugging Face encoder directory."""
    encoder_layers: int | None = None
    """Keep only the encoder's first N layers (its embeddings and layers 1..N; None: all of them), as
    ``headway predictor train --encoder-layers``: scoring takes about N / L of the full encoder's time."""
    top_layers: int = 4
    """Transformer layers fine-tuned (the top ones); the others are frozen and their outputs cached. 4: the
    shipped default's recipe, chosen over 2 by tau_b on held-out sources (docs/predictors)."""
    max_length: int = 96
    truncation: str = "head"
    """Which ``max_length`` tokens of a longer prompt are read: ``head`` (its first) or ``head-tail`` (its
    first half and last half); :data:`TRUNCATIONS`."""
    steps: int = 800
    batch_size: int = 48
    """Prompts per step, shared among the training sources."""
    lr: float = 2e-4
    """AdamW learning rate of the top layers (linear warm-up over 10 % of the steps, then decay)."""
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    margin: float = 1.0
    delta: float = 0.2
    """PARS's pair filter: ``|a - b| / max(a, b) >= delta``."""
    weighting: str = "sqrt"
    """Share of each training source in a step: ``equal`` or ``sqrt`` (of its training answers)."""
    grad_clip: float = 1.0
    dropout: bool = True
    """Keep the encoder's dropout in the top layers while training (False: train in eval mode; a head
    started from ridge weights is far larger than a random one and amplifies dropout's noise)."""
    head_init: str = "random"
    """``random`` (normal, std 0.02) or ``ridge``: a ridge fit (rank-normal targets per source x model,
    sources weighted as in a step, penalty ``ridge_alpha``) on the untrained encoder's pooled features
    of the training prompts, so fine-tuning starts from the frozen-encoder head."""
    ridge_alpha: float = 10_000.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, least in (("top_layers", 1), ("max_length", 8), ("steps", 1), ("batch_size", 4)):
            if getattr(self, name) < least:
                raise ValueError(f"FinetuneRecipe.{name} must be >= {least}, got {getattr(self, name)!r}")
        if self.encoder_layers is not None and self.encoder_layers < 1:
            raise ValueError(f"FinetuneRecipe.encoder_layers must be >= 1 or None, got {self.encoder_layers!r}")
        if self.encoder_layers is not None and self.top_layers > self.encoder_layers:
            raise ValueError(
                f"FinetuneRecipe.top_layers ({self.top_layers}) is more than the encoder_layers kept "
                f"({self.encoder_layers})"
            )
        for name in ("lr", "head_lr"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"FinetuneRecipe.{name} must be a finite number > 0, got {getattr(self, name)!r}")
        for name in ("weight_decay", "margin", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"FinetuneRecipe.{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"FinetuneRecipe.delta must be in [0, 1), got {self.delta!r}")
        if self.head_init not in HEAD_INITS:
            raise ValueError(
                f"FinetuneRecipe.head_init: unknown {self.head_init!r}; choose one of {', '.join(HEAD_INITS)}"
            )
        if not (math.isfinite(self.ridge_alpha) and self.ridge_alpha > 0):
            raise ValueError(f"FinetuneRecipe.ridge_alpha must be a finite number > 0, got {self.ridge_alpha!r}")
        if self.truncation not in TRUNCATIONS:
            raise ValueError(
                f"FinetuneRecipe.truncation: unknown {self.truncation!r}; choose one of {', '.join(TRUNCATIONS)}"
            )
        if self.weighting not in WEIGHTINGS:
            raise ValueError(
                f"FinetuneRecipe.weighting: unknown {self.weighting!r}; choose one of {', '.join(WEIGHTINGS)}"
            )
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"FinetuneRecipe.seed must be in 0..{2**32 - 1}, got {self.seed!r}")

    @property
    def label(self) -> str:
        share = "sources by sqrt(n)" if self.weighting == "sqrt" else "sources equal"
        init = f", head from ridge (alpha {self.ridge_alpha:g})" if self.head_init == "ridge" else ""
        init += "" if self.dropout else ", no dropout"
        cut = "" if self.truncation == "head" else f" ({self.truncation})"
        encoder = self.encoder if self.encoder_layers is None else f"{self.encoder} first {self.encoder_layers} layers,"
        return (
            f"{encoder} top {self.top_layers} layers fine-tuned, {self.steps} steps x {self.batch_size}, "
            f"lr {self.lr:g}, max_length {self.max_length}{cut}, {share}{init}"
        )
