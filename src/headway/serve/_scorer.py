"""Batch prompt scoring off the event loop (for learned-length policies such as ``pars``)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import cast

from headway.predict._resolve import predictor_spec, resolve_score_fn

__all__ = ["BatchScorer", "ScoreFn", "default_scorer_threads", "load_score_fn"]

log = logging.getLogger("headway.serve.scorer")

ScoreFn = Callable[[list[str]], Sequence[float]]
"""Scores a batch of prompts (higher = longer expected output)."""


def default_scorer_threads() -> int:
    """2, or 1 when this process may run on only one CPU (``os.sched_getaffinity``): a second
    thread on the same CPU makes every batch wait for the slower of the two (on this project's
    2-core VM with the gateway pinned beside vLLM, ``benchmarks/results/gateway.md``)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def load_score_fn(spec: str, *, threads: int | None = None, max_length: int | None = None) -> ScoreFn:
    """Resolve a scorer spec to ``list[str] -> scores``: ``"pkg.module:attr"`` or
    ``"pkg.module:factory()"`` (see :func:`headway.predict._resolve.resolve_score_fn`), or a
    trained predictor (:func:`predictor_spec`): ``"default"`` for the ``pars`` predictor
    (``headway.predict.score:default_scorer()``, trained if missing) or ``"DIR"`` for the
    checkpoint in directory DIR, each optionally followed by ``":BACKEND"`` (``torch``,
    ``onnx`` or ``onnx-int8``).

    ``threads`` (default :func:`default_scorer_threads`) and ``max_length`` (default: the
    checkpoint's) apply to trained predictors only; see :class:`~headway.serve.GatewayConfig`.
    """
    predictor = predictor_spec(spec)
    if predictor is None:
        if threads is not None or max_length is not None:
            raise ValueError(f"scorer {spec!r}: scorer threads and max length apply only to a trained predictor")
        fn: ScoreFn = resolve_score_fn(spec)
        return fn
    from headway.predict.score import Scorer, ScoringLengthError, default_scorer, scoring_backend

    checkpoint, given = predictor
    try:  # before default_scorer, which may train the predictor first
        kind = scoring_backend(given or "torch")
    except ValueError as exc:
        raise ValueError(f"scorer {spec!r}: {exc}") from None
    threads = threads or default_scorer_threads()
    try:
        if checkpoint is None:
            scorer = default_scorer(kind, threads=threads, max_length=max_length)
        else:
            scorer = Scorer.from_checkpoint(checkpoint, kind, threads=threads, max_length=max_length)
    except ScoringLengthError as exc:
        raise ValueError(f"scorer_max_length (--scorer-max-length): {exc}") from None
    return cast(ScoreFn, scorer.score)


class BatchScorer:
    """Collects prompts for up to ``max_wait_s`` or ``batch_size`` and scores them in a thread.

    One batch at a time: prompts that arrive while a batch is being scored wait and form the
    next one (up to ``batch_size``) as soon as it is done. Batches scored side by side would
    share the same cores and all finish late; one at a time, the first results come back
    while the rest are still being scored.
    """

    def __init__(self, fn: ScoreFn, batch_size: int = 32, max_wait_s: float = 0.002) -> None:
        self._fn = fn
        self._batch_size = batch_size
        self._max_wait_s = max_wait_s
        self._pending: list[tuple[str, asyncio.Future[float]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self.num_batches = 0

    async def score(self, prompt: str) -> float:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self._pending.append((prompt, fut))
        if not self._busy:
            if len(self._pending) >= self._batch_size:
                self._flush()
            elif self._timer is None:
                self._timer = loop.call_later(self._max_wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy or not self._pending:
            return
        batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
        self._busy = True
        self.num_batches += 1
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[str, asyncio.Future[float]]]) -> None:
        try:
            await self._score(batch)
        finally:
            self._busy = False
            self._flush()  # what arrived meanwhile

    async def _score(self, batch: list[tuple[str, asyncio.Future[float]]]) -> None:
        t0 = time.perf_counter()
        try:
            scores, cpu_s = await asyncio.to_thread(_timed, self._fn, [p for p, _ in batch])
            if len(scores) != len(batch):
                raise ValueError(f"scorer returned {len(scores)} scores for {len(batch)} prompts")
        except Exception as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        log.debug("scored %d prompts in %.1f ms, %.1f ms on the scoring thread's CPU (%d waiting)", len(batch),
                  (time.perf_counter() - t0) * 1e3, cpu_s * 1e3, len(self._pending))  # fmt: skip
        for (_, fut), s in zip(batch, scores, strict=True):
            if not fut.done():
                fut.set_result(float(s))


def _timed(fn: ScoreFn, prompts: list[str]) -> tuple[Sequence[float], float]:
    """``fn(prompts)`` and the CPU time this thread spent in it: far below the wall time, the
    thread waited (for a CPU, the GIL or the backend's other threads), not computed."""
    c0 = time.thread_time()
    return fn(prompts), time.thread_time() - c0
