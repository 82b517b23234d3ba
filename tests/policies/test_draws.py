"""The noise draws in bulk (policies/_draws.py, request_seed_states, on_workload) against the
one-at-a-time request_normal: the same values bit for bit, so the same decisions."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core import Policy, make_policy
from headway.policies import NoisyOracleScorer
from headway.policies._draws import normal_from_state, seed_states
from headway.policies._scoring import request_normal, request_seed_states
from headway.sim import SimResult, simulate
from headway.workload import load_workload

from .conftest import make_request

_EDGES = [[0, 0], [1, 0], [0, 1], [2**32 - 1, 0], [0, 2**32 - 1], [2**32 - 1, 2**32 - 1], [0x80000000, 7]]


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=30))
def test_seed_states_are_seed_sequences_generated_states(rows: list[tuple[int, int]]):
    words = np.array(rows + [tuple(e) for e in _EDGES], dtype=np.uint32)
    states = seed_states(words)
    assert states.shape == (len(words), 4) and states.dtype == np.uint64 and states.flags.c_contiguous
    for w, got in zip(words, states, strict=True):
        assert got.tolist() == np.random.SeedSequence(w).generate_state(4, np.uint64).tolist()


def test_seed_states_refuses_other_shapes_and_takes_none():
    with pytest.raises(ValueError, match="shape"):
        seed_states(np.zeros(4, dtype=np.uint32))
    assert seed_states(np.zeros((0, 2), dtype=np.uint32)).shape == (0, 4)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(-(2**63), 2**63),
    ids=st.lists(st.text(max_size=30), max_size=12, unique=True),
    salt=st.sampled_from(["", "score", "trail"]),
)
def test_bulk_draws_equal_request_normal(seed: int, ids: list[str], salt: str):
    states = request_seed_states(seed, ids, salt)
    assert list(states) == ids
    for rid in ids:
        assert normal_from_state(states[rid]) == request_normal(seed, rid, salt)


def test_bulk_draws_on_many_workload_ids():
    ids = [f"azure-conv-{i}" for i in range(4000)]
    states = request_seed_states(0, ids, "score")
    assert [normal_from_state(states[i]) for i in ids] == [request_normal(0, i, "score") for i in ids]
    digest = hashlib.blake2b(b"0\x1fscore\x1fazure-conv-0", digest_size=8).digest()  # the hash request_normal seeds
    words = np.frombuffer(digest, dtype="<u4")
    assert states["azure-conv-0"].tolist() == np.random.SeedSequence(words).generate_state(4, np.uint64).tolist()


def test_a_primed_noisy_oracle_scores_as_an_unprimed_one():
    reqs = [make_request(rid=f"q{i}") for i in range(300)]
    truth = {r: 10 + 7 * i for i, r in enumerate(reqs)}
    plain = NoisyOracleScorer(0.6, truth.__getitem__, seed=4)
    primed = NoisyOracleScorer(0.6, truth.__getitem__, seed=4)
    primed.prime([r.request_id for r in reqs[:200]])  # the rest are drawn one at a time
    assert [primed(r) for r in reqs] == [plain(r) for r in reqs]
    assert not primed._normals  # each prepared draw is used once, then let go


def _unprimed(name: str, **kwargs: object) -> Policy:
    """``make_policy(name, **kwargs)`` with Policy's default on_workload (the simulator skips it)."""
    pol = make_policy(name, **kwargs)
    cls = type(pol)
    pol.__class__ = type(f"Unprimed{cls.__name__}", (cls,), {"on_workload": Policy.on_workload})
    assert cls.hooks().on_workload and not type(pol).hooks().on_workload
    return pol


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("trail", {"scorer": "noisy-oracle", "tau": 0.5, "seed": 3}),
        ("ltr", {"scorer": "noisy-oracle", "tau": 0.7, "seed": 1, "displacement": "evict"}),
        ("trail-oracle", {"noise": 0.5, "seed": 2}),
    ],
)
def test_on_workload_changes_no_decision(name: str, kwargs: dict[str, object]):
    wl = load_workload("default", num_requests=500, rate=20.0)
    ref = simulate(wl, _unprimed(name, **kwargs))
    got = simulate(wl, make_policy(name, **kwargs))

    def outcome(res: SimResult) -> list[tuple[object, ...]]:
        return [
            (r.request_id, r.first_token_time, r.finish_time, r.num_preemptions, r.num_pauses) for r in res.requests
        ]

    assert outcome(got) == outcome(ref)
    assert outcome(got) != outcome(simulate(wl, "fcfs"))  # the keys (the draws) decided something
