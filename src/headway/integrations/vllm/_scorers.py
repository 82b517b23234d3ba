"""Text scorers for the ``scorer`` setting."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from headway.integrations.vllm._errors import PluginConfigError
from headway.predict._resolve import predictor_spec, resolve_score_fn

__all__ = ["TextScoreFn", "load_text_scorer", "word_count_scorer"]

TextScoreFn = Callable[[list[str]], Any]
"""Scores a batch of prompt texts: one float per prompt (a sequence or an array)."""


def word_count_scorer(prompts: Sequence[str]) -> list[float]:
    """A toy text scorer: ``log(1 + words)``. For tests and demos, not a predictor."""
    return [math.log1p(len(p.split())) for p in prompts]


def load_text_scorer(spec: str, *, backend: str = "torch", threads: int = 1) -> TextScoreFn:
    """Resolve the ``scorer`` setting to a batch function ``list[str] -> scores``; a
    predictor spec's own backend (``"DIR:onnx-int8"``) wins over ``backend``."""
    predictor = predictor_spec(spec)
    if predictor is not None:
        from headway.predict.score import Scorer, ensure_predictor, scoring_backend

        checkpoint, given = predictor
        try:
            kind = scoring_backend(given or backend)
        except ValueError as exc:
            raise PluginConfigError(f"headway plugin: scorer {spec!r}: {exc}") from None
        path = ensure_predictor(checkpoint, train_if_missing=False, log=None)
        scorer = Scorer.from_checkpoint(path, kind, threads=threads)
        return scorer.score
    try:
        return resolve_score_fn(spec)
    except ValueError as exc:
        raise PluginConfigError(
            f"headway plugin: {exc} (the scorer setting is 'default', a predictor directory, "
            "'module:attr' or 'module:factory()')"
        ) from None
