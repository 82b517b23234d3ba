"""Batch prompt scoring off the event loop (for learned-length policies such as ``pars``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from headway.predict._resolve import resolve_score_fn

__all__ = ["BatchScorer", "ScoreFn", "load_score_fn"]

ScoreFn = Callable[[list[str]], Sequence[float]]
"""Scores a batch of prompts (higher = longer expected output)."""


def load_score_fn(spec: str) -> ScoreFn:
    """Resolve a scorer spec to ``list[str] -> scores``: ``"pkg.module:attr"`` or
    ``"pkg.module:factory()"`` (see :func:`headway.predict._resolve.resolve_score_fn`), or
    ``"default"`` for ``headway.predict.score:default_scorer()`` (the ``pars`` predictor;
    trains it if missing)."""
    if spec == "default":
        spec = "headway.predict.score:default_scorer()"
    fn: ScoreFn = resolve_score_fn(spec)
    return fn


class BatchScorer:
    """Collects prompts for up to ``max_wait_s`` or ``batch_size`` and scores them in a thread."""

    def __init__(self, fn: ScoreFn, batch_size: int = 32, max_wait_s: float = 0.002) -> None:
        self._fn = fn
        self._batch_size = batch_size
        self._max_wait_s = max_wait_s
        self._pending: list[tuple[str, asyncio.Future[float]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.num_batches = 0

    async def score(self, prompt: str) -> float:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self._pending.append((prompt, fut))
        if len(self._pending) >= self._batch_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._max_wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            self.num_batches += 1
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[str, asyncio.Future[float]]]) -> None:
        try:
            scores = await asyncio.to_thread(self._fn, [p for p, _ in batch])
            if len(scores) != len(batch):
                raise ValueError(f"scorer returned {len(scores)} scores for {len(batch)} prompts")
        except Exception as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), s in zip(batch, scores, strict=True):
            if not fut.done():
                fut.set_result(float(s))
