"""Run vLLM's own scheduler (or headway's plugin on it) step by step on a scenario, with no model.

Runs in the vLLM virtualenv (``PYTHONPATH`` = this checkout's ``src``); the differential tests in
``test_step_diff.py`` (main virtualenv: hypothesis, headway's engine) start it once and talk to it
over pipes, one JSON object a line each way::

    python _vllm_steps.py MODEL_DIR        # then: {"scenario": ..., "scheduler": ...} per line

``scheduler``: ``vllm`` (vLLM's ``Scheduler``), ``vllm-async`` (its ``AsyncScheduler``),
``headway`` / ``headway-async`` (``HeadwayScheduler`` with the scenario's ``headway``
settings, async scheduling off / on: it runs on vLLM's ``Scheduler`` / ``AsyncScheduler``),
``headway-async-class`` (``HeadwayAsyncScheduler`` named with async scheduling off: an error).
The scheduler is built from a real ``VllmConfig`` (the tiny Llama's model config; no weights
are run) and a hand-made ``KVCacheConfig``; each step ``schedule()`` is called, a
``ModelRunnerOutput`` is fabricated (one sampled token per request that is not mid-prefill) and
fed to ``update_from_output()``, as vLLM's own scheduler tests do.
The async schedulers are driven like ``EngineCore.step_with_batch_queue``: up to two batches in
flight, the next scheduled before the previous one's output is applied.

A scenario: engine geometry (``block_size``, ``num_blocks``, ``max_num_seqs``,
``max_num_batched_tokens``, ``chunked_prefill``, ``prefix_caching``, ``policy``: vLLM's
``--scheduling-policy``; optional: ``reserve_full_isl``, vLLM's ``scheduler_reserve_full_isl``,
default on; ``long_prefill_token_threshold`` (and ``_adaptive``), ``max_num_active_seqs`` and
``watermark``, vLLM's options of those names; ``max_num_queued_reqs`` and ``max_num_queued_tokens``, its API
server's limits, checked by its own ``AsyncLLM.check_admission`` against its own ``OutputProcessor``,
fed the scheduler's outputs, below) and requests (``id``, ``arrive``: the step before which it is added,
``prompt``: token ids, ``max_tokens``, ``priority``, ``abort``: the step before which it is
aborted, or null; optional ``stop_at``: the output token that stops it, a stop token id, as an
EOS would, instead of ``max_tokens``). The reply: one record per ``schedule()`` call with ``sched`` (request id ->
[tokens scheduled, tokens already computed before the step], in vLLM's order: running requests,
then resumed and new ones; a new request's computed tokens are its prefix-cache hit),
``preempted`` (ids preempted in the step) and ``finished`` (ids that finished in the step's
output), plus ``tokens`` (each request's output tokens at the end) and ``rejected`` (request id -> the
limit its arrival broke, vLLM's ``vllm:admission_rejections`` reason).

With an API-server limit set, each arriving request is first checked as vLLM's API server checks
it (``AsyncLLM.check_admission``, run on a stand-in front end whose counts are a real
``OutputProcessor``'s): a rejected request never reaches the scheduler. The output processor
holds every admitted request until its finishing output or its abort, and learns a step's
outputs after the requests that arrive as that step ends were checked (the simulator's tie
rule: an arrival at a step's end comes before it). Under async scheduling the harness's idle
``schedule()`` calls take no time (the clock of ``async_outcome`` in ``_stepdiff.py``): a step's
outputs are learnt as the next batch starts, after an idle engine's arrivals and aborts, or at
once if another batch is still in flight (then the requests added next arrive after the step's end).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

MAX_STEPS = 20_000
STOP = 9
"""The token a fabricated output stops on (a request's ``stop_at``-th)."""
OUT = 10
"""Every other fabricated output token of the scenario's ``k``-th request is ``OUT + k``."""
_HASH = get_hash_fn_by_name("sha256")

init_none_hash(_HASH)


def model_len(sc: dict[str, Any]) -> int:
    """The scenario's ``max_model_len`` (512 unless given), or the tokens its KV cache holds if fewer:
    vLLM does not start on a cache that cannot hold one request of ``max_model_len`` tokens, and
    where it fits ``max_model_len`` to the cache, a request stops at that many tokens (as the
    simulator's engine stops it without a ``max_model_len``: at its cache's size)."""
    return min(int(sc.get("max_model_len", 512)), (int(sc["num_blocks"]) - 1) * int(sc["block_size"]))


def runner_output(out: Any, chunk: dict[str, bool], sampled: Callable[[str], list[int]] = lambda _: [7]) -> Any:
    """A step's model output, fabricated: ``sampled(id)`` for each request of ``out`` that is not
    mid-prefill (``chunk``: whether its step was a prefill chunk that samples nothing)."""
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
        sampled_token_ids=[[] if chunk[r] else sampled(r) for r in ids],
    )  # fmt: skip


