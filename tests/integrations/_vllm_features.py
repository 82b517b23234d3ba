"""Drive vLLM's scheduler (or headway's plugin on it) through vLLM features beyond plain text
generation, with no model: structured output waiting for its grammar, LoRA adapters over
``max_loras``, parallel sampling (``n`` child requests of one prompt), aborts of waiting requests,
``reset_prefix_cache``, pause states, and request counts / stats.

Runs in the vLLM virtualenv (``PYTHONPATH`` = this checkout's ``src``)::

    python _vllm_features.py MODEL_DIR < cases.json      # a JSON list of cases; prints a JSON list

A case: ``scheduler`` (as ``_vllm_steps.Harness.build``: ``vllm``, ``vllm-async``, ``headway``,
``headway-async``), engine geometry (as ``_vllm_steps.py``; ``max_loras``: a LoRA config with that
many adapters per batch), ``headway`` settings, ``requests`` (``id``, ``arrive``: the step before
which it is added, ``prompt``, ``max_tokens``; optional ``grammar``: the step before which its
grammar is ready, ``"error"`` for one that fails to compile, or null for one never ready; ``lora``:
an adapter id) and ``events`` (step -> a list of ``["abort", ids]``, ``["reset_prefix_cache"]``,
``["pause", "PAUSED_NEW" | "PAUSED_ALL" | "UNPAUSED"]``). The reply: the
steps (as ``_vllm_steps.py``: ``sched``, ``preempted``, ``finished``), ``counts`` per step
(``get_request_counts``, ``get_num_unfinished_requests``, the stats' ``num_waiting_reqs`` and
``num_skipped_waiting_reqs``, the number of requests the scheduler holds), how often each request
finished (its finishing output), each one's final status, and for the plugin whatever its adapter
still holds after the engine drained.

The async schedulers are driven as ``_vllm_steps.py`` drives them (two batches in flight). With
background scoring a step may schedule nothing while the scorer's thread works: the driver then
waits a millisecond before the next step, as vLLM's engine loop does.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from typing import Any

from _vllm_steps import _HASH, STOP, Harness, runner_output
from vllm.config import LoRAConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.request import Request, RequestStatus

MAX_STEPS = 2_000


class FakeGrammar:
    """A compiled grammar that accepts every token (the scheduler only asks it to)."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False

    def rollback(self, num_tokens: int) -> None:
        pass


def _build(h: Harness, case: dict[str, Any]) -> Any:
    if case.get("max_loras") is None:
        return h.build(case, case["scheduler"])
    import vllm.config as vc

    real = vc.VllmConfig

    def with_lora(*args: Any, **kwargs: Any) -> Any:
        return real(*args, lora_config=LoRAConfig(max_loras=int(case["max_loras"]), max_lora_rank=8), **kwargs)

    import _vllm_steps

    _vllm_steps.VllmConfig = with_lora  # type: ignore[misc]
    try:
        return h.build(case, case["scheduler"])
    finally:
        _vllm_steps.VllmConfig = real  # type: ignore[misc]


