"""PolicyQueue: one order over its two stores (the in-order deque and the heap)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import make_request

from headway.core import Policy, PolicyKey, PolicyQueue, Request


class _Keyed(Policy):
    """Keys set by the test (``request.extra['k']``), re-read at every add and refresh."""

    name = "keyed"

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.extra["k"],)  # type: ignore[return-value]


# operations: (op, request index, key)
_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "pop", "peek", "remove", "epoch"]),
        st.integers(0, 11),
        st.integers(0, 5),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_ops, st.booleans())
def test_pops_follow_key_then_seq_whatever_store_holds_them(ops: list[tuple[str, int, int]], in_order: bool) -> None:
    """Against a dict of queued requests read in (key, seq) order: every pop, peek, head and
    length agree, for keys coming in order (the deque's case) and out of order (the heap's), with
    re-adds (a new key), removals and key epochs (a refresh re-keys every request)."""
    pol = _Keyed()
    q = PolicyQueue(pol)
    reqs = [make_request(f"r{i}", seq=i) for i in range(12)]
    model: dict[Request, float] = {}
    clock = 0
    for op, i, k in ops:
        req = reqs[i]
        if op == "add":
            clock += 1
            req.extra["k"] = clock if in_order else k
            q.add(req, 0.0)
            model[req] = req.extra["k"]  # type: ignore[assignment]
        elif op == "remove":
            assert q.remove(req) == (req in model)
            model.pop(req, None)
        elif op == "epoch":
            for r in model:  # new keys for everyone, seen at the next refresh
                r.extra["k"] = -r.extra["k"]  # type: ignore[operator]
                model[r] = r.extra["k"]  # type: ignore[assignment]
            pol.key_epoch += 1
            assert q.refresh(0.0)
        want = min(model, key=lambda r: (model[r], r.seq), default=None)
        if op == "pop" and want is not None:
            assert q.pop() is want
            del model[want]
            want = min(model, key=lambda r: (model[r], r.seq), default=None)
        assert q.peek() is want
        assert q.head() == (None if want is None else (want, (model[want],)))
        assert len(q) == len(model)
        assert list(q) == sorted(model, key=lambda r: (model[r], r.seq))


def test_keys_in_order_never_reach_the_heap() -> None:
    """FCFS's arrivals come in key order: they are appended to the deque and popped from its
    front (O(1), as vLLM's FCFS queue); a request re-added ahead of them (a preempted one) goes
    to the heap, and still comes out first."""
    pol = _Keyed()
    q = PolicyQueue(pol)
    reqs = [make_request(f"r{i}", seq=i) for i in range(5)]
    for i, r in enumerate(reqs):
        r.extra["k"] = float(i)
        q.add(r, 0.0)
    assert q._heap == [] and len(q._run) == 5
    assert [q.pop() for _ in range(3)] == reqs[:3]
    assert q._heap == []
    q.add(reqs[0], 0.0)  # back, ahead of those still queued
    assert len(q._heap) == 1
    assert [q.pop() for _ in range(3)] == [reqs[0], reqs[3], reqs[4]]


def test_stale_entries_are_dropped_as_re_keys_pile_up() -> None:
    """A policy that re-keys waiting requests often (LTR promotes each starving one by a timer)
    leaves the old entries stale in the heap: they are dropped once the heap holds over twice the
    queued requests (plus a little), and the order is the same as a dict read in (key, seq) order."""
    import random

    rng = random.Random(7)
    pol = _Keyed()
    q = PolicyQueue(pol)
    reqs = [make_request(f"r{i}", seq=i) for i in range(20)]
    model: dict[Request, float] = {}
    for r in reqs:
        r.extra["k"] = rng.randrange(50)
        q.add(r, 0.0)
        model[r] = r.extra["k"]  # type: ignore[assignment]
    most = 0
    for step in range(3000):
        r = rng.choice(reqs)
        if step % 7 == 0 and model:
            want = min(model, key=lambda x: (model[x], x.seq))
            assert q.pop() is want
            del model[want]
        else:
            r.extra["k"] = rng.randrange(50)
            q.rekey(r, 0.0)
            model[r] = r.extra["k"]  # type: ignore[assignment]
        most = max(most, len(q._heap))
        assert len(q._heap) <= 2 * len(q) + 65
        assert q.head() == (
            None if not model else min(((r, (k,)) for r, k in model.items()), key=lambda e: (e[1], e[0].seq))
        )
    assert most > 60  # (the bound was reached: without the compaction the heap keeps ~3000 entries)
    assert list(q) == sorted(model, key=lambda r: (model[r], r.seq))