class Frontend:
    """The API server's side of vLLM's admission control: ``AsyncLLM.check_admission`` itself, run on
    this stand-in, whose counts are a real ``OutputProcessor``'s."""

    def __init__(self, sc: dict[str, Any]) -> None:
        self.scheduler_config = SchedulerConfig(
            max_model_len=model_len(sc), is_encoder_decoder=False,
            max_num_queued_reqs=sc.get("max_num_queued_reqs"), max_num_queued_tokens=sc.get("max_num_queued_tokens"),
        )  # fmt: skip
        self.admission_stats = None  # one API server
        self.logger_manager = None
        self.output_processor = OutputProcessor(None, log_stats=False)
        self.rejected: dict[str, str] = {}
        self._reason = ""

    def get_num_unfinished_requests(self) -> int:
        return int(self.output_processor.get_num_unfinished_requests())

    def get_num_queued_tokens(self) -> int:
        return int(self.output_processor.get_num_queued_tokens())

    def _record_admission_rejection(self, reason: str) -> None:
        self._reason = reason

    def admit(self, rid: str, prompt: list[int], params: SamplingParams, arrival: float, priority: int) -> bool:
        """vLLM's check of an arriving request; an admitted one joins the output processor."""
        try:
            AsyncLLM.check_admission(self, 1, rid)  # type: ignore[arg-type]
        except Exception:  # QueueOverflowError, MaxQueuedTokensError: HTTP 503 there
            self.rejected[rid] = self._reason
            return False
        req = EngineCoreRequest(
            rid, prompt, None, params, None, arrival, None, None, None, priority=priority, external_req_id=rid
        )
        self.output_processor.add_request(req, None)
        return True


class StepClock:
    """The clock of ``sync_outcome`` / ``async_outcome`` (``_stepdiff.py``), kept as the harness runs:
    a batch takes one second and a ``schedule()`` that runs nothing none (the synchronous harness's
    idle calls, which admit arrivals, one; a synchronous one that only preempted ``empty``: the
    scenario's ``"empty_step"``, ``_stepdiff.EMPTY_STEP``). With a scenario's ``"clock": "steps"`` the
    requests' ``arrival_time`` and headway's policy clock are read off it, so a policy whose keys read times
    (UniBoost's arrival times, LTR's step times) sees the times the simulator sees: an async
    ``schedule()`` with a batch in flight reads 1 µs after that batch started (the simulator's
    ``ASYNC_PLAN_DELAY``: the plan is made as the batch is launched, after the requests added then,
    0.1 µs after its start)."""

    def __init__(self, depth: int, empty: float = 0.0) -> None:
        self.depth = depth
        self.empty = empty
        self.now = 0.0
        self.last_end = 0.0
        self.ends: list[float] = []  # async: the batches in flight's end times, oldest first
        self.planning = False  # in a schedule() call

    def arrival(self) -> float:
        return self.now + (1e-7 if self.ends else 0.0)

    def policy_now(self) -> float:
        return self.now + (1e-6 if self.planning and self.depth > 1 and self.ends else 0.0)

    def scheduled(self, ran: bool, preempted: bool, event: bool) -> None:
        """After a ``schedule()`` (``ran``: it scheduled tokens), or an idle step (neither)."""
        if self.depth == 1:
            self.ends = [self.now + (1.0 if ran or not preempted else self.empty)]
            return
        if ran:
            start = max(self.now, self.last_end)
            self.last_end = start + 1.0
            self.ends.append(self.last_end)
        elif event and not self.ends:
            self.now += 1e-6  # an idle engine that scheduled nothing: what is added next comes after

    def output(self) -> None:
        """A batch's output is processed: the clock is at its end."""
        if self.ends:
            self.now = self.ends.pop(0)


