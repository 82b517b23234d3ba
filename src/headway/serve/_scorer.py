"""Batch prompt scoring off the event loop (for learned-length policies such as ``pars``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, cast

from headway.predict._load import load_predictor
from headway.predict._resolve import predictor_spec, resolve_score_fn

__all__ = [
    "BatchScorer",
    "OnlineScoring",
    "ProcessScoreFn",
    "TextScoreFn",
    "default_scorer_threads",
    "load_score_fn",
]

log = logging.getLogger("headway.serve.scorer")

TextScoreFn = Callable[[list[str]], Sequence[float]]
"""Scores a batch of prompts (higher = longer expected output)."""


def default_scorer_threads() -> int:
    """2, or 1 when this process may run on only one CPU (``os.sched_getaffinity``) that a
    local vLLM does not get (:func:`headway.integrations._server.engine_cpus`:
    ``HEADWAY_VLLM_CPUS``, by default all CPUs but the last on a machine with 2-4). A second
    thread on a busy CPU makes every batch wait for the slower of the two, and on the engine's
    CPU it also slows the engine (on this project's 2-core VM: the gateway's measurement notes,
    ``git show 403bc55:benchmarks/results/gateway.md``)."""
    from headway.integrations._server import engine_cpus

    try:
        cpus = set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = set(range(os.cpu_count() or 1))
    try:
        engine = engine_cpus() or set()
    except ValueError as exc:  # a malformed HEADWAY_VLLM_CPUS: counted as no local engine
        log.warning("%s; scorer threads are chosen as if no local vLLM had CPUs of its own", exc)
        engine = set()
    return max(1, min(2, len(cpus - engine) or len(cpus)))


def load_score_fn(spec: str, *, threads: int | None = None, max_length: int | None = None) -> TextScoreFn:
    """Resolve a scorer spec to ``list[str] -> scores``: ``"pkg.module:attr"`` or
    ``"pkg.module:factory()"`` (see :func:`headway.predict._resolve.resolve_score_fn`), or a
    trained predictor (:func:`predictor_spec`): ``"default"`` for the ``pars`` predictor
    (``headway.predict.score:default_scorer()``: the cached trained one, else the shipped one) or ``"DIR"`` for the
    checkpoint in directory DIR, each optionally followed by ``":BACKEND"`` (``torch``,
    ``onnx`` or ``onnx-int8``).

    ``threads`` (default :func:`default_scorer_threads`) and ``max_length`` (default: the
    checkpoint's) apply to trained predictors only; see :class:`~headway.serve.GatewayConfig`.
    """
    predictor = predictor_spec(spec)
    if predictor is None:
        if threads is not None or max_length is not None:
            raise ValueError(f"scorer {spec!r}: scorer threads and max length apply only to a trained predictor")
        fn: TextScoreFn = resolve_score_fn(spec)
        return fn
    from headway.predict.score import ScoringLengthError

    try:
        scorer = load_predictor(spec, threads=threads or default_scorer_threads(), max_length=max_length)
    except ScoringLengthError as exc:
        raise ValueError(f"scorer_max_length (--scorer-max-length): {exc}") from None
    return cast(TextScoreFn, scorer.score)


class ProcessScoreFn:
    """A :data:`TextScoreFn` that scores in a worker process: ``load_score_fn(spec, ...)`` runs there.

    Why: scoring in a thread of the gateway's process shares the GIL with the event loop. The
    scorer holds it between its model's runs (tokenizing, padding, collecting scores), so while
    the loop is busy (receiving a burst, relaying tokens) every batch also waits for the GIL.
    The worker has its own interpreter; the calling thread only waits on a pipe. Measured:
    ``docs/results/scorer-gil.md``.

    The worker logs as the gateway does (the root logger's level and text or JSON lines, as
    :func:`~headway.serve._logging.setup_logging` set them here when the worker starts), so what
    loading says (an int8 graph built once, say) shows in the gateway's log. It loads the model
    before the constructor returns (its errors are raised here, as :func:`load_score_fn` would
    raise them). If it dies, the batch in progress fails with a
    :class:`RuntimeError` naming its exit code and the next call starts a new one. It ignores
    SIGINT and SIGTERM (the gateway decides when scoring ends: :meth:`close`) and exits when
    the gateway's end of the pipe closes, so it cannot outlive the gateway.
    """

    def __init__(self, spec: str, *, threads: int | None = None, max_length: int | None = None) -> None:
        self._args = (spec, threads, max_length)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads and an event loop
        ours, theirs = ctx.Pipe()
        args = (theirs, *self._args, _logging_setup())
        proc = ctx.Process(target=_score_worker, args=args, name="headway-scorer", daemon=True)
        proc.start()
        theirs.close()
        try:
            while not ours.poll(0.5):
                if not proc.is_alive():
                    raise RuntimeError(f"the scorer process exited with code {proc.exitcode} while loading")
            kind, value = ours.recv()
        except BaseException:
            ours.close()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
            raise
        if kind != "ready":
            ours.close()
            proc.join(5)
            raise ValueError(str(value))
        self._proc, self._conn = proc, ours

    @property
    def pid(self) -> int | None:
        """The worker's process id (None once closed)."""
        return None if self._proc is None else int(self._proc.pid)

    def __call__(self, prompts: list[str]) -> Sequence[float]:
        return self.timed(prompts)[0]

    def timed(self, prompts: list[str]) -> tuple[Sequence[float], float]:
        """Scores and the CPU time the worker's scoring thread spent on them."""
        with self._lock:
            if self._conn is None:
                log.warning("restarting the scorer process")
                self._start()
            conn = self._conn
            assert conn is not None
            try:
                conn.send(prompts)
                kind, value, cpu_s = conn.recv()
            except (EOFError, OSError):
                code = self._stop(timeout=1.0)
                raise RuntimeError(f"the scorer process exited with code {code} while scoring") from None
        if kind != "ok":
            raise RuntimeError(f"scorer process: {value}")
        return cast(list[float], value), float(cpu_s)

    def _stop(self, timeout: float) -> int | None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(None)
            conn.close()
        if proc is None:
            return None
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
        return cast(int | None, proc.exitcode)

    def close(self) -> None:
        """Stop the worker (it finishes the batch in progress first, up to 5 s)."""
        with self._lock:
            self._stop(timeout=5.0)


def _logging_setup() -> tuple[str, str] | None:
    """This process's logging as :func:`~headway.serve._logging.setup_logging` arguments (level,
    ``"text"`` or ``"json"``), for a worker to log alike; None when the root logger has no handler
    (logging not set up: the worker leaves its own alone too)."""
    from headway.serve._logging import JsonFormatter

    root = logging.getLogger()
    if not root.handlers:
        return None
    fmt = "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
    return logging.getLevelName(root.level), fmt


def _score_worker(
    conn: Connection, spec: str, threads: int | None, max_length: int | None, logs: tuple[str, str] | None = None
) -> None:
    """The worker of :class:`ProcessScoreFn`: set up logging as ``logs`` says
    (:func:`_logging_setup`), load, say ``ready`` (or the error), then score every list of
    prompts received until ``None`` or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if logs is not None:
        from headway.serve._logging import setup_logging

        setup_logging(*logs)
    try:
        fn = load_score_fn(spec, threads=threads, max_length=max_length)
    except Exception as exc:
        conn.send(("error", str(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            prompts = conn.recv()
        except (EOFError, OSError):
            return
        if prompts is None:
            return
        try:
            scores, cpu_s = _timed(fn, prompts)
            conn.send(("ok", [float(x) for x in scores], cpu_s))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}", 0.0))


class BatchScorer:
    """Collects prompts for up to ``max_wait_s`` or ``batch_size`` and scores them in a thread.

    One batch at a time: prompts that arrive while a batch is being scored wait and form the
    next one (up to ``batch_size``) as soon as it is done. Batches scored side by side would
    share the same cores and all finish late; one at a time, the first results come back
    while the rest are still being scored.

    A batch that fails is scored again prompt by prompt, so that a prompt the scorer cannot
    handle fails alone, not its batch mates (another tenant's requests, say).
    """

    def __init__(self, fn: TextScoreFn, batch_size: int = 32, max_wait_s: float = 0.002) -> None:
        self._fn = fn
        self._batch_size = batch_size
        self._max_wait_s = max_wait_s
        self._pending: list[tuple[str, asyncio.Future[float]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self.num_batches = 0
        self.num_batch_failures = 0
        """Batches that failed as a whole and were scored prompt by prompt."""

    def close(self) -> None:
        """Stop the scorer's worker process, if it has one (:class:`ProcessScoreFn`)."""
        if isinstance(self._fn, ProcessScoreFn):
            self._fn.close()

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
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                return
            # one prompt may have failed them all: score each alone, so only it fails
            log.warning("a batch of %d prompts failed to score (%s: %s); scoring each alone", len(batch),
                        type(exc).__name__, exc)  # fmt: skip
            self.num_batch_failures += 1
            for item in batch:
                await self._score([item])
            return
        log.debug("scored %d prompts in %.1f ms, %.1f ms on the scoring thread's CPU (%d waiting)", len(batch),
                  (time.perf_counter() - t0) * 1e3, cpu_s * 1e3, len(self._pending))  # fmt: skip
        for (_, fut), s in zip(batch, scores, strict=True):
            if not fut.done():
                fut.set_result(float(s))


def _timed(fn: TextScoreFn, prompts: list[str]) -> tuple[Sequence[float], float]:
    """``fn(prompts)`` and the CPU time this thread (or a :class:`ProcessScoreFn`'s worker
    thread) spent in it: far below the wall time, the thread waited (for a CPU, the GIL or the
    backend's other threads), not computed."""
    if isinstance(fn, ProcessScoreFn):
        return fn.timed(prompts)
    c0 = time.thread_time()
    return fn(prompts), time.thread_time() - c0


class OnlineScoring:
    """The gateway's online learning (:attr:`GatewayConfig.online_learning`): an
    :class:`~headway.predict.OnlineLearner` around the scorer's predictor, fed by :meth:`observe`,
    and one :class:`BatchScorer` per model with a head of its own (:meth:`scorer_for`); requests
    of the other models share :attr:`default`, which scores as the predictor does.

    With ``redis_url`` the windows live in Redis (``{redis_prefix}online:{model}``), shared by the
    replicas; the learner's thread reaches it with a blocking client of its own. Without it,
    ``online_state`` names the file they are saved to and resumed from."""

    def __init__(self, config: Any) -> None:
        from headway.predict.online import ObservationStore, OnlineLearner, RedisStore

        threads = config.scorer_threads or default_scorer_threads()
        predictor = load_predictor(config.scorer, threads=threads, max_length=config.scorer_max_length)
        store: ObservationStore | None = None
        self._redis: Any = None
        if config.redis_url:
            import redis

            self._redis = redis.Redis.from_url(config.redis_url)
            store = RedisStore(self._redis, f"{config.redis_prefix}online")
        self.learner = OnlineLearner.around(predictor, store=store, state_path=config.online_state or None)
        if config.online_state:
            log.info("%s", self.learner.resumed_line(config.online_state))
        self._batching = (config.scorer_batch_size, config.scorer_max_wait_s)
        self.default = BatchScorer(self._score_fn(None), *self._batching)
        self._models: dict[str, BatchScorer] = {}

    def scorer_for(self, model: str | None) -> BatchScorer:
        """The batch scorer of ``model``'s requests: its own once the learner has a head for it
        (so at most one per model that finished requests), else :attr:`default`."""
        if not model or not self.learner.fitted(model):
            return self.default
        scorer = self._models.get(model)
        if scorer is None:
            scorer = self._models[model] = BatchScorer(self._score_fn(model), *self._batching)
        return scorer

    def _score_fn(self, model: str | None) -> TextScoreFn:
        learner = self.learner

        def fn(prompts: list[str]) -> Sequence[float]:
            return cast(Sequence[float], learner.score(prompts, model))

        return fn

    def observe(self, prompt: str | None, output_tokens: int, model: str | None) -> None:
        """A finished request: queued for the learner's thread (dropped when its queue is full)."""
        if prompt and output_tokens >= 1:
            self.learner.observe(prompt, output_tokens, model)

    def close(self) -> None:
        self.learner.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()
