"""Serving an admitted request: queue it (unless the fast path dispatched it), forward it to its
backend, retry it after a failure before anything reached the client, pass the response through
(SSE event by event), and end it: finished (the policy told), or the answer that stops it.

The rules (which failures are retried, marked down, answered 502, 503 or 408) are the gateway's,
described in :mod:`headway.serve._gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response, StreamingResponse

from headway.core import Request, RequestState
from headway.serve._arrivals import Arrivals
from headway.serve._config import GatewayConfig
from headway.serve._dispatch import Backend, Dispatcher, QueueFullError
from headway.serve._errors import api_error, sse_error
from headway.serve._ledger import Ledger
from headway.serve._logging import FailureLog, LimitedWarnings
from headway.serve._metrics import GatewayMetrics
from headway.serve._redis_queue import RedisDispatcher
from headway.serve._upstream import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
)
from headway.serve._watch import STOP_EVENTS, STOP_REASONS, Watch, chain, either
from headway.serve._wire import (
    ANSWERED_STATUSES,
    Parsed,
    admission_rejection,
    completion_tokens,
    engine_dead,
    error_text,
    server_error_event,
    sse_data,
    sse_newlines,
)

__all__ = ["Exchange"]

log = logging.getLogger("headway.serve")

_SERVED_MODEL = "headway.served_model"
"""``Request.extra``: the model the backend's answer named, for a request that named none."""


