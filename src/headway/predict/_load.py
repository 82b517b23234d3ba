"""Load what a scorer spec names (:mod:`headway.predict._resolve` parses it): the predictor, or a batch
function ``list[str] -> scores``. Shared by the score-ranked policies (``scorer="default"``) and the
gateway; imports the scoring code only when a predictor is loaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headway.predict._resolve import predictor_spec, resolve_score_fn

__all__ = ["load_batch_scorer", "load_predictor"]


def load_predictor(spec: str, *, backend: str = "torch", threads: int = 2, max_length: int | None = None) -> Any:
    """The trained predictor a :func:`predictor_spec` names, loaded: ``"default"`` is
    :func:`headway.predict.score.default_scorer` (the shipped predictor when nothing is trained),
    ``"DIR"`` a checkpoint, each with an optional ``":BACKEND"`` (else ``backend``); ``threads`` and
    ``max_length`` (the checkpoint's by default) are its scoring settings. It has ``score(prompts)``;
    the shipped one also ``embed`` and ``score_embeddings`` (what online learning refits on). Errors
    are ValueError naming the spec."""
    predictor = predictor_spec(spec)
    if predictor is None:
        raise ValueError(f"scorer {spec!r} names no predictor ('default', 'default:BACKEND' or a checkpoint DIR)")
    from headway.predict.score import Scorer, default_scorer, scoring_backend

    checkpoint, given = predictor
    try:
        kind = scoring_backend(given or backend)
    except ValueError as exc:
        raise ValueError(f"scorer {spec!r}: {exc}") from None
    if checkpoint is None:
        return default_scorer(kind, threads=threads, max_length=max_length)
    return Scorer.from_checkpoint(checkpoint, kind, threads=threads, max_length=max_length)


def load_batch_scorer(
    spec: str, *, backend: str = "torch", threads: int = 2, max_length: int | None = None
) -> Callable[[list[str]], Any]:
    """``list[str] -> scores`` for any scorer spec: a predictor (:func:`load_predictor`) or a
    ``"module:attr"`` (:func:`resolve_score_fn`). Errors are ValueError naming the spec."""
    if predictor_spec(spec) is None:
        return resolve_score_fn(spec)
    fn: Callable[[list[str]], Any] = load_predictor(spec, backend=backend, threads=threads, max_length=max_length).score
    return fn
