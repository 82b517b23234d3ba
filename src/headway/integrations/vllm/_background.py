"""Scoring off vLLM's engine thread: the plugin's ``scoring: "background"`` setting."""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence

from headway.core import Request

__all__ = ["BackgroundScorer"]

logger = logging.getLogger("headway.integrations.vllm")


class BackgroundScorer:
    """Scores requests on a thread of its own, one batch (up to ``batch_size``) at a time, as the
    gateway's scorer does: prompts that arrive while a batch is scored form the next one.

    ``score(requests)`` gives each request's score (NaN where its prompt failed) or None when the
    batch failed as a whole (:meth:`PolicyAdapter._score`, which logs failures). The engine thread
    :meth:`submit`\\ s new requests and :meth:`take`\\ s the scores that came in; a request whose score
    is still being computed waits outside the queue vLLM schedules from, while the engine's steps go
    on (vLLM's engine loop keeps stepping while its waiting queue has a length: it yields the GIL
    for a millisecond after each step that ran no model). Every submitted request comes back from
    :meth:`take`, with a score or with None (the missing-score path), even if the scorer raises
    something :meth:`PolicyAdapter._score` does not catch: a request never waits for good."""

    def __init__(
        self, score: Callable[[Sequence[Request]], list[float] | None], *, batch_size: int = 32, name: str = "scorer"
    ) -> None:
        self._score = score
        self._batch_size = batch_size
        self._todo: deque[Request] = deque()
        self._done: deque[tuple[Request, float | None]] = deque()  # appended by the thread, taken by the engine's
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"headway-{name}", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        with self._wake:
            self._todo.append(request)
            self._wake.notify()

    def take(self) -> list[tuple[Request, float | None]]:
        """The requests scored since the last call, each with its score (None: none could be had)."""
        done = self._done
        out = []
        while done:
            out.append(done.popleft())
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after the batch it is scoring, if any (requests still queued are dropped:
        the engine is shutting down)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        todo = self._todo
        while True:
            with self._wake:
                while not todo and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                batch = [todo.popleft() for _ in range(min(len(todo), self._batch_size))]
            try:
                scores: Sequence[float | None] | None = self._score(batch)
            except Exception:  # (a bug, not the scorer: _score catches the scorer's own failures)
                logger.exception("headway: background scoring failed; %d request(s) get the missing score", len(batch))
                scores = None
            if scores is None or len(scores) != len(batch):
                scores = [None] * len(batch)
            for h, s in zip(batch, scores, strict=True):
                self._done.append((h, s if s is not None and math.isfinite(s) else None))
