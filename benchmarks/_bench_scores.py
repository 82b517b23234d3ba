"""A gateway scorer for benchmarks: scores computed beforehand, looked up by prompt text.

``bench_gateway_vllm.py --scorer precomputed`` writes the trained predictor's scores for its
workload to a JSON file named by ``HEADWAY_BENCH_SCORES`` and starts the gateway with
``--scorer _bench_scores:lookup``: the same ranking as the real scorer, without the time
scoring takes, to measure what that time costs. ``--scorer precomputed@MS`` looks them up through
:func:`delayed` instead, which sleeps ``HEADWAY_BENCH_SCORE_MS`` milliseconds per prompt first
(``precomputed@MS/batch``: ``HEADWAY_BENCH_SCORE_BATCH_MS`` per call, whatever its size): the same
ranking, delivered late, but without using a CPU.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_SCORES: dict[str, float] = json.loads(Path(os.environ["HEADWAY_BENCH_SCORES"]).read_text())


def lookup(prompts: list[str]) -> list[float]:
    return [_SCORES[p] for p in prompts]


def delayed(prompts: list[str]) -> list[float]:
    per_prompt = float(os.environ.get("HEADWAY_BENCH_SCORE_MS", "0"))
    per_call = float(os.environ.get("HEADWAY_BENCH_SCORE_BATCH_MS", "0"))
    time.sleep((per_call + per_prompt * len(prompts)) / 1e3)
    return lookup(prompts)
