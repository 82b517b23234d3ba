"""Drive ``HeadwayAsyncScheduler`` in-process the way vLLM's engine core drives an async scheduler.

Run with the vLLM virtualenv's python (``PYTHONPATH`` = this checkout's ``src``)::

    python _async_harness.py MODEL_DIR POLICY[,POLICY...] LENGTHS_JSON

vLLM's CPU platform forces ``async_scheduling = False``, so no live server runs the async class
here. This builds it from a real ``VllmConfig`` (the tiny Llama's config; no model weights are
run) and drives it with ``EngineCore.step_with_batch_queue``'s order: up to two batches in
flight, the next one scheduled before the previous one's output is applied, each request's
output one token per step (none for a partial prefill chunk). Prints one JSON line per policy:
the class's MRO names, each request's output tokens, and the order requests finished.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from headway.integrations.vllm import HeadwayAsyncScheduler

BLOCK = 16


def run(model_dir: str, policy: str, lengths: list[int]) -> dict[str, object]:
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=False)
    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_seqs=2, max_num_batched_tokens=256, max_model_len=256, enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        model_config=ModelConfig(model=model_dir, dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=256),
        cache_config=cache,
        additional_config={"headway": {"policy": policy, "oracle": "max_tokens"}},
    )  # fmt: skip
    cfg.scheduler_config.async_scheduling = True  # the CPU platform turned it off; the scheduler reads it only for PP
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=200, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cache.num_gpu_blocks = 200
    sched = HeadwayAsyncScheduler(
        vllm_config=cfg, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(cfg),
        block_size=BLOCK, log_stats=True,
    )  # fmt: skip
    now = time.time()
    for i, n in enumerate(lengths):
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        sched.add_request(Request(f"r{i}", [1] * 20, params, None, arrival_time=now + i * 1e-6))
    tokens: dict[str, int] = {}
    finished: list[str] = []
    in_flight: deque[tuple[object, dict[str, bool]]] = deque()
    while sched.has_requests() or in_flight:
        if sched.has_requests() and len(in_flight) < 2:
            out = sched.schedule()
            if out.total_num_scheduled_tokens > 0:
                chunk = {rid: sched.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens}
                in_flight.appendleft((out, chunk))
                if len(in_flight) < 2:
                    continue
        if not in_flight:
            continue
        out, chunk = in_flight.pop()
        ids = list(out.num_scheduled_tokens)  # type: ignore[attr-defined]
        result = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
            sampled_token_ids=[[] if chunk[r] else [7] for r in ids],
        )  # fmt: skip
        for eco in sched.update_from_output(out, result).values():
            for o in eco.outputs:
                tokens[o.request_id] = tokens.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished.append(o.request_id)
    mro = [c.__name__ for c in type(sched).__mro__[:3]]
    return {"policy": policy, "mro": mro, "tokens": tokens, "finished": finished}


def main() -> int:
    model_dir, policies, lengths = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    for policy in policies:
        print(json.dumps(run(model_dir, policy, lengths)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
