"""How an arriving request gets its length score and reaches the policy (gateway with a scorer).

Two paths, chosen when the request has been admitted (``Dispatcher.admit``):

- **Scored first** (the usual one): the request is scored (batched by :class:`BatchScorer`),
  counted meanwhile in ``Dispatcher.scoring``, then queued, where the policy orders it.
- **Fast path** (``GatewayConfig.scorer_fast_path``, on by default, in-memory mode only): a
  request that no policy order could put behind another is dispatched at once and scored in the
  background. The gateway first counts it in ``Dispatcher.arriving`` and yields to the event
  loop once, so that requests that arrived together (in the same turn of the loop) see each
  other; then :meth:`~headway.serve._dispatch.Dispatcher.dispatch_unscored` takes it when
  nothing is queued and the backends have more free slots than the requests that will compete
  for them (being scored, or arriving with it). Every competitor then gets a slot whatever the
  order, so the fast path never changes which request goes first when there is contention;
  what it does change is that a request arriving *after* it cannot overtake it, as with any
  request already dispatched.

A request dispatched before its score is known is not yet known to the policy either: its
``on_arrival`` comes when the score lands, followed by the progress and finish that happened
meanwhile (:meth:`Arrivals.on_progress`, :meth:`Arrivals.on_finish` hold them back until then),
so a policy always sees arrival, progress, finish in that order and with the request's score.
A retry that queues it again waits for that first (:meth:`Arrivals.told`). A request aborted
before its score landed is never reported to the policy, like one refused before queueing.

A completions prompt of token ids is decoded into text first, off the event loop, when the gateway
has a tokenizer (``--tokenizer``; counted in ``Dispatcher.scoring`` meanwhile, as it is while scored).

Fallback score (a token-id prompt without a tokenizer, or whose ids it could not decode, or a prompt
the scorer failed on): the mean of the scores given so far, 0.0 before the first; the policy then
places it among the others as a typical request, and it is never answered 500 for want of a
score. Counted in :attr:`Arrivals.num_score_fallbacks` and ``headway_score_fallbacks{reason}``
(``no_text``, ``scorer_error``: it failed, or gave a score that is not a finite number).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from headway.core import Policy, Request, RequestState
from headway.serve._config import GatewayConfig
from headway.serve._dispatch import Backend, Dispatcher
from headway.serve._logging import LimitedWarnings
from headway.serve._metrics import GatewayMetrics
from headway.serve._scorer import BatchScorer, OnlineScoring, ProcessScoreFn, load_score_fn

__all__ = ["Arrivals"]

log = logging.getLogger("headway.serve")


@dataclass(slots=True)
class _Unscored:
    """A request dispatched before its score: what the policy has not been told yet."""

    task: asyncio.Future[None]
    progress: int = 0
    finished: bool = False


class Arrivals:
    """The gateway's scorer (none without ``config.scorer``), the fallback score and the fast path."""

    def __init__(
        self,
        config: GatewayConfig,
        dispatcher: Dispatcher,
        policy: Policy,
        metrics: GatewayMetrics,
        warn: LimitedWarnings,
    ) -> None:
        self.dispatcher = dispatcher
        self.policy = policy
        self.metrics = metrics
        self._warn = warn
        self.scorer: BatchScorer | None = None
        self.online: OnlineScoring | None = None
        if config.online_learning:
            self.online = OnlineScoring(config)
            self.scorer = self.online.default
        elif config.scorer:
            load = ProcessScoreFn if config.scorer_process else load_score_fn
            fn = load(config.scorer, threads=config.scorer_threads, max_length=config.scorer_max_length)
            self.scorer = BatchScorer(fn, config.scorer_batch_size, config.scorer_max_wait_s)
        self.fast_path = self.scorer is not None and config.scorer_fast_path and not config.redis_url
        self._score_sum = 0.0
        self._score_n = 0
        self.num_score_fallbacks = 0
        """Requests given the fallback score (see the module's docstring)."""
        self._unscored: dict[Request, _Unscored] = {}

    async def arrive(self, req: Request, token_text: Callable[[], str | None] | None = None) -> Backend | None:
        """After admission: the backend ``req`` was dispatched to at once (fast path; it is
        scored in the background), or None once it has its score and is to be queued (also
        without a scorer). ``token_text``: the text of a prompt of token ids, which ``req`` has
        none of yet (:meth:`~headway.serve._intake.Intake.token_text`), called in a thread."""
        if self.scorer is None:
            return None
        if req.prompt is None and token_text is not None:
            await self._decode(req, token_text)
        if self.fast_path and req.prompt is not None:
            d = self.dispatcher
            d.arriving += 1
            try:
                await asyncio.sleep(0)  # requests that arrived together are counted in d.arriving
            finally:
                d.arriving -= 1
            backend = d.dispatch_unscored(req)
            if backend is not None:
                self.metrics.unscored_dispatches.inc()
                self._unscored[req] = _Unscored(asyncio.ensure_future(self._score_late(req, req.prompt)))
                return backend
        await self.score(req)
        return None

    async def _decode(self, req: Request, token_text: Callable[[], str | None]) -> None:
        """``req.prompt`` from its token ids, in a thread (counted in ``Dispatcher.scoring``
        meanwhile); left None (the fallback score) when they cannot be decoded (ids past 32 bits)."""
        d = self.dispatcher
        d.scoring += 1
        try:
            req.prompt = await asyncio.to_thread(token_text)
        except Exception as exc:
            self._warn("decode", "request %s: its token ids could not be decoded (%s: %s); it gets the fallback "
                       "score", req.request_id, type(exc).__name__, exc)  # fmt: skip
        except BaseException:  # cancelled: as in score()
            d.scoring -= 1
            d.dispatch()
            raise
        d.scoring -= 1

    async def score(self, req: Request, prompt: str | None = None, *, counted: bool = True) -> None:
        """Give ``req`` its score (of ``prompt``, default its own): the scorer's, or the fallback.
        ``counted``: it is queued next, and counted in ``Dispatcher.scoring`` until then."""
        scorer = self.scorer
        if self.online is not None:  # the model's own head once it has one
            scorer = self.online.scorer_for(str(req.extra.get("model") or "") or None)
        assert scorer is not None
        prompt = req.prompt if prompt is None else prompt
        why = "no_text"  # (a prompt of token ids without a tokenizer: nothing to read; a blank text is scored)
        if prompt is not None:
            why = "scorer_error"
            d = self.dispatcher
            if counted:
                d.scoring += 1  # free backends may wait for it (Dispatcher._holding)
            t0 = time.perf_counter()
            try:
                req.score = await scorer.score(prompt)
                self.metrics.score_wait.observe(time.perf_counter() - t0)
            except Exception as exc:
                self._warn("score", "request %s could not be scored (%s: %s); it gets the fallback score",
                           req.request_id, type(exc).__name__, exc)  # fmt: skip
            except BaseException:  # cancelled: it goes no further, and a hold may end without it
                if counted:
                    d.scoring -= 1
                    d.dispatch()
                raise
            if counted:
                d.scoring -= 1  # queued next, before any await
        if req.score is not None and math.isfinite(req.score):
            self._score_sum += req.score
            self._score_n += 1
        else:
            req.score = self._score_sum / self._score_n if self._score_n else 0.0
            self.num_score_fallbacks += 1
            self.metrics.score_fallbacks.labels(why).inc()

    async def _score_late(self, req: Request, prompt: str) -> None:
        """Score a request dispatched on the fast path, then tell the policy of its arrival and of
        what it did meanwhile."""
        try:
            await self.score(req, prompt, counted=False)
        finally:
            held = self._unscored.pop(req)
        if req.state is RequestState.ABORTED:
            return  # ended before the policy knew of it: it never will (it was never queued)
        now = self.dispatcher.now()
        policy = self.policy
        try:
            policy.on_arrival(req, now)
            if held.progress:
                policy.on_progress(req, now, held.progress)
            if held.finished:
                policy.on_finish(req, now)
                self.dispatcher.sync_keys()
        except Exception as exc:  # it was served already: nothing to answer
            log.warning("policy %s failed on request %s, dispatched before its score: %s: %s", policy.name,
                        req.request_id, type(exc).__name__, exc)  # fmt: skip

    async def told(self, req: Request) -> None:
        """Return once the policy knows of ``req`` (at once unless it was dispatched before its
        score, which is still being computed): before it is queued again."""
        held = self._unscored.get(req)
        if held is not None:
            await asyncio.shield(held.task)

    def on_progress(self, req: Request, now: float, tokens: int) -> None:
        """``policy.on_progress``, or held back until the policy knows of ``req``."""
        held = self._unscored.get(req) if self._unscored else None
        if held is None:
            self.policy.on_progress(req, now, tokens)
        else:
            held.progress += tokens

    def on_finish(self, req: Request, now: float) -> None:
        """``policy.on_finish``, or held back until the policy knows of ``req``."""
        held = self._unscored.get(req) if self._unscored else None
        if held is not None:
            held.finished = True
            return
        self.policy.on_finish(req, now)
        self.dispatcher.sync_keys()  # what the policy learned may have changed every queued key

    async def close(self) -> None:
        """Stop the background scoring and the scorer (and the online learner)."""
        for held in list(self._unscored.values()):
            held.task.cancel()
            with contextlib.suppress(BaseException):
                await held.task
        if self.scorer is not None:
            await asyncio.to_thread(self.scorer.close)
        if self.online is not None:
            await asyncio.to_thread(self.online.close)