class Exchange:
    """Queues, forwards, retries and ends admitted requests (one gateway's)."""

    def __init__(
        self,
        config: GatewayConfig,
        dispatcher: Dispatcher,
        pools: list[UpstreamPool],
        metrics: GatewayMetrics,
        ledger: Ledger,
        arrivals: Arrivals,
        warn: LimitedWarnings,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.pools = pools
        self.metrics = metrics
        self.ledger = ledger
        self.arrivals = arrivals
        self._log_limited = warn
        self.failures = FailureLog(log)
        """Failed requests in the log: the first of each kind (backend, how) in full, then counts."""
        self.full = FailureLog(log, level=logging.INFO, what=("503 of a full backend", "503s of full backends"))
        """Requests sent back to the queue by a full backend (not failures: INFO), logged as failures are."""

    async def serve(
        self,
        req: Request,
        path: str,
        payload: bytes,
        parsed: Parsed,
        watch: Watch,
        arrived: float,
        granted: Backend | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Queue ``req`` (unless ``granted`` a backend already: the fast path), forward it (with the
        request ``headers``: the gateway's ``X-Forwarded-*``), and queue it again after a retryable
        failure."""
        loop = asyncio.get_running_loop()
        deadline = arrived + self.config.queue_ttl_s
        exclude = self.dispatcher.not_serving(req.extra.get("model"))  # backends listing other models
        last_error = ""
        same: str | None = ""  # the failure every try ended with so far ("" before any, None once two differ)
        handed_off = False
        attempts = 0
        try:
            while True:
                if granted is None:
                    got = await self._queued(req, exclude, watch, deadline)
                    if got is None:
                        continue  # the queue store was unavailable for a while: queue it again
                    if isinstance(got, Response):
                        return got
                    backend = got
                else:  # dispatched at once (the fast path)
                    backend, granted = granted, None
                # ---- upstream
                last = attempts + 1 >= self.config.max_attempts or self.dispatcher.all_backends_excluded(
                    exclude | {backend.index}
                )
                outcome = await self.forward(req, backend, path, payload, parsed, watch, headers, same, last)
                if isinstance(outcome, Response):
                    handed_off = True  # forward released the backend / owns the stream now
                    return outcome
                # retryable failure before anything was sent to the client
                message, kind = outcome
                last_error = message  # the client is not told which backend (the log is)
                self.dispatcher.release(backend, req)
                if watch.stop.done():
                    self.ledger.abort(req)
                    return self.stopped(watch, req)
                req.transition(RequestState.PREEMPTED)
                req.num_preemptions += 1
                if kind == "busy":
                    # not a failure: back to the queue, in order, until that backend or another has
                    # room; not an attempt (the queue TTL bounds the wait)
                    self.full(
                        f"{backend.label}: full", "request %s: %s is full (%s)", req.request_id, backend.label, message
                    )
                    self.dispatcher.mark_full(backend, float(max(self.config.retry_after_s, 1)))
                    self.metrics.retries.labels(backend.label).inc()
                    continue
                self.failures(
                    f"{backend.label}: {kind}", "request %s failed on %s (%s)", req.request_id, backend.label, message
                )
                reached = kind != "refused"  # a refused connection reached no backend
                if reached:
                    attempts += 1  # so a request that crashes every backend it meets ends
                    same = message if same in ("", message) else None
                waits = kind != "failed" and self.config.backend_down_s > 0 and loop.time() < deadline
                if waits and attempts < self.config.max_attempts:
                    # the backend is down or went away (marked down for backend_down_s): wait in
                    # the queue, in order, for it or another one
                    self.metrics.retries.labels(backend.label).inc()
                    continue
                if not reached:
                    attempts += 1
                exclude = exclude | {backend.index}
                if attempts >= self.config.max_attempts or self.dispatcher.all_backends_excluded(exclude):
                    break
                self.metrics.retries.labels(backend.label).inc()
            self.ledger.abort(req)
            return self.metrics.reject(
                "backend_error",
                api_error("upstream_error", detail=f"no backend could serve the request (last error: {last_error})"),
                req,
            )
        except asyncio.CancelledError:
            if self.dispatcher.cancel(req):
                self._left_queue(req)
                self.ledger.abort(req)
            raise
        finally:
            if not handed_off:
                watch.close()

    async def _queued(
        self, req: Request, exclude: frozenset[int], watch: Watch, deadline: float
    ) -> Backend | Response | None:
        """Queue ``req`` and wait for its backend: the backend, the answer that ends the request
        (TTL, client gone, queue full, policy error...), or None to queue it again (the queue store
        came back)."""
        loop = asyncio.get_running_loop()
        await self.arrivals.told(req)  # dispatched before its score: the policy knows of it first
        try:
            fut = self.dispatcher.submit(req, exclude)
        except (ValueError, TypeError, LookupError) as exc:  # the policy refused it
            # a ValueError's words are the policy's reason; another error's (a KeyError's bare
            # 'oops') mean little without its type
            why = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
            log.warning("policy %s rejected request %s: %s", self.dispatcher.policy.name, req.request_id, why)
            self.ledger.abort(req)
            return self.metrics.reject(
                "policy_error",
                api_error("policy_error", detail=why),
                req,
            )
        except QueueFullError as exc:
            self.ledger.abort(req)
            return self.queue_full(exc, req)
        remaining = deadline - loop.time()
        if not fut.done():
            await asyncio.wait(
                either(fut, watch.stop),
                timeout=max(remaining, 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
        if not fut.done():
            self.dispatcher.cancel(req)
            fut.cancel()
            self._left_queue(req)
            self.ledger.abort(req)
            if watch.stop.done():
                return self.stopped(watch, req)
            # every backend's last connection attempt failed, or every one serving its model's
            if not self.dispatcher.any_reachable(self.dispatcher.not_serving(req.extra.get("model"))):
                return self.metrics.reject(
                    "no_backend",
                    api_error(
                        "no_backend",
                        headers={"Retry-After": str(self.config.retry_after_s)},
                        seconds=self.config.queue_ttl_s,
                    ),
                    req,
                )
            if isinstance(self.dispatcher, RedisDispatcher) and not self.dispatcher.redis_reachable:
                return self.metrics.reject(
                    "queue_error",
                    api_error("queue_error", headers={"Retry-After": str(self.config.retry_after_s)}),
                    req,
                )
            return self.metrics.reject(
                "ttl",
                api_error("queue_timeout", seconds=self.config.queue_ttl_s),
                req,
            )
        try:
            backend = fut.result()
        except QueueFullError as exc:  # the shared (Redis) queue is full
            self.ledger.abort(req)
            return self.queue_full(exc, req)
        except (ValueError, TypeError, LookupError) as exc:  # the (Redis) queue cannot take its key
            log.warning("policy %s: request %s cannot be queued: %s", self.dispatcher.policy.name, req.request_id, exc)
            self.ledger.abort(req)
            return self.metrics.reject(
                "policy_error",
                api_error("policy_error", detail=exc),
                req,
            )
        except Exception as exc:  # queue store unavailable
            pause = min(float(max(self.config.retry_after_s, 1)), deadline - loop.time())
            if pause > 0:  # wait for it (up to the queue TTL), then queue again
                self._log_limited("queue", "request %s: queue store unavailable (%s); waiting for it",
                                  req.request_id, exc)  # fmt: skip
                await asyncio.wait({watch.stop}, timeout=pause)
                if watch.stop.done():
                    self.ledger.abort(req)
                    return self.stopped(watch, req)
                if loop.time() < deadline:
                    return None  # queue it again
            self._left_queue(req)
            self.ledger.abort(req)
            self._log_limited("queue", "request %s: queue unavailable: %s", req.request_id, exc)
            return self.metrics.reject(
                "queue_error",
                api_error("queue_error", headers={"Retry-After": str(self.config.retry_after_s)}),
                req,
            )
        return backend

    def _left_queue(self, req: Request) -> None:
        """``req`` ends in the queue (TTL, ``no_backend``, cancelled, client gone...): unless a
        dispatch counted it already, its wait until now goes to ``headway_queue_wait_seconds``,
        as its dispatch would have (one observation per request: one dispatched, sent back to the
        queue and ending there was counted at its first dispatch)."""
        if req.first_scheduled_time is None:
            wait = self.dispatcher.now() - req.arrival_time
            self.metrics.wait_time.labels(req.tenant_id, req.tier.name.lower()).observe(wait)

    def queue_full(self, exc: QueueFullError, req: Request) -> Response:
        where = "queue" if exc.scope == "global" else "queue of your tenant"
        return self.metrics.reject(
            "queue_full",
            api_error("queue_full", headers={"Retry-After": str(self.config.retry_after_s)}, where=where),
            req,
        )

    def stopped(self, watch: Watch, req: Request) -> Response:
        reason = watch.reason
        if reason == "cancelled":
            return self.metrics.reject("cancelled", api_error("cancelled"), req)
        if reason == "shutdown":
            return self.metrics.reject(
                "drain_timeout",
                api_error(
                    "drain_timeout",
                    headers={"Retry-After": str(self.config.retry_after_s), "Connection": "close"},
                    seconds=self.config.drain_timeout_s,
                ),
                req,
            )
        return self.metrics.reject("client_disconnected", Response(status_code=499), req)

    async def forward(
        self,
        req: Request,
        backend: Backend,
        path: str,
        payload: bytes,
        parsed: Parsed,
        watch: Watch,
        headers: Mapping[str, str] | None = None,
        repeat: str | None = None,
        last: bool = False,
    ) -> Response | tuple[str, str]:
        """Send to ``backend``. A Response ends the request; ``(message, kind)`` is a retryable
        failure (nothing reached the client): ``kind`` is ``refused`` (no connection: nothing
        reached the backend), ``lost`` (the backend took the request and dropped the connection,
        or ended its stream, before answering anything, or vLLM's engine died), ``busy`` (a 503 of
        vLLM's admission control, or any 503 while other requests of ours run there: full for now)
        or ``failed`` (another 5xx, a stall, a broken exchange). A 500 or 501 (:data:`ANSWERED_STATUSES`)
        whose message is ``repeat`` (every try so far ended so), or the first one on the ``last``
        backend to try, is the request's own failure: it goes to the client as the backend sent it."""
        wait = self.config.headers_timeout_s if parsed.stream else 0.0
        send = asyncio.ensure_future(
            self.pools[backend.index].post(path, payload, headers, headers_timeout=wait or None)
        )
        await asyncio.wait(either(send, watch.stop), return_when=asyncio.FIRST_COMPLETED)
        if not send.done():  # client went away (or cancelled) while we connected
            send.cancel()
            with contextlib.suppress(BaseException):
                await send
            self.dispatcher.release(backend, req)
            self.ledger.abort(req)
            watch.close()
            return self.stopped(watch, req)
        if not isinstance(send.exception(), UpstreamConnectError):  # it went out: a dispatch
            self.metrics.dispatches.labels(backend.label).inc()
        try:
            resp = send.result()
        except UpstreamConnectError as exc:  # refused: the backend is down (or restarting)
            self.dispatcher.mark_unreachable(backend, self.config.backend_down_s)
            return str(exc), "refused"
        except UpstreamConnectionLost as exc:  # it took the request and dropped it: crashed, restarting?
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return str(exc), "lost"
        except UpstreamTimeout as exc:
            # it took the request and stalled: try another one, and skip it for a while
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return str(exc), "failed"
        except UpstreamError as exc:
            return str(exc), "failed"
        backend.reachable = True
        if (status := resp.status_code) >= 500:
            body: bytes | None = None
            with contextlib.suppress(UpstreamError):
                body = await resp.read()
            resp.close()
            if status == 503 and (backend.in_flight > 1 or admission_rejection(body or b"") is not None):
                # full (vLLM's max_num_queued_reqs or _tokens): room comes back as requests end there
                return f"HTTP 503, full ({backend.in_flight - 1} other requests of ours in flight)", "busy"
            error = error_text(body or b"", raw=False)
            failure = f"HTTP {status}" + (f" ({error})" if error else "")
            if status == 500 and engine_dead(error):  # it exits now (vLLM's terminate_if_errored)
                self.dispatcher.mark_down(backend, self.config.backend_down_s)
                return failure, "lost"
            if body is not None and status in ANSWERED_STATUSES and (failure == repeat or (repeat == "" and last)):
                watch.close()
                self.dispatcher.release(backend, req)
                self.ledger.abort(req)
                self.metrics.rejected(f"backend_{status}", req)
                return Response(body, status, media_type=resp.headers.get("content-type", "application/json"))
            return failure, "failed"
        if resp.status_code != 200 or not parsed.stream:
            return await self._finish_plain(req, backend, resp, watch)
        # the first event before the client sees a 200: a backend that sends its headers and then
        # fails or stalls has streamed nothing, so the request can still go to another
        chunks = resp.iter_chunks()
        first = asyncio.ensure_future(anext(chunks))
        await asyncio.wait(either(first, watch.stop), timeout=wait or None, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            resp.close()
            if watch.stop.done():  # the client went away (or was cancelled) meanwhile
                self.dispatcher.release(backend, req)
                self.ledger.abort(req)
                watch.close()
                return self.stopped(watch, req)
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return f"no event within {wait:g} s of the response headers", "failed"
        try:
            head = first.result()
        except UpstreamTimeout as exc:  # stalled after its headers
            resp.close()
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            return f"the stream stalled before its first event ({exc})", "failed"
        except (StopAsyncIteration, UpstreamError) as exc:  # it ended the stream, or dropped it
            resp.close()
            self.dispatcher.mark_down(backend, self.config.backend_down_s)
            why = "the stream ended" if isinstance(exc, StopAsyncIteration) else f"the stream broke ({exc})"
            return f"{why} before its first event", "lost"
        if (event_error := server_error_event(head)) is not None:
            # it failed before any token and the client has no 200 yet: as a 5xx, another backend may
            # serve it, unless it is the request's own failure (then relayed as it came: its 200, the
            # error event, [DONE])
            code, message = event_error
            failure = f"a server error's event before any token ({message})"
            if engine_dead(message):
                resp.close()
                self.dispatcher.mark_down(backend, self.config.backend_down_s)
                return failure, "lost"
            if not (code in ANSWERED_STATUSES and (failure == repeat or (repeat == "" and last))):
                resp.close()
                return failure, "failed"
        watch.close()  # StreamingResponse watches for disconnects from here on
        watch.upstream = resp
        return StreamingResponse(
            self._relay(req, backend, resp, chain(head, chunks), parsed.wants_usage, watch),
            status_code=200,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": req.request_id},
        )

    async def _finish_plain(self, req: Request, backend: Backend, resp: UpstreamResponse, watch: Watch) -> Response:
        """Read a non-streamed (or error) response whole, racing the client's disconnect."""
        read = asyncio.ensure_future(resp.read())
        try:
            await asyncio.wait(either(read, watch.stop), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read
                self.ledger.abort(req)
                return self.stopped(watch, req)
            try:
                content = read.result()
            except UpstreamError as exc:
                self.ledger.abort(req)
                return self.metrics.reject(
                    "backend_error",
                    api_error("upstream_error", detail=f"backend failed while responding: {exc}"),
                    req,
                )
        finally:
            watch.close()
            resp.close()
            self.dispatcher.release(backend, req)
        now = self.dispatcher.now()
        if resp.status_code != 200:
            self.ledger.abort(req)
            self.metrics.rejected(f"backend_{resp.status_code}", req)
            ctype = resp.headers.get("content-type", "application/json")
            return Response(content, status_code=resp.status_code, media_type=ctype)
        if not req.extra.get("model"):
            self._note_served_model(req, content)
        n = completion_tokens(content)
        if n is None:  # the backend gave no count: the policy is told it is unknown, not 0
            req.output_tokens_known = False
        req.first_token_time = req.last_token_time = now
        self.complete(req, n or 0, now)
        return Response(content, media_type="application/json", headers={"X-Request-Id": req.request_id})

    def complete(self, req: Request, completion_tokens: int, now: float) -> None:
        delta = completion_tokens - req.num_output_tokens
        if delta > 0:
            req.num_output_tokens = completion_tokens
            req.num_computed_tokens = req.num_prompt_tokens + completion_tokens
            self.arrivals.on_progress(req, now, delta)
        elif completion_tokens:
            req.num_output_tokens = completion_tokens
        req.finish_time = now
        req.transition(RequestState.FINISHED)
        if self.arrivals.online is not None and req.output_tokens_known and req.extra.get("single_prompt", True):
            # queued for the learner's thread: the length of one answer (usage counts all n of them); a list
            # of prompts is not learned from (its scored text joins them)
            answers = req.extra.get("answers", 1)
            length = req.num_output_tokens
            if isinstance(answers, int) and answers > 1:
                length = round(length / answers)
            self.arrivals.online.observe(req.prompt, length, str(req.extra.get("model") or "") or None)
        self.arrivals.on_finish(req, now)  # and the queued keys follow what the policy learned
        self.metrics.finished.labels(req.tenant_id, req.tier.name.lower()).inc()
        streamed = req.extra.get("stream") is True and req.first_token_time is not None
        self.metrics.observe_latency(
            str(req.extra.get("model") or req.extra.get(_SERVED_MODEL) or ""),
            req.priority,
            now - req.arrival_time,
            req.first_token_time - req.arrival_time if streamed and req.first_token_time is not None else None,
            req.tenant_id,
            req.tier.name.lower(),
        )
        self.ledger.record(req)

    @staticmethod
    def _note_served_model(req: Request, answer: bytes) -> None:
        """The ``model`` that the backend named in ``answer`` (an answer, or a stream's event), kept
        for the latency metrics' ``model`` label of a request that named none (the backend's
        default model served it). Not for online learning: that follows the request's own field,
        as its scoring does."""
        with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
            model = json.loads(answer).get("model")
            if isinstance(model, str) and model:
                req.extra[_SERVED_MODEL] = model

    def _failed_midstream(self, req: Request, backend: Backend, what: str) -> None:
        """Log a stream that failed after its 200 (the first of its backend's in full, then counted:
        :class:`~headway.serve._logging.FailureLog`); ``headway_rejections`` counts each."""
        self.failures(f"{backend.label}: mid-stream", "request %s: backend %s %s", req.request_id, backend.label, what)

    async def _relay(
        self,
        req: Request,
        backend: Backend,
        resp: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        wants_usage: bool,
        watch: Watch,
    ) -> AsyncIterator[bytes]:
        """Pass SSE events through one by one; count tokens; read the final usage.

        Events are split per the SSE spec (CRLF, CR or LF line ends; ``data:`` with or without
        a space); vLLM's ``data: {...}\\n\\n`` takes the fast path."""
        on_progress = self.arrivals.on_progress
        progress_hook = self.dispatcher.hooks.on_progress
        now = self.dispatcher.now
        stop = watch.stop
        usage_tokens: int | None = None
        find_model = not req.extra.get("model")  # label its latency with the model that answers
        done = False
        ended = False  # the final usage chunk came (no choice in it): the answer is whole
        failed = False  # the backend's own error event came: the request failed, whatever follows
        buf = held = b""
        reason = "client_disconnected"  # unless set below: the client went away mid-stream
        try:
            try:
                async for chunk in chunks:
                    if held or b"\r" in chunk:
                        chunk, held = sse_newlines(held + chunk)
                    buf += chunk
                    while True:
                        cut = buf.find(b"\n\n")
                        if cut < 0:
                            break
                        event, buf = buf[: cut + 2], buf[cut + 2 :]
                        if event.startswith(b"data: "):
                            data = event[6:-2]
                            if b"\n" in data:
                                data = sse_data(event)
                        else:
                            data = sse_data(event)
                        if data == b"[DONE]":
                            done = True
                        elif data.startswith(b'{"error"'):  # vLLM's own ending of a failed stream: passed on
                            failed = True
                            reason = "backend_error_midstream"
                            self._failed_midstream(req, backend, f"sent an error event: {error_text(data)}")
                        elif data.startswith(b"{"):
                            if find_model:  # from the first event only
                                find_model = False
                                self._note_served_model(req, data)
                            if b'"usage":{' in data or b'"usage": {' in data:
                                with contextlib.suppress(ValueError, TypeError, KeyError):
                                    obj = json.loads(data)
                                    usage_tokens = int(obj["usage"]["completion_tokens"])
                                    if not obj.get("choices"):  # the final usage chunk (not vLLM's
                                        ended = True  # continuous_usage_stats in every token's chunk)
                                        if not wants_usage:
                                            continue  # the usage chunk we asked for, not the client
                            elif b'"choices":[]' not in data and b'"role"' not in data:  # chat's role chunk: no token
                                t = now()
                                if req.first_token_time is None:
                                    req.first_token_time = t
                                    if backend.config.metrics_poll_s > 0:  # no longer waiting there
                                        backend.note_started(req)
                                        self.dispatcher.dispatch()
                                req.last_token_time = t
                                req.num_output_tokens += 1
                                req.num_computed_tokens = req.num_prompt_tokens + req.num_output_tokens
                                if progress_hook:
                                    on_progress(req, t, 1)
                        if done and not req.is_finished and not failed:
                            # finished as [DONE] goes out: a client may leave as soon as it reads it,
                            # before the backend closes its end (or the stream's close is seen here)
                            self.complete(
                                req, usage_tokens if usage_tokens is not None else req.num_output_tokens, now()
                            )
                        yield event
                    if stop.done() and not done:
                        break
                else:
                    if held:
                        buf += b"\n"
                    # an event the stream ended inside of is not one (SSE): never passed on in part;
                    # a [DONE] that lacks only its blank line still ends the answer
                    ended = ended or sse_data(buf) == b"[DONE]"
            except UpstreamError as exc:
                # (not the gateway closing it: cancel, drain timeout; nor a break after the [DONE])
                if not stop.done() and not done:
                    reason = "backend_error_midstream"
                    if failed:  # its error event went out already
                        yield b"data: [DONE]\n\n"
                        return
                    self._failed_midstream(req, backend, f"failed mid-stream: {exc}")
                    yield sse_error(f"the backend failed mid-stream: {exc}")
                    return
            if stop.done() and not done:
                why = stop.result()
                reason = STOP_REASONS.get(why, reason)
                if why in STOP_EVENTS:
                    yield STOP_EVENTS[why]
                return
            if failed:  # its error event went out: [DONE] ends it, as vLLM's own stream
                if not done:
                    yield b"data: [DONE]\n\n"
                return
            if not done and not ended:
                reason = "backend_error_midstream"
                self._failed_midstream(req, backend, "closed the stream early")
                yield sse_error("the backend closed the stream early")
                return
            if not req.is_finished:
                self.complete(req, usage_tokens if usage_tokens is not None else req.num_output_tokens, now())
            if not done:  # whole, but its [DONE] did not come (or without its blank line): every stream ends so
                yield b"data: [DONE]\n\n"
        finally:
            if not req.is_finished:
                if reason == "client_disconnected" and watch.send_timed_out:
                    reason = "client_send_timeout"  # it stopped reading: cut off (_conn's send deadline)
                self.metrics.rejected(reason, req)
                self.ledger.abort(req)
            watch.upstream = None
            resp.close()  # mid-body: closes the upstream connection: the backend aborts the request
            self.dispatcher.release(backend, req)
            self.ledger.ended(req, watch)
