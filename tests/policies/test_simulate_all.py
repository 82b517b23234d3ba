"""Every registered policy runs a small simulation to completion."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from headway.core import Tier, available_policies, make_policy
from headway.policies import noisy_oracle_defaults
from headway.sim import CacheConfig, simulate
from headway.workload import RequestSpec, Workload

# Settings that make a small run exercise more of a policy (refits, warm-up, noise); every other
# registered policy runs with its defaults, score-based ones with a noisy-oracle score (as `headway simulate`).
SMALL_RUN_SETTINGS: dict[str, dict[str, object]] = {
    "pars": {"tau": 0.7},
    "sjf-score": {"tau": 0.5},
    "ltr": {"tau": 0.6},
    "trail": {"tau": 0.7},
    "trail-oracle": {"noise": 0.3},
    "uniboost": {"refit_every": 20, "min_samples": 40},
    "rank-boost": {"tau": 0.7, "warmup": 32, "refit_every": 10},
}


def _settings(name: str) -> dict[str, object]:
    given = SMALL_RUN_SETTINGS.get(name, {})
    return noisy_oracle_defaults(name, given, tau=0.75, seed=0) or dict(given)


def test_small_run_settings_name_registered_policies():
    assert set(SMALL_RUN_SETTINGS) <= set(available_policies())


def _workload(n: int = 150, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.03, n))
    arrivals[: n // 3] = 0.0  # a burst, then Poisson arrivals
    specs = [
        RequestSpec(
            f"r{i}",
            float(arrivals[i]),
            int(rng.integers(16, 1500)),
            int(min(max(rng.lognormal(4.5, 1.0), 1), 2000)),
            tier=Tier(i % 3),
            prompt=["What is 2+2?", "Summarize this text", "Write python code", "Write a detailed report"][
                i % 4
            ],
        )
        for i in range(n)
    ]
    return Workload.from_specs("mixed", specs)


@pytest.mark.parametrize("name", available_policies())
def test_policy_runs_every_request_to_completion_exactly_once(name):
    wl = _workload()
    settings = _settings(name)
    base = type(make_policy(name, **settings))
    finished: Counter[str] = Counter()

    class Counting(base):  # type: ignore[valid-type,misc]
        def on_finish(self, req, now):  # type: ignore[no-untyped-def]
            finished[req.request_id] += 1
            super().on_finish(req, now)

    pol = Counting(**settings)
    # a small KV cache forces memory preemptions, exercising choose_victim
    res = simulate(wl, pol, preset="llama3-8b-a100", cache=CacheConfig(num_gpu_blocks=900))
    assert all(r.state.name == "FINISHED" for r in res.requests)
    assert set(finished) == {s.request_id for s in wl} and set(finished.values()) == {1}
    out = {s.request_id: s.num_output_tokens for s in wl}
    assert all(r.num_output_tokens == out[r.request_id] for r in res.requests)


def test_runs_are_bit_reproducible():
    wl = _workload(80, seed=3)
    a = simulate(wl, "pars", policy_kwargs={"scorer": "noisy-oracle", "tau": 0.5, "seed": 4})
    b = simulate(wl, "pars", policy_kwargs={"scorer": "noisy-oracle", "tau": 0.5, "seed": 4})
    assert [r.finish_time for r in a.requests] == [r.finish_time for r in b.requests]
