"""Text scorers for the ``scorer`` setting."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway.integrations.vllm._errors import PluginConfigError
from headway.predict._resolve import predictor_spec, resolve_score_fn

if TYPE_CHECKING:
    from headway.predict.online import OnlineLearner

__all__ = ["TextScoreFn", "load_online_learner", "load_text_scorer", "online_state_for_rank", "word_count_scorer"]

TextScoreFn = Callable[[list[str]], Any]
"""Scores a batch of prompt texts: one float per prompt (a sequence or an array)."""


def word_count_scorer(prompts: Sequence[str]) -> list[float]:
    """A toy text scorer: ``log(1 + words)``. For tests and demos, not a predictor."""
    return [math.log1p(len(p.split())) for p in prompts]


def _load_predictor(spec: str, predictor: tuple[str | None, str | None], backend: str, threads: int) -> Any:
    from headway.predict.score import Scorer, default_scorer, ensure_predictor, scoring_backend

    checkpoint, given = predictor
    try:
        kind = scoring_backend(given or backend)
    except ValueError as exc:
        raise PluginConfigError(f"headway plugin: scorer {spec!r}: {exc}") from None
    if checkpoint is None:  # as the gateway: the predictor trained into the cache, else the shipped one
        return default_scorer(kind, threads=threads)
    path = ensure_predictor(checkpoint, train_if_missing=False, log=None)
    return Scorer.from_checkpoint(path, kind, threads=threads)


def load_text_scorer(spec: str, *, backend: str = "torch", threads: int = 1) -> TextScoreFn:
    """Resolve the ``scorer`` setting to a batch function ``list[str] -> scores``; a
    predictor spec's own backend (``"DIR:onnx-int8"``) wins over ``backend``. ``"default"`` is
    the predictor ``headway predictor train`` wrote to the cache, else the one shipped in the
    package."""
    predictor = predictor_spec(spec)
    if predictor is not None:
        fn: TextScoreFn = _load_predictor(spec, predictor, backend, threads).score
        return fn
    try:
        return resolve_score_fn(spec)
    except ValueError as exc:
        raise PluginConfigError(
            f"headway plugin: {exc} (the scorer setting is 'default', a predictor directory, "
            "'module:attr' or 'module:factory()')"
        ) from None


def online_state_for_rank(path: str, index: int) -> str:
    """The ``online_state`` file of data-parallel engine ``index`` (vLLM's ``data_parallel_index``):
    the file named for engine 0, ``NAME.dpN.EXT`` for the others, so engines never overwrite each
    other's windows (each learns from the requests it served)."""
    if index <= 0:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.dp{index}{p.suffix}"))


def load_online_learner(
    spec: str, *, backend: str = "torch", threads: int = 1, state: str | None = None
) -> OnlineLearner:
    """An :class:`~headway.predict.OnlineLearner` around the predictor the ``scorer`` setting names
    (the ``online_learning`` setting); it must be the shipped one (``"default"`` with nothing trained).
    ``state``: the ``online_state`` file it resumes from and saves to."""
    from headway.predict.online import OnlineLearner

    predictor = predictor_spec(spec)
    if predictor is None:
        raise PluginConfigError(f"headway plugin: online_learning needs the scorer 'default', got {spec!r}")
    loaded = _load_predictor(spec, predictor, backend, threads)
    try:
        return OnlineLearner.around(loaded, state_path=state)
    except ValueError as exc:
        what = f"online_state {state!r}" if state is not None and str(Path(state)) in str(exc) else f"scorer {spec!r}"
        raise PluginConfigError(f"headway plugin: {what}: {exc}") from None
