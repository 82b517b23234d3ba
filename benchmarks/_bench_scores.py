"""A gateway scorer for benchmarks: scores computed beforehand, looked up by prompt text.

``bench_gateway_vllm.py --scorer precomputed`` writes the trained predictor's scores for its
workload to a JSON file named by ``HEADWAY_BENCH_SCORES`` and starts the gateway with
``--scorer _bench_scores:lookup``: the same ranking as the real scorer, without the time
scoring takes, to measure what that time costs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_SCORES: dict[str, float] = json.loads(Path(os.environ["HEADWAY_BENCH_SCORES"]).read_text())


def lookup(prompts: list[str]) -> list[float]:
    return [_SCORES[p] for p in prompts]
