"""Scoring the plugin's requests: a client's own ``headway_score``, and the ``scorer`` on each
prompt's start, on the engine's thread as a step starts or on a thread of its own (``scoring``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from headway.core import Request
from headway.integrations.vllm._background import BackgroundScorer
from headway.integrations.vllm._scorers import TextScoreFn
from headway.predict.score import MAX_CHARS_PER_TOKEN, scoring_text

if TYPE_CHECKING:
    from headway.integrations.vllm._queue import HeadwayRequestQueue

__all__ = ["SCORED_CHARS", "SCORED_TOKENS", "PromptScoring"]

SCORED_TOKENS = 512
"""The scorer reads at most this many tokens' worth of a prompt (``SCORED_CHARS`` characters, its
start, as :func:`~headway.predict.score.scoring_text` cuts it; the gateway's default): a predictor
tokenizes the whole text before truncating it, so a megabyte prompt stalled every request's steps
for over a second when the scorer ran on the engine thread."""
SCORED_CHARS = SCORED_TOKENS * MAX_CHARS_PER_TOKEN


class PromptScoring:
    """The scoring half of :class:`~headway.integrations.vllm.PolicyAdapter` (which sets every
    attribute below)."""

    score_batch: TextScoreFn | None
    decode: Callable[[list[Any]], list[str]] | None
    engine: dict[Request, Any]
    background: bool
    score_time: float
    """Seconds the engine's thread spent scoring (inline scoring), cumulative."""
    num_scored: int
    num_score_failures: int
    _pending: dict[Request, HeadwayRequestQueue]
    _scorer: BackgroundScorer | None
    _scoring: dict[Request, HeadwayRequestQueue]
    _warn_once: Callable[..., None]

    def _score_inline(self, pending: Iterable[Request]) -> None:
        """Inline scoring: score the requests of ``pending`` that have no score, on this thread."""
        todo = [h for h in pending if h.score is None]
        if todo:
            s0 = time.perf_counter()
            scores = self._score(todo)
            if scores is not None:
                for h, s in zip(todo, scores, strict=True):
                    h.score = s if math.isfinite(s) else None  # none: the missing-score path
                self.num_scored += sum(h.score is not None for h in todo)
            self.score_time += time.perf_counter() - s0

    def _score_later(self, h: Request, queue: HeadwayRequestQueue) -> None:
        """Background scoring: hand a new request without a score to the scorer's thread; it joins
        ``_pending`` when its score is in (:meth:`_take_scores`)."""
        if self._scorer is None:
            self._scorer = BackgroundScorer(self._score)
        self._scoring[h] = queue
        self._scorer.submit(h)

    def _take_scores(self) -> None:
        """Background scoring: the requests whose scores came in join ``_pending``."""
        assert self._scorer is not None
        scoring, pending = self._scoring, self._pending
        for h, s in self._scorer.take():
            q = scoring.pop(h, None)
            if q is not None:  # (else aborted while it was scored)
                h.score = s
                self.num_scored += s is not None
                pending[h] = q

    def forget_pending(self, h: Request) -> None:
        """``h`` left the engine or its queue (aborted); if it was not announced yet, its queue no longer
        counts it."""
        q = self._pending.pop(h, None)
        if q is None:  # (not `or`: a queue's truth value is whether it has a request to offer)
            q = self._scoring.pop(h, None)
        if q is not None:
            q._npending -= 1

    def close(self) -> None:
        """Stop the background scorer's thread, if any."""
        if self._scorer is not None:
            self._scorer.close()

    def _request_score(self, e: Any, value: Any) -> float | None:
        """A client's ``headway_score``: a finite number, else ignored (the request is scored as one
        without): a request's own fields must never stop the engine."""
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        self._warn_once(
            "bad_score", "headway: request %s: headway_score %r is not a finite number; ignored", e.request_id, value
        )
        return None

    def _score(self, todo: Sequence[Request]) -> list[float] | None:
        """The scorer's scores for ``todo``'s prompts (NaN where a prompt failed), or None when the
        batch failed as a whole. A failed batch (an exception, a wrong count, a score that is no
        number) is retried one prompt at a time, so that only the prompts the scorer fails on take
        the missing-score path (with a warning), not the requests that arrived beside them: one
        client's prompt must not cost the others their scores. Raising here stopped vLLM's engine
        core, and with it every request in flight, over a prompt the scorer could not take."""
        try:
            return self._score_batch(todo)
        except Exception as exc:
            if len(todo) == 1:
                self._score_failed(1, exc)
                return None
        scores: list[float] = []
        failed = 0
        for h in todo:
            try:
                scores.extend(self._score_batch([h]))
            except Exception as exc:
                failed += 1
                last = exc
                scores.append(math.nan)
        if failed:
            self._score_failed(failed, last)
        return scores

    def _score_batch(self, hs: Sequence[Request]) -> list[float]:
        """The scorer's scores of ``hs``' prompt texts; NaN (the missing-score path) for a request
        without one, which the scorer never sees."""
        assert self.score_batch is not None
        texts = self._prompt_texts(hs)
        have = [i for i, t in enumerate(texts) if t is not None]
        scores = [math.nan] * len(hs)
        if have:
            got = [float(s) for s in self.score_batch([texts[i] or " " for i in have])]
            if len(got) != len(have):
                raise ValueError(f"{len(got)} scores for {len(have)} prompts")
            for i, s in zip(have, got, strict=True):
                scores[i] = s
        return scores

    def _score_failed(self, n: int, exc: Exception) -> None:
        self.num_score_failures += n
        self._warn_once(
            "score_failed",
            "headway: the scorer failed on %d prompt(s) (%s: %s); they get the missing score, as "
            "requests without a score do",
            n,
            type(exc).__name__,
            exc,
        )

    def _prompt_texts(self, hs: Sequence[Request]) -> list[str | None]:
        """Prompt texts for the scorer: the engine's text if it kept it, else its token ids
        detokenized (one batch call); each cut to its first ``SCORED_CHARS`` characters (lone
        surrogates replaced), kept as the request's ``prompt``. None for a request with neither (a
        ``prompt_embeds`` request, whose engine request has no token ids; or one aborted meanwhile):
        nothing of its prompt can be read, so it takes the missing-score path. (It was scored as a
        blank prompt, which the shipped predictor scores -2.85, below 88 % of alpaca_eval's 805
        instructions, whose median is -0.81.) A blank text (an empty chat message) is scored as such, as the
        gateway and the simulator score it."""
        engine = self.engine
        need: list[tuple[Request, Any]] = []
        for h in hs:
            if h.prompt is None:
                e = engine.get(h)  # (none: aborted while the scorer's thread had it)
                text, ids = getattr(e, "prompt", None), getattr(e, "prompt_token_ids", None)
                if isinstance(text, str):
                    h.prompt = scoring_text(text, SCORED_TOKENS)
                elif ids is not None and self.decode is not None:
                    need.append((h, ids))
        if need:
            assert self.decode is not None
            for (h, _), text in zip(need, self.decode([ids for _, ids in need]), strict=True):
                h.prompt = scoring_text(str(text), SCORED_TOKENS)
        return [h.prompt for h in hs]