def run(h: Harness, case: dict[str, Any]) -> dict[str, Any]:
    sched = _build(h, case)
    hasher = get_request_block_hasher(int(case["block_size"]), _HASH) if case["prefix_caching"] else None
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in case["requests"]:
        by_step.setdefault(int(r["arrive"]), []).append(r)
    events: dict[int, list[list[Any]]] = {int(k): v for k, v in case.get("events", {}).items()}
    grammar_at: dict[int, list[str]] = {}
    for r in case["requests"]:
        g = r.get("grammar", "none")
        if isinstance(g, int):
            grammar_at.setdefault(g, []).append(str(r["id"]))
    last_event = max([*by_step, *events, *grammar_at, 0])
    depth = 2 if case["scheduler"].endswith("async") else 1
    t0 = time.time()
    objs: dict[str, Request] = {}
    steps: list[dict[str, Any]] = []
    counts: list[list[int]] = []
    finishes: dict[str, int] = {}
    in_flight: deque[tuple[Any, dict[str, bool], dict[str, Any]]] = deque()
    for step in range(MAX_STEPS):
        for r in by_step.get(step, ()):
            rid = str(r["id"])
            so = StructuredOutputsParams(json={"type": "object"}) if r.get("grammar", "none") != "none" else None
            params = SamplingParams(
                max_tokens=int(r["max_tokens"]), ignore_eos=True, stop_token_ids=[STOP], detokenize=False,
                structured_outputs=so,
            )  # fmt: skip
            lora = LoRARequest(f"a{r['lora']}", int(r["lora"]), "/nonexistent") if r.get("lora") else None
            req = Request(
                rid,
                list(r["prompt"]),
                params,
                None,
                arrival_time=t0 + int(r["seq"]) * 1e-3,
                lora_request=lora,
                block_hasher=hasher,
            )
            if so is not None:
                assert req.structured_output_request is not None
                req.structured_output_request.reasoning_ended = True
                if r["grammar"] == "error":
                    req.structured_output_request.grammar = ValueError("bad grammar")  # type: ignore[assignment]
                elif r["grammar"] is not None and int(r["grammar"]) <= step:
                    req.structured_output_request.grammar = FakeGrammar()  # type: ignore[assignment]
            objs[rid] = req
            sched.add_request(req)
        for rid in grammar_at.get(step, ()):
            if rid not in objs or objs[rid].arrival_time is None:
                continue
            sor = objs[rid].structured_output_request
            assert sor is not None
            sor.grammar = FakeGrammar()  # type: ignore[assignment]
        for ev in events.get(step, ()):
            if ev[0] == "abort":
                for rid in ev[1]:  # one call per id: finish_requests frees a list in a set's order
                    if rid in sched.requests:
                        sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            elif ev[0] == "reset_prefix_cache":
                sched.reset_prefix_cache(reset_running_requests=True)
            elif ev[0] == "pause":
                sched.set_pause_state(PauseState[ev[1]])
        stats = sched.make_stats()
        counts.append([
            *sched.get_request_counts(), sched.get_num_unfinished_requests(),
            stats.num_waiting_reqs, stats.num_skipped_waiting_reqs, len(sched.requests),
        ])  # fmt: skip
        if not sched.has_requests() and not in_flight and step > last_event:
            break
        scheduled = False
        if sched.has_requests():
            out = sched.schedule()
            reqs = sched.requests
            rec = {
                "step": step,
                "sched": [[rid, int(n), int(reqs[rid].num_computed_tokens) - int(n)]
                          for rid, n in out.num_scheduled_tokens.items()],
                "preempted": sorted(out.preempted_req_ids or ()),
                "finished": [],
            }  # fmt: skip
            steps.append(rec)
            scheduled = out.total_num_scheduled_tokens > 0
            chunk = {rid: bool(reqs[rid].is_prefill_chunk) for rid in out.num_scheduled_tokens}
            in_flight.appendleft((out, chunk, rec))  # (an empty one too: vLLM applies every step's output)
            if len(in_flight) < depth and (scheduled or sched.has_requests()):
                continue
        if not scheduled and step > last_event:
            time.sleep(0.001)  # background scoring: vLLM's engine loop yields between empty steps
        if not in_flight:
            continue
        out, chunk, rec = in_flight.pop()
        for eco in sched.update_from_output(out, runner_output(out, chunk)).values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    rec["finished"].append(o.request_id)
                    finishes[o.request_id] = finishes.get(o.request_id, 0) + 1
    else:
        raise RuntimeError(f"case did not drain in {MAX_STEPS} steps")
    reply: dict[str, Any] = {
        "steps": steps, "counts": counts, "finishes": finishes,
        "status": {rid: r.status.name for rid, r in objs.items()},
        "left": sorted(sched.requests),
    }  # fmt: skip
    hw = getattr(sched, "headway", None)
    if hw is not None:
        reply["adapter"] = {
            "reqs": sorted(hw.reqs), "engine": len(hw.engine), "pending": len(hw._pending),
            "scoring": len(hw._scoring), "queued": [len(q) for q in hw.queues],
            "scored": hw.num_scored,
        }  # fmt: skip
        sched.shutdown()
    return reply


def main() -> int:
    harness = Harness(sys.argv[1])
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        try:
            out.append(run(harness, case))
        except Exception as exc:  # reported to the test, which shows it
            import traceback

            out.append({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
