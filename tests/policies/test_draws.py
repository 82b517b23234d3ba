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
from headway.policies._draws import (
    _next_output_draw,
    _ziggurat_tables,
    first_outputs,
    normal_from_state,
    normals_from_states,
    seed_states,
)
from headway.policies._draws import _State as _GivenState
from headway.policies._scoring import _digest, _digests, request_normal, request_normals, request_seed_states
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


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(-(2**63), 2**63),
    ids=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30), max_size=12),
    salt=st.sampled_from(["", "score", "trail", "\x1f"]),
)
def test_bulk_digests_hash_each_id_as_digest_does(seed: int, ids: list[str], salt: str):
    # the shared prefix hashed once and copied per id: the bytes of one hash per id, in order
    assert _digests(seed, ids, salt) == b"".join(_digest(seed, i, salt) for i in ids)


def test_bulk_draws_on_many_workload_ids():
    ids = [f"azure-conv-{i}" for i in range(4000)]
    states = request_seed_states(0, ids, "score")
    assert [normal_from_state(states[i]) for i in ids] == [request_normal(0, i, "score") for i in ids]
    digest = hashlib.blake2b(b"0\x1fscore\x1fazure-conv-0", digest_size=8).digest()  # the hash request_normal seeds
    words = np.frombuffer(digest, dtype="<u4")
    assert states["azure-conv-0"].tolist() == np.random.SeedSequence(words).generate_state(4, np.uint64).tolist()


def _random_states(n: int, seed: int) -> np.ndarray:
    words = np.random.default_rng(seed).integers(0, 2**32, size=(n, 2), dtype=np.uint64).astype(np.uint32)
    return seed_states(np.concatenate([words, np.array(_EDGES, dtype=np.uint32)]))


def test_first_outputs_are_pcg64s_first_raw_outputs():
    states = _random_states(3000, 1)
    raw = first_outputs(states)
    assert raw.dtype == np.uint64
    want = [int(np.random.PCG64(_GivenState(s)).random_raw()) for s in states]  # type: ignore[arg-type]
    assert raw.tolist() == want


def test_bulk_normals_equal_normal_from_state_on_and_off_the_fast_path():
    """Every draw, fast path or not (about 1.5 % are not: each layer's tail or wedge), equals numpy's
    own, sign of zero included."""
    states = _random_states(40000, 2)
    got = normals_from_states(states)
    want = np.array([normal_from_state(s) for s in states])
    assert got.tobytes() == want.tobytes()
    _, ki = _ziggurat_tables()
    raw = first_outputs(states)
    idx = (raw & np.uint64(255)).astype(np.intp)
    slow = ((raw >> np.uint64(9)) & np.uint64(2**52 - 1)) >= ki[idx]
    assert 0.005 < slow.mean() < 0.03  # both paths taken
    assert normals_from_states(np.zeros((0, 4), dtype=np.uint64)).shape == (0,)


def test_bulk_normals_fall_back_to_numpy_when_the_fast_path_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables that no longer match numpy's generator (as a future numpy could make them) are caught by
    the guard draws: every state is then drawn by numpy itself."""
    import headway.policies._draws as draws

    wi, ki = _ziggurat_tables()
    monkeypatch.setattr(draws, "_ziggurat_tables", lambda: (wi * (1.0 + 1e-12), ki))
    states = _random_states(500, 3)
    want = np.array([normal_from_state(s) for s in states])
    assert draws.normals_from_states(states).tobytes() == want.tobytes()


def test_ziggurat_tables_are_numpys():
    """The tables read back from numpy's generator: layer 0's and 2's fast-path bounds and layer 1,
    never fast (numpy's ziggurat_constants.h: ki_double 0x000EF33D8025EF6A, 0, 0x000C08BE98FBC6A8),
    and every fast layer's bound is exact: one below it is fast, it is not."""
    wi, ki = _ziggurat_tables()
    assert [int(k) for k in ki[:3]] == [0x000EF33D8025EF6A, 0, 0x000C08BE98FBC6A8]
    bits = np.random.PCG64(0)
    gen = np.random.Generator(bits)
    for idx in range(0, 256, 5):
        k = int(ki[idx])
        for rabs, fast in ((k - 1, True), (k, False)):
            if 0 <= rabs < 2**52:
                x, took_one = _next_output_draw(bits, gen, rabs << 9 | idx)  # (numpy's draw, its next output set)
                assert took_one is fast
                if fast:
                    assert x == rabs * wi[idx]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), ids=st.lists(st.text(max_size=20), max_size=12), salt=st.sampled_from(["", "score"]))
def test_request_normals_equal_request_normal(seed: int, ids: list[str], salt: str):
    draws = request_normals(seed, ids, salt)
    assert list(draws) == list(dict.fromkeys(ids))
    for rid in ids:
        assert draws[rid] == request_normal(seed, rid, salt)


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