class Harness:
    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self.model_configs: dict[int, ModelConfig] = {}

    def model_config(self, max_len: int) -> ModelConfig:
        if max_len not in self.model_configs:
            self.model_configs[max_len] = ModelConfig(
                model=self.model_dir, dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=max_len
            )
        return self.model_configs[max_len]

    def build(self, sc: dict[str, Any], scheduler: str) -> Any:
        block = int(sc["block_size"])
        cache = CacheConfig(block_size=block, enable_prefix_caching=bool(sc["prefix_caching"]))
        max_len = model_len(sc)
        sched_cfg = SchedulerConfig(
            max_num_seqs=int(sc["max_num_seqs"]), max_num_batched_tokens=int(sc["max_num_batched_tokens"]),
            max_model_len=max_len, enable_chunked_prefill=bool(sc["chunked_prefill"]),
            is_encoder_decoder=False, policy=sc.get("policy", "fcfs"),
            # (no chunk is longer than max_model_len: a larger threshold, which vLLM refuses, caps nothing more)
            long_prefill_token_threshold=min(int(sc.get("long_prefill_token_threshold", 0)), max_len),
            long_prefill_token_threshold_adaptive=bool(sc.get("long_prefill_token_threshold_adaptive", False)),
            scheduler_reserve_full_isl=bool(sc.get("reserve_full_isl", True)),
            max_num_active_seqs=sc.get("max_num_active_seqs"), watermark=float(sc.get("watermark", 0.0)),
        )  # fmt: skip
        extra = {"headway": sc["headway"]} if scheduler.startswith("headway") else {}
        cfg = VllmConfig(
            scheduler_config=sched_cfg, model_config=self.model_config(max_len), cache_config=cache,
            additional_config=extra,
        )  # fmt: skip
        # the CPU platform turns async scheduling off; the scheduler reads the flag only for PP
        cfg.scheduler_config.async_scheduling = scheduler.endswith("async")
        spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=64, dtype=torch.float32)
        n = int(sc["num_blocks"])
        kv = KVCacheConfig(num_blocks=n, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        cache.num_gpu_blocks = n
        if scheduler == "headway-async-class":  # named explicitly, with async scheduling off
            from headway.integrations.vllm import HeadwayAsyncScheduler as cls

            cfg.scheduler_config.async_scheduling = False
        elif scheduler.startswith("headway"):  # the one documented class: it picks its base
            from headway.integrations.vllm import HeadwayScheduler as cls
        else:
            cls = AsyncScheduler if scheduler.endswith("async") else Scheduler
        return cls(
            vllm_config=cfg, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(cfg),
            block_size=block, log_stats=True,
        )  # fmt: skip

    def run(self, sc: dict[str, Any], scheduler: str) -> dict[str, Any]:
        sched = self.build(sc, scheduler)
        hasher = get_request_block_hasher(int(sc["block_size"]), _HASH) if sc["prefix_caching"] else None
        by_step: dict[int, list[dict[str, Any]]] = {}
        aborts: dict[int, list[str]] = {}
        stops = {str(r["id"]): int(r["stop_at"]) for r in sc["requests"] if r.get("stop_at") is not None}

        # each request's own output token: two requests with the same prompt write different
        # blocks, as the simulator's workload says (its hashes cover the prompts alone)
        own = {str(r["id"]): OUT + k for k, r in enumerate(sc["requests"])}

        def sampled(rid: str) -> list[int]:
            req = sched.requests.get(rid)  # (gone: a token after the request finished, dropped)
            return [STOP] if req is not None and req.num_output_tokens + 1 == stops.get(rid) else [own[rid]]

        for r in sc["requests"]:
            by_step.setdefault(int(r["arrive"]), []).append(r)
            if r.get("abort") is not None:
                aborts.setdefault(int(r["abort"]), []).append(str(r["id"]))
        last_event = max([*by_step, *aborts, 0])
        # the steps before which something is added or aborted (an abort before the request's arrival: nothing)
        events = {*by_step, *(int(a) for r in sc["requests"] if (a := r.get("abort")) is not None and a >= r["arrive"])}
        depth = 2 if scheduler.endswith("async") else 1
        steps: list[dict[str, Any]] = []
        tokens: dict[str, int] = {}
        in_flight: deque[tuple[Any, dict[str, bool], dict[str, Any]]] = deque()
        t0 = time.time()
        limits = sc.get("max_num_queued_reqs") is not None or sc.get("max_num_queued_tokens") is not None
        front = Frontend(sc) if limits else None
        unseen: list[Any] = []  # outputs the front end has not processed yet
        clock = StepClock(depth, float(sc.get("empty_step", 0.0))) if sc.get("clock") == "steps" else None
        added: dict[str, float] = {}  # with the clock: each request's arrival time on it
        if clock is not None and getattr(sched, "headway", None) is not None:
            sched.headway.epoch = 0.0
            sched.headway._clock = clock.policy_now
        for step in range(MAX_STEPS):
            for r in by_step.get(step, ()):
                extra = {"headway_score": float(r["score"])} if r.get("score") is not None else {}
                if r.get("tenant") is not None:  # (headway's extra args: the plugin's tenant and tier)
                    extra.update(headway_tenant=str(r["tenant"]), headway_tier=str(r["tier"]))
                params = SamplingParams(
                    max_tokens=int(r["max_tokens"]), ignore_eos=True, stop_token_ids=[STOP], detokenize=False,
                    extra_args=extra or None,
                )  # fmt: skip
                rid, arrival, prio = str(r["id"]), t0 + int(r["seq"]) * 1e-3, int(r.get("priority", 0))
                if clock is not None:
                    arrival = added[rid] = clock.arrival()
                if front is not None and not front.admit(rid, list(r["prompt"]), params, arrival, prio):
                    continue
                sched.add_request(
                    Request(
                        rid, list(r["prompt"]), params, None, arrival_time=arrival, priority=prio, block_hasher=hasher,
                    )
                )  # fmt: skip
            if front is not None and unseen and depth == 1:  # the step's end came after these arrivals
                front.output_processor.process_outputs(unseen)
                unseen = []
            # one call per abort, in the scenario's order, as a server aborts a request when its client
            # goes (finish_requests frees a list of them in a set's order: not reproducible across runs)
            for rid in aborts.get(step, ()):
                if rid in sched.requests:
                    sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                    if front is not None:
                        front.output_processor.abort_requests([rid], internal=True)
            if not sched.has_requests() and not in_flight and step > last_event:
                break
            scheduled = preempted = False
            if sched.has_requests():
                if clock is not None:
                    clock.planning = True
                out = sched.schedule()
                if clock is not None:
                    clock.planning = False
                reqs = sched.requests
                rec = {
                    "step": step,
                    "sched": {
                        rid: [int(n), int(reqs[rid].num_computed_tokens) - int(n)]  # advanced by schedule()
                        for rid, n in out.num_scheduled_tokens.items()
                    },
                    "preempted": sorted(out.preempted_req_ids or ()),
                    "finished": [],
                }
                steps.append(rec)
                preempted = bool(rec["preempted"])
                if out.total_num_scheduled_tokens > 0:
                    scheduled = True
                    chunk = {rid: bool(reqs[rid].is_prefill_chunk) for rid in out.num_scheduled_tokens}
                    in_flight.appendleft((out, chunk, rec))
            if front is not None and unseen and depth > 1 and (scheduled or (step in events and not in_flight)):
                # async: the clock moves on with a batch that starts, or past an idle engine's events
                front.output_processor.process_outputs(unseen)
                unseen = []
            if clock is not None:
                clock.scheduled(scheduled, preempted, step in events)
            if scheduled and len(in_flight) < depth:
                continue
            if not in_flight:
                if clock is not None and depth == 1:
                    clock.output()  # an idle step (or one that only preempted: a hair)
                continue
            if clock is not None:
                clock.output()
            out, chunk, rec = in_flight.pop()
            for eco in sched.update_from_output(out, runner_output(out, chunk, sampled)).values():
                if front is not None:
                    unseen.extend(eco.outputs)
                for o in eco.outputs:
                    tokens[o.request_id] = tokens.get(o.request_id, 0) + len(o.new_token_ids)
                    if o.finish_reason is not None:
                        rec["finished"].append(o.request_id)
            if front is not None and unseen and in_flight:  # async: the next arrivals come after this step
                front.output_processor.process_outputs(unseen)
                unseen = []
        else:
            raise RuntimeError(f"scenario did not drain in {MAX_STEPS} steps")
        reply: dict[str, Any] = {
            "steps": steps, "tokens": tokens, "mro": [c.__name__ for c in type(sched).__mro__[:3]],
            "rejected": front.rejected if front is not None else {},
        }  # fmt: skip
        hw = getattr(sched, "headway", None)
        if hw is not None:
            reply["displaced"] = hw.num_displaced
        if clock is not None:
            reply["arrivals"] = added
        return reply


def main() -> int:
    harness = Harness(sys.argv[1])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        try:
            reply = harness.run(msg["scenario"], msg["scheduler"])
        except Exception as exc:  # reported to the test, which shows it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
