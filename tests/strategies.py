"""Hypothesis strategies for workloads and engine configurations."""

from __future__ import annotations

from hypothesis import strategies as st

from headway.sim import CacheConfig, SchedulerConfig
from headway.workload import RequestSpec, Workload


@st.composite
def workloads(draw: st.DrawFn, max_requests: int = 25) -> Workload:
    n = draw(st.integers(1, max_requests))
    specs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.2, 1.0, 3.0]))
        specs.append(
            RequestSpec(
                f"r{i}", t, draw(st.integers(1, 300)), draw(st.integers(1, 200)),
                priority=draw(st.integers(0, 2)),
                # a client's timeout: often none, at times one that cuts the request off
                timeout=draw(st.sampled_from([None, None, None, None, 0.0, 0.01, 0.05, 0.3, 2.0])),
            )
        )
    return Workload.from_specs("hyp", specs)


@st.composite
def engine_configs(draw: st.DrawFn) -> tuple[SchedulerConfig, CacheConfig]:
    seqs = draw(st.integers(1, 16))
    chunked = draw(st.booleans())
    sched = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(max(seqs, 16), 512)),
        max_num_seqs=seqs,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 64])) if chunked else 0,
        long_prefill_token_threshold_adaptive=draw(st.booleans()),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        max_num_active_seqs=draw(st.one_of(st.none(), st.integers(1, seqs))),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2, 0.5])),
        max_num_queued_reqs=draw(st.sampled_from([None, None, None, 0, 1, 3, 8])),
        max_num_queued_tokens=draw(st.sampled_from([None, None, None, 0, 50, 400])),
    )
    cache = CacheConfig(num_gpu_blocks=draw(st.integers(2, 64)))
    return sched, cache
