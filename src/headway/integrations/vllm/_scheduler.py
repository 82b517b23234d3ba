"""The vLLM scheduler classes (``HeadwayScheduler``, ``HeadwayAsyncScheduler``), built on first
use: this module imports vLLM only inside :func:`build_scheduler_classes`."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from headway.core import Policy
from headway.integrations.vllm._adapter import PolicyAdapter
from headway.integrations.vllm._chat import ChatMarkers, chat_markers
from headway.integrations.vllm._errors import PluginConfigError, VllmVersionError
from headway.integrations.vllm._scorers import (
    TextScoreFn,
    load_online_learner,
    load_text_scorer,
    online_state_for_rank,
)
from headway.integrations.vllm._scoring import SCORED_CHARS
from headway.integrations.vllm._settings import (
    PluginConfig,
    _check_chunked_prefill,
    check_score_source,
    control_settings,
    make_plugin_policy,
    read_control_file,
)
from headway.integrations.vllm._steplog import StepLog
from headway.integrations.vllm._version import SUPPORTED_VLLM_VERSIONS, _check_interface, check_vllm_version
from headway.policies import ScoredPolicy

__all__ = ["build_scheduler_classes"]

logger = logging.getLogger("headway.integrations.vllm")


class _ToVllmLog(logging.Handler):
    """Hands records to vLLM's ``vllm`` logger, whose handlers (configured by vLLM, possibly later
    than this is attached) print them as vLLM's own lines."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("vllm").handle(record)


def _log_like_vllm() -> None:
    """Send this module's log lines (INFO and up) through vLLM's logging, as its own loggers' are:
    without a handler of its own, Python printed only warnings and errors, so the log never said
    which policy runs or that a control file switched it."""
    if any(isinstance(h, _ToVllmLog) for h in logger.handlers):
        return
    logger.addHandler(_ToVllmLog())
    logger.setLevel(logging.INFO)
    logger.propagate = False


_CHAT_SLACK_TOKENS = 256
"""Tokens past ``SCORED_CHARS`` in the window of a prompt's end searched for a chat message: its
closing (the message's end and the generation prompt) and its opening."""

_ABORT_STATUSES = frozenset({"FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_IGNORED"})


def _max_new_tokens(scheduler_output: Any) -> int | None:
    """The most output tokens one request can gain from a vLLM step: 1 plus its speculative
    draft tokens; 0 when the step schedules nothing; None when the output lacks the field
    (the adapter then bounds it by the scheduled token counts)."""
    if not scheduler_output.num_scheduled_tokens:
        return 0
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None)
    if not isinstance(spec, Mapping):
        return None
    return 1 + max(map(len, spec.values()), default=0)


