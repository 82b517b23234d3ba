"""A rekey hint (``Policy.rekey_after_tokens``) is armed ``max(int(hint), 1)`` decode steps ahead:
the decode clock reports a ``progress_at_hints`` policy's progress there, at every step for a hint
below one, and a hint due with the request's finish is not reported apart from it."""

from __future__ import annotations

import pytest

from headway.core import Policy, PolicyKey, Request
from headway.sim import SchedulerConfig, simulate
from headway.workload import RequestSpec, Workload


class _Hinted(Policy):
    """Asks to be re-keyed every ``hint`` tokens and records the output count at each report."""

    progress_at_hints = True

    def __init__(self, hint: float) -> None:
        self.hint = hint
        self.reports: list[int] = []

    def key(self, request: Request, now: float) -> PolicyKey:
        return (request.seq,)

    def on_progress(self, request: Request, now: float, num_new_tokens: int) -> None:
        self.reports.append(request.num_output_tokens)

    def rekey_after_tokens(self, request: Request) -> int | None:
        return self.hint  # type: ignore[return-value]  # (a float, zero or below: the engine's rounding)


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize(("hint", "every"), [(3, 3), (2.9, 2), (4.0, 4), (1, 1), (0.5, 1), (0, 1), (-4, 1)])
def test_a_hint_is_armed_its_whole_tokens_ahead_and_at_least_one(hint: float, every: int, exact: bool) -> None:
    out = 12
    wl = Workload.from_specs("one", [RequestSpec("a", 0.0, 16, out)])
    pol = _Hinted(hint)
    sched = SchedulerConfig(max_steps_per_event=1 if exact else 1 << 30)
    res = simulate(wl, pol, scheduler=sched)
    assert res.requests[0].num_output_tokens == out
    # the prefill's token, each hint before the last token, then the finish
    assert pol.reports == [*range(1, out, every), out]


class _HintedOne(_Hinted):
    """Asks to be re-keyed every ``hint`` tokens for request ``a`` alone (no hint at 0)."""

    def rekey_after_tokens(self, request: Request) -> int | None:
        return int(self.hint) if request.request_id == "a" and self.hint else None


@pytest.mark.parametrize("hint", [0, 10])
def test_a_hint_of_a_request_that_finished_does_not_cut_the_others_stretch(hint: int) -> None:
    # a finishes after 2 tokens with its hint armed 10 ahead; b decodes on alone: its stretch runs to
    # its own finish, as if a had asked for no hint (the dead entry is not a point where anything changes)
    wl = Workload.from_specs("two", [RequestSpec("a", 0.0, 16, 2), RequestSpec("b", 0.0, 16, 50)])
    sched = SchedulerConfig(max_steps_per_event=1 << 30)
    res, plain = simulate(wl, _HintedOne(hint), scheduler=sched), simulate(wl, _HintedOne(0), scheduler=sched)
    assert [r.finish_time for r in res.requests] == [r.finish_time for r in plain.requests]
    assert res.num_events == plain.num_events