def build_scheduler_classes() -> tuple[type[Any], type[Any]]:
    """Import vLLM, check its interface, and define the scheduler classes."""
    try:
        import vllm
        from vllm.v1.core.sched import request_queue as vllm_rq
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.request import RequestStatus
    except ImportError as exc:
        raise VllmVersionError(
            f"headway's vLLM plugin needs vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)} "
            f"with the V1 engine; importing it failed: {exc}"
        ) from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    _check_interface(Scheduler, vllm_rq.RequestQueue, version)
    fcfs = vllm_rq.SchedulingPolicy.FCFS
    priority_mode = vllm_rq.SchedulingPolicy.PRIORITY
    running_status = RequestStatus.RUNNING
    abort_statuses = frozenset(s for s in RequestStatus if s.name in _ABORT_STATUSES)

    classes: dict[bool, type[Any]] = {}  # async scheduling -> the class

    def make(base: type[Any], name: str) -> type[Any]:
        is_async = issubclass(base, AsyncScheduler)

        class _Headway(base):  # type: ignore[misc]
            """vLLM's scheduler with a headway policy ordering its queues (see the module doc)."""

            policy: Any  # vLLM's SchedulingPolicy, set by the base class
            max_num_scheduled_tokens: int  # the step's token budget, set by the base class (capped by Sarathi's)

            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                # HeadwayScheduler picks its base as vLLM would: vLLM builds a custom scheduler class
                # as named, whether or not its engine core runs async scheduling
                if cls is classes[False] and _async_scheduling(kwargs.get("vllm_config", args[0] if args else None)):
                    inst = object.__new__(classes[True])
                    inst.__init__(*args, **kwargs)  # not called by Python: not an instance of cls
                    return inst
                return object.__new__(cls)

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                _log_like_vllm()
                vllm_config = kwargs.get("vllm_config", args[0] if args else None)
                cfg = PluginConfig.resolve(getattr(vllm_config, "additional_config", None))
                if cfg.check_version:
                    check_vllm_version(version)
                if is_async and not _async_scheduling(vllm_config):
                    raise PluginConfigError(
                        "headway: HeadwayAsyncScheduler needs vLLM's async scheduling, which is off here; "
                        "use --scheduler-cls headway.integrations.vllm.HeadwayScheduler, which runs on "
                        "vLLM's Scheduler or AsyncScheduler as async scheduling is off or on"
                    )
                super().__init__(*args, **kwargs)
                self.headway_config = cfg
                if self.policy != fcfs:  # the user's --scheduling-policy, before headway's takes over
                    logger.warning(
                        "headway: --scheduling-policy %s is replaced by headway policy %r "
                        "(use policy 'priority' for vLLM-style priorities)",
                        self.policy.value,
                        cfg.policy,
                    )
                # vLLM's priority path picks the victim as max (priority, arrival) over the running
                # requests, wherever they are in the list (unscheduling one already scheduled this step);
                # _hw_rank_victims makes that max the policy's victim. No other decision reads it.
                self.policy = priority_mode
                score_batch: TextScoreFn | None = None
                observe: Callable[[str, int], None] | None = None
                self._hw_learner: Any = None
                if cfg.online_learning:
                    assert cfg.scorer is not None  # PluginConfig checked it
                    state = cfg.online_state
                    if state is not None:  # one file per data-parallel engine
                        dp = getattr(self.vllm_config.parallel_config, "data_parallel_index", 0)
                        state = online_state_for_rank(state, int(dp or 0))
                    self._hw_learner = learner = load_online_learner(
                        cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads, state=state
                    )
                    if state is not None:
                        logger.info("headway: %s", learner.resumed_line(state))
                    model_config = self.vllm_config.model_config
                    model = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
                    model = str(model) if model else None
                    score_batch = functools.partial(learner.score, model=model)
                    observe = functools.partial(_observe, learner, model)
                elif cfg.scorer is not None:
                    score_batch = load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
                self._hw_tokenizer_path = cfg.tokenizer or getattr(self.vllm_config.model_config, "tokenizer", None)
                self._hw_tokenizer: Any = None
                self._hw_chat: ChatMarkers | None = None  # the tokenizer's chat markers, read with it
                self._hw_budget0 = int(self.max_num_scheduled_tokens)
                first = make_plugin_policy(cfg.policy, cfg.policy_args)
                self.max_num_scheduled_tokens = self._hw_budget(first)
                self.headway = PolicyAdapter(
                    first,
                    oracle=cfg.oracle,
                    max_model_len=self.max_model_len,
                    score_batch=score_batch,
                    decode=self._hw_decode if score_batch is not None else None,
                    missing_score=cfg.missing_score,
                    observe=observe,
                    request_hints=cfg.request_hints,
                    background=cfg.scoring == "background",
                )
                self.waiting = self.headway.make_queue()
                self.kv_holding_waiting = self.headway.make_queue()
                self._hw_control = os.path.expanduser(cfg.control_file) if cfg.control_file else None
                self._hw_control_mtime: int | None = None
                if self._hw_control:
                    with contextlib.suppress(OSError):
                        self._hw_control_mtime = os.stat(self._hw_control).st_mtime_ns
                self._hw_log = StepLog(cfg.step_log) if cfg.step_log else None
                self._hw_t0 = 0.0
                self._hw_t1 = 0.0
                self._hw_pt = 0.0
                self._hw_st = 0.0
                self._hw_na = 0
                self._hw_comp = (0, 0)
                self._hw_step = 0
                if self._hw_log is not None:
                    self._hw_header()
                logger.info(
                    "headway: scheduling with policy %r %s (oracle=%s, scorer=%s, vLLM %s, on its %s)",
                    cfg.policy,
                    json.dumps(cfg.policy_args),
                    cfg.oracle,
                    cfg.scorer,
                    version,
                    base.__name__,
                )
                if score_batch is None and isinstance(first, ScoredPolicy) and first.scorer is None:
                    check_score_source(cfg, cfg.policy)  # (as plugin-check does)
                    # (plugin-check says so; the engine said it only at the first request without a score)
                    logger.warning(
                        "headway: policy %r ranks by length scores and no scorer is set: requests need vllm_xargs "
                        "headway_score, those without one get %s",
                        cfg.policy,
                        "the mean of the scores so far (0 before any)"
                        if cfg.missing_score is None
                        else f"missing_score {cfg.missing_score}",
                    )

            # ------------------------------------------------------ helpers
            def _hw_budget(self, policy: Policy) -> int:
                """The step's token budget under ``policy``: the engine's, capped by the policy's
                own (Sarathi's); a policy that needs chunked prefill is refused without it."""
                _check_chunked_prefill(policy, bool(self.scheduler_config.enable_chunked_prefill))
                budget = self._hw_budget0
                if policy.token_budget is not None and policy.token_budget < budget:
                    logger.info(
                        "headway: policy %r caps the step's token budget at %d (the engine's: %d)",
                        policy.name,
                        policy.token_budget,
                        budget,
                    )
                    budget = policy.token_budget
                return budget

            def _hw_decode(self, batch: list[Any]) -> list[str]:
                """The scorer's texts for prompts given as token ids: a chat prompt's last user message
                (found through the model's chat template, :mod:`._chat`), else the whole prompt; at
                most the ``SCORED_CHARS`` characters the scorer reads of either. Only a bounded window
                of a long prompt's ids is decoded (its start, or for the chat check its end), so a
                huge prompt costs no more than a short one here, on the engine thread."""
                if self._hw_tokenizer is None:
                    from transformers import AutoTokenizer

                    tok = AutoTokenizer.from_pretrained(self._hw_tokenizer_path)
                    self._hw_chat = chat_markers(tok)
                    logger.info(
                        "headway: %s",
                        "chat prompts are scored on their last user message (found through the chat template)"
                        if self._hw_chat is not None
                        else "prompts are scored whole (no chat template, or none that shows where user messages are)",
                    )
                    # the Rust tokenizer's batch decode, without the Python wrapper's per-call work
                    self._hw_tokenizer = getattr(tok, "backend_tokenizer", None) or tok
                tok = self._hw_tokenizer
                batch_decode = tok.decode_batch if hasattr(tok, "decode_batch") else tok.batch_decode
                # a token decodes to a character or more (but for byte pieces and special tokens):
                # SCORED_CHARS tokens hold the characters the scorer reads, the chat window its closing too
                head = [list(x[:SCORED_CHARS]) for x in batch]
                markers = self._hw_chat
                if markers is None:
                    return [str(t) for t in batch_decode(head, skip_special_tokens=True)]
                # the template's markers may be special tokens: found in the text that keeps them
                window = SCORED_CHARS + _CHAT_SLACK_TOKENS
                tails = [str(t) for t in batch_decode([list(x[-window:]) for x in batch], skip_special_tokens=False)]
                texts: list[str | None] = [markers.query(t) for t in tails]
                # a chat prompt whose last message is longer than the window (its opening is before
                # it): decoded whole, a pass in the Rust tokenizer (~10 ms for 100,000 tokens)
                longer = [
                    i
                    for i, t in enumerate(texts)
                    if t is None and len(batch[i]) > window and tails[i].endswith(markers.closing)
                ]
                if longer:
                    whole = batch_decode([list(batch[i]) for i in longer], skip_special_tokens=False)
                    for i, t in zip(longer, whole, strict=True):
                        texts[i] = markers.query(str(t))
                plain = [i for i, t in enumerate(texts) if t is None]
                if plain:
                    again = batch_decode([head[i] for i in plain], skip_special_tokens=True)
                    for i, t in zip(plain, again, strict=True):
                        texts[i] = str(t)
                return [(t or "")[:SCORED_CHARS] for t in texts]

            def _hw_header(self) -> None:
                assert self._hw_log is not None
                sc = self.scheduler_config
                self._hw_log.write({
                    "type": "header", "vllm": version, "time": time.time(),
                    "policy": self.headway.policy.name, "policy_args": self.headway_config.policy_args,
                    "num_gpu_blocks": self.cache_config.num_gpu_blocks, "block_size": self.block_size,
                    "max_num_seqs": self.max_num_running_reqs,
                    "max_num_active_seqs": getattr(sc, "max_num_active_seqs", None),
                    "watermark": float(getattr(sc, "watermark", 0.0) or 0.0),
                    "max_num_batched_tokens": self._hw_budget0,  # the engine's, before a policy's cap
                    "max_model_len": self.max_model_len,
                    "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
                    "enable_prefix_caching": bool(self.cache_config.enable_prefix_caching),
                    "long_prefill_token_threshold": int(sc.long_prefill_token_threshold or 0),
                    "long_prefill_token_threshold_adaptive": bool(
                        getattr(sc, "long_prefill_token_threshold_adaptive", False)
                    ),
                    "async_scheduling": bool(sc.async_scheduling),
                }, flush=True)  # fmt: skip

            def _hw_maybe_reload(self) -> None:
                path = self._hw_control
                assert path is not None
                try:
                    mtime = os.stat(path).st_mtime_ns
                except OSError:
                    return
                if mtime == self._hw_control_mtime:
                    return
                self._hw_control_mtime = mtime
                try:
                    data = json.loads(read_control_file(path))  # (refused when others may write it)
                    current = {"policy": self.headway.policy.name, "oracle": self.headway.oracle_mode}
                    # the settings' own checks (types, oracle, missing_score) on the values it switches to
                    cfg = control_settings(self.headway_config, data, current)
                    name = cfg.policy
                    policy = make_plugin_policy(name, cfg.policy_args)
                    budget = self._hw_budget(policy)
                    online = self._hw_learner is not None and cfg.scorer == self.headway_config.scorer
                    score_batch = (
                        None
                        if cfg.scorer is None
                        else self.headway.score_batch  # the online learner's, which goes on learning
                        if online
                        else load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
                    )
                    self.headway.set_policy(policy, cfg.oracle)
                    self.max_num_scheduled_tokens = budget
                    self.headway.score_batch = score_batch
                    self.headway.decode = self._hw_decode
                    self.headway.missing_score = cfg.missing_score
                except Exception as exc:  # anything raised here would stop the engine
                    logger.error("headway: control file %s ignored: %s: %s", path, type(exc).__name__, exc)
                    return
                logger.info("headway: policy switched to %r %s", name, json.dumps(data.get("policy_args", {})))
                if self._hw_log is not None:
                    self._hw_log.write(
                        {
                            "type": "policy",
                            "time": time.time(),
                            "policy": name,
                            "policy_args": data.get("policy_args", {}),
                        },
                        flush=True,
                    )

            def _hw_pressure(self) -> bool:
                """Whether scheduling the running requests could run out of KV blocks."""
                running = self.running
                if len(running) < 2:
                    return False
                free = self.kv_cache_manager.block_pool.get_num_free_blocks()
                bound = 2 * len(running) + -(-self.max_num_scheduled_tokens // self.block_size)
                return bool(free <= bound)

            def _hw_displace(self) -> None:
                """``evict`` displacement (SGLang's retract), as the simulator's: the waiting requests
                in the order vLLM's admission takes them, each one that has a sequence slot and
                budget but not the KV blocks vLLM's admission asks of it evicting the worst-keyed
                running request that is keyed worse than it (``can_preempt`` allowing) until it
                fits. A request that fits is counted as admitted (its slot, tokens and blocks) and
                the next one checked. A full batch or token budget displaces nobody (vLLM's
                decision), nor does a step whose running requests are short of blocks themselves
                (vLLM's own preemption, after which it admits nobody). The blocks are counted as
                vLLM's ``schedule()`` will take them (:meth:`_hw_free_after_running`,
                :meth:`_hw_admission_blocks`)."""
                a = self.headway
                if self.kv_holding_waiting or not self.waiting:
                    return
                waiting, running = self.waiting, self.running
                free, budget = self._hw_free_after_running()
                if free < 0:
                    return
                admitted = blocks = tokens = 0  # what the requests counted as admitted take
                taken: set[int] = set()  # and the cached blocks they take out of the free queue
                for req, cand in a.waiting_in_order(waiting):
                    while True:
                        if budget <= 0 or len(running) + admitted >= self.max_num_active_reqs:
                            return
                        need, took, chunk, touched = self._hw_admission_blocks(
                            req, budget, bool(running) or admitted > 0, taken
                        )
                        if chunk == 0:
                            return  # the budget, not blocks, stops it
                        if need <= free:
                            free, budget = free - took, budget - chunk
                            admitted, blocks, tokens = admitted + 1, blocks + took, tokens + chunk
                            taken.update(touched)
                            break
                        victim = a.displacement_victim(waiting, running, cand) if cand is not None else None
                        if victim is None:
                            return
                        running.remove(victim)
                        self._preempt_request(victim, time.monotonic())
                        a.num_displaced += 1
                        free, budget = self._hw_free_after_running()
                        free, budget = free - blocks, budget - tokens

            def _hw_free_after_running(self) -> tuple[int, int]:
                """The free KV blocks and token budget left once vLLM's running loop has scheduled
                every running request (its tokens this step, in running-list order, and the blocks
                they fill past those each holds)."""
                kvm, bs = self.kv_cache_manager, self.block_size
                budget = self.max_num_scheduled_tokens
                cap = self._hw_prefill_cap()
                taken = 0
                for r in self.running:
                    if budget <= 0:
                        break
                    placeholders = r.num_output_placeholders
                    if placeholders > 0 and (
                        r.num_computed_tokens + 2 - placeholders >= r.num_prompt_tokens + r.max_tokens
                    ):
                        continue  # (async: its last token is in flight; vLLM skips it)
                    n = r.num_tokens_with_spec + placeholders - r.num_computed_tokens
                    if 0 < cap < n:
                        n = cap
                    n = min(n, budget, self.max_model_len - r.num_computed_tokens - self.num_sampled_tokens_per_step)
                    if n <= 0:
                        continue
                    held = len(kvm.get_block_ids(r.request_id)[0])
                    taken += max(0, -(-(r.num_computed_tokens + n + self.num_lookahead_tokens) // bs) - held)
                    budget -= n
                return kvm.block_pool.get_num_free_blocks() - taken, budget

            def _hw_prefill_cap(self) -> int:
                """vLLM's ``long_prefill_token_threshold`` for this step (adaptive or not)."""
                sc = self.scheduler_config
                eligible = len(self.running) + len(self.waiting) + len(self.kv_holding_waiting)
                cap = int(sc.long_prefill_token_threshold or 0) if eligible > 1 else 0
                if cap > 0 and getattr(self, "adaptive_long_prefill_threshold", False):
                    cap = max(cap, int(sc.max_num_batched_tokens) // eligible)
                return cap

            def _hw_admission_blocks(
                self, req: Any, budget: int, others: bool, taken: set[int]
            ) -> tuple[int, int, int, list[int]]:
                """The free KV blocks vLLM's admission asks of waiting request ``req`` with ``budget``
                tokens left, the free blocks admitting it takes, the tokens it would schedule (0: the
                budget, not blocks, stops it), and the ids of its hit's blocks it takes out of the
                free queue. It asks blocks for its whole sequence (``scheduler_reserve_full_isl``) or
                its first chunk, less its prefix-cache hit (a hit block in the free queue counts: it
                leaves it, unless one of the requests admitted before it in this step, ``taken``,
                took it), plus the watermark while ``others`` are scheduled; it takes those of its
                first chunk alone (``allocate_slots`` checks the whole sequence, allocates the
                chunk's)."""
                kvm, bs = self.kv_cache_manager, self.block_size
                computed, hit, touched = req.num_computed_tokens, 0, []
                if computed == 0:
                    found, computed, _ = kvm.get_computed_blocks(req)
                    group = found.blocks[0] if found.blocks else ()
                    hit = len(group)
                    touched = [b.block_id for b in group if b.ref_cnt == 0 and b.block_id not in taken]
                n = req.num_tokens - computed
                cap = self._hw_prefill_cap()
                if 0 < cap < n:
                    n = cap
                if n > budget:
                    if not self.scheduler_config.enable_chunked_prefill:
                        return 0, 0, 0, []
                    n = budget
                end = computed + n + self.num_lookahead_tokens
                took = -(-min(end, self.max_model_len) // bs) - hit + len(touched)
                if self.scheduler_reserve_full_isl:
                    end = max(end, min(req.num_tokens, self.max_model_len))
                need = -(-end // bs) - hit + len(touched)
                if others:
                    need += kvm.watermark_blocks
                return need, took, n, touched

            def _hw_rank_victims(self) -> list[tuple[Any, int]]:
                """Before a step that could run out of KV blocks: give each running request the
                policy's eviction rank as its vLLM ``priority`` (restored after the step), so
                vLLM's own priority-preemption code evicts the policy's victim. The running list
                keeps vLLM's order (who is scheduled first); only the victim is the policy's."""
                saved = [(r, r.priority) for r in self.running]
                for rank, r in enumerate(self.headway.eviction_order(self.running)):
                    r.priority = rank
                return saved

            # ---------------------------------------------------- overrides
            def add_request(self, request: Any) -> None:
                if self._hw_control is not None and not self.requests:
                    self._hw_maybe_reload()
                super().add_request(request)

            def schedule(self, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                a = self.headway
                a.step_start()
                if a.displacement == "evict" and self.running:
                    self._hw_displace()
                saved = self._hw_rank_victims() if self._hw_pressure() else None
                try:
                    out = super().schedule(*args, **kwargs)
                finally:
                    for r, priority in saved or ():
                        r.priority = priority
                t1 = time.perf_counter()
                hits: dict[str, int] | None = None
                for h in a.take_popped():
                    e = a.engine.get(h)
                    if e is not None and e.status == running_status:
                        a.mark_running(h, e)
                        if h.num_cached_tokens is None:  # first scheduled: its prefix-cache hit (vLLM's name)
                            if hits is None:
                                hits = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
                            if e.request_id in hits:
                                h.num_cached_tokens = int(hits[e.request_id])
                a.policy_time += time.perf_counter() - t1
                self._hw_t0, self._hw_t1 = t0, t1
                if self._hw_log is not None:  # the step's composition, while every request is still here
                    reqs = self.requests
                    kv = prefill = 0
                    for rid, n in out.num_scheduled_tokens.items():
                        r = reqs.get(rid)
                        if r is not None:
                            kv += int(r.num_computed_tokens)  # context after this step's tokens
                            if n > 1 or r.num_computed_tokens <= r.num_prompt_tokens:
                                prefill += n
                    self._hw_comp = (kv, prefill)
                return out

            def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
                t2 = time.perf_counter()
                a = self.headway
                a.step_tokens = scheduler_output.num_scheduled_tokens  # (finish(): a finisher's progress)
                try:
                    result = super().update_from_output(scheduler_output, model_runner_output)
                finally:
                    a.step_tokens = {}
                a.progress(scheduler_output.num_scheduled_tokens, _max_new_tokens(scheduler_output))
                if self._hw_log is not None and scheduler_output.total_num_scheduled_tokens > 0:
                    self._hw_record(scheduler_output, t2)
                return result

            def _hw_record(self, so: Any, t2: float) -> None:
                assert self._hw_log is not None
                t3 = time.perf_counter()
                a = self.headway
                kv, prefill = self._hw_comp
                self._hw_step += 1
                busy = bool(self.running) or bool(self.waiting) or bool(self.kv_holding_waiting)
                self._hw_log.write({
                    "step": self._hw_step, "t0": self._hw_t0, "t1": self._hw_t1, "t2": t2, "t3": t3,
                    "num_tokens": int(so.total_num_scheduled_tokens),
                    "num_seqs": len(so.num_scheduled_tokens), "num_kv_tokens": kv,
                    "num_prefill_tokens": prefill, "num_new": len(so.scheduled_new_reqs),
                    "waiting": len(self.waiting), "running": len(self.running), "busy": busy,
                    "policy_s": a.policy_time - self._hw_pt, "score_s": a.score_time - self._hw_st,
                    "arrivals": a.num_arrivals - self._hw_na,
                    "preempted": len(so.preempted_req_ids or ()),
                }, flush=not busy)  # fmt: skip
                # between-step work (arrivals) counts toward the next step
                self._hw_pt, self._hw_st, self._hw_na = a.policy_time, a.score_time, a.num_arrivals

            def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
                self.headway.preempt(request)
                return super()._preempt_request(request, *args, **kwargs)

            def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
                h = self.headway.finish(request, aborted=request.status in abort_statuses)
                if h is not None and self._hw_log is not None:
                    self._hw_log.write({
                        "type": "request", "id": h.request_id, "client_id": h.extra.get("headway.client_id"),
                        "seq": h.seq, "state": h.state.value, "epoch": self.headway.epoch,
                        "arrival": h.arrival_time, "added": h.queued_time,
                        "scheduled": h.first_scheduled_time, "first_token": h.first_token_time,
                        "finish": h.finish_time, "prompt": h.num_prompt_tokens,
                        "output": h.num_output_tokens, "preemptions": h.num_preemptions,
                        "cached": h.num_cached_tokens,
                    })  # fmt: skip
                return super()._free_request(request, *args, **kwargs)

            def shutdown(self) -> None:
                self.headway.close()
                if self._hw_learner is not None:
                    self._hw_learner.close()
                if self._hw_log is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self._hw_log.close()
                super().shutdown()

        _Headway.__name__ = _Headway.__qualname__ = name
        _Headway.__module__ = "headway.integrations.vllm"  # the public path vLLM loads it by
        classes[is_async] = _Headway
        return _Headway

    return make(Scheduler, "HeadwayScheduler"), make(AsyncScheduler, "HeadwayAsyncScheduler")


def _observe(learner: Any, model: str | None, prompt: str, output_tokens: int) -> None:
    learner.observe(prompt, output_tokens, model)


def _async_scheduling(vllm_config: Any) -> bool:
    return bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
