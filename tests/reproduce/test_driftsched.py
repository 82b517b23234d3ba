"""``headway reproduce driftsched`` (``headway.reproduce.driftsched``): the load-sensitivity tables and the
starvation check beside the claim rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from factories import have_shared_data, make_request
from headway.core import Request
from headway.reproduce import band_rule
from headway.reproduce.driftsched import (
    STRESS_LOAD,
    STRESS_LOADS,
    _arrival_times,
    _e2e_stats,
    _load_note,
    _load_table,
    _tail_note,
)

TAIL = {"tokens": 250.0, "tail_tokens": 440.0, "tail_long_true": 0.25, "tail_long_est": 0.85, "tail_wait": 0.9}


def _per(changes: dict[float, tuple[float, float]], seeds: int = 3, **sjf_tail: float) -> list[dict[str, Any]]:
    """Per-seed results whose tenant-sjf cuts P50 and P99 by ``changes[load]`` against tenant-fifo (100 s and
    1,000 s at every load); the tails' numbers are ``TAIL``'s, tenant-sjf's overridden by ``sjf_tail``."""
    tail = {**TAIL, "tail_wait_s": 500.0, "tail_wait_other_s": 50.0}
    return [
        {
            "loads": {
                load: {
                    "tenant-fifo": {**tail, "p50": 100.0, "p99": 1000.0},
                    "tenant-sjf": {**tail, **sjf_tail, "p50": 100.0 * (1 - c50), "p99": 1000.0 * (1 - c99)},
                }
                for load, (c50, c99) in changes.items()
            }
        }
        for _ in range(seeds)
    ]


def test_each_load_row_states_its_own_load_and_a_cut_by_sjf_as_positive():
    # every load its own change: a row labelled with another load's value, or 1 - fifo / sjf instead of
    # 1 - sjf / fifo, reads a different figure
    changes = {load: (0.1 * i, -0.5 * i) for i, load in enumerate(STRESS_LOADS, start=1)}
    title, header, rows = _load_table(_per(changes))
    assert header[:3] == ["stress load", "P50 change", "P99 change"]
    assert f"the claim rows run {STRESS_LOAD}x" in title
    assert [r[0] for r in rows] == [f"{load}x" for load in STRESS_LOADS]
    for row, (c50, c99) in zip(rows, changes.values(), strict=True):
        assert row[1] == f"{100 * c50:.1f} % ± 0.0"
        assert row[2] == f"{100 * c99:.1f} % ± 0.0"
        assert row[3] == f"{100 * (1 - c50):.3g} / 100"  # sjf / fifo, as the header says
        assert row[4] == f"{1000 * (1 - c99):.3g} / 1e+03"


def test_a_load_row_is_the_mean_and_sample_sd_over_seeds():
    per = _per({load: (0.0, 0.0) for load in STRESS_LOADS})
    for d, c in zip(per, (0.1, 0.2, 0.3), strict=True):
        d["loads"][STRESS_LOADS[0]]["tenant-sjf"]["p99"] = 1000.0 * (1 - c)
    assert _load_table(per)[2][0][2] == "20.0 % ± 10.0"


def test_the_load_note_applies_the_claim_rule_per_load_and_names_ties():
    changes = {load: (0.0, 0.0) for load in STRESS_LOADS}
    changes[0.9] = (0.4, 0.16)  # in the P99 claim's band
    changes[1.1] = (0.5, -1.0)
    note = _load_note(_per(changes), band_rule(0.16, neutral=0.0))
    assert "16.0 % at 0.9x" in note and "-100.0 % at 1.1x" in note
    assert "reproduced at 0.9x; not reproduced at 0.5x, 0.7x, 1.0x, 1.1x" in note
    assert f"the row keeps {STRESS_LOAD}x" in note
    assert "SJF's P99 E2E is below FIFO's in every seed at 0.9x. " in note
    assert "At 0.5x, 0.7x, 1.0x the two orders tie" in note
    flat = _load_note(_per({load: (0.0, -0.1) for load in STRESS_LOADS}), band_rule(0.16, neutral=0.0))
    assert "below FIFO's in every seed at no load run. No load ties." in flat


@pytest.mark.parametrize(
    "sjf_tail, verdict",
    [
        ({}, "that is starvation, of the requests SJF's estimate ranks long more than of the longest jobs."),
        ({"tail_long_true": 0.95, "tail_long_est": 0.2}, "that is starvation, of the longest jobs."),
        ({"tail_wait": 0.3}, "that is not starvation."),  # queued a small part of its E2E
        ({"tail_wait_other_s": 600.0}, "that is not starvation."),  # queued as long under FIFO
    ],
)
def test_the_starvation_rule_needs_a_queued_tail_that_fifo_would_have_served_sooner(sjf_tail, verdict):
    note = _tail_note(_per({STRESS_LOAD: (0.5, -1.0)}, **sjf_tail))
    assert note.endswith(verdict)
    assert f"At {STRESS_LOAD}x, tenant-sjf's P99 tail" in note


def _finished(i: int, *, e2e: float, waited: float, tokens: int, estimate: float) -> Request:
    req = make_request(f"r{i}", arrival=float(i))
    req.first_scheduled_time = req.arrival_time + waited
    req.finish_time = req.arrival_time + e2e
    req.num_output_tokens = tokens
    req.extra["driftsched.estimate"] = estimate
    return req


def test_the_tail_is_read_from_its_requests_and_compared_with_the_same_requests_in_the_other_run():
    # 100 requests: the last has the longest E2E (the P99 tail alone), a short true output, the largest
    # estimate, and waited 90 of its 100 s; in the other run the same request waited 2 s
    n = 100
    reqs = [_finished(i, e2e=1.0 + i / 10, waited=0.0, tokens=1000 + i, estimate=10.0) for i in range(n - 1)]
    reqs.append(_finished(n - 1, e2e=100.0, waited=90.0, tokens=5, estimate=99.0))
    other = [_finished(i, e2e=1.0, waited=2.0 if i == n - 1 else 0.5, tokens=1, estimate=1.0) for i in range(n)]
    other.reverse()  # matched by request id, not position
    stats = _e2e_stats(reqs, other)
    assert stats["p99"] == pytest.approx(np.percentile([r.e2e_latency for r in reqs], 99))
    assert stats["tail_tokens"] == 5 and stats["tokens"] == pytest.approx(1048.5)
    assert stats["tail_long_true"] == 0.0 and stats["tail_long_est"] == 1.0
    assert stats["tail_wait"] == pytest.approx(0.9) and stats["tail_wait_s"] == pytest.approx(90.0)
    assert stats["tail_wait_other_s"] == pytest.approx(2.0)


def test_each_stress_load_scales_the_same_draws_and_keeps_the_calibration_phase():
    n_cal, n_stress, cap = 200, 2000, 2.0
    times = {load: _arrival_times(n_cal, n_stress, cap, load, seed=3) for load in STRESS_LOADS}
    base = times[STRESS_LOAD]
    for load, t in times.items():
        assert np.array_equal(t[:n_cal], base[:n_cal])  # one calibration phase for every load
        gaps = np.diff(t[n_cal - 1 :])
        np.testing.assert_allclose(gaps, np.diff(base[n_cal - 1 :]) * STRESS_LOAD / load)
        assert n_stress / (t[-1] - t[n_cal - 1]) == pytest.approx(load * cap, rel=0.1)  # the label's rate


@pytest.mark.slow
@pytest.mark.skipif(not have_shared_data(), reason="shared data not present")
def test_the_load_tables_row_at_the_claims_load_is_the_claim_rows_run(tmp_path: Path):
    from headway.reproduce.driftsched import run

    exp = run(tmp_path, quick=True, seeds=(0, 1))
    p50_row, p99_row = exp.rows[2], exp.rows[3]
    _, _, rows = next(t for t in exp.tables if t[0].startswith("SJF vs FIFO by stress load"))
    (at_claim,) = (r for r in rows if r[0] == f"{STRESS_LOAD}x")
    for row, cell in ((p50_row, at_claim[1]), (p99_row, at_claim[2])):
        sd = float(np.std(row.values, ddof=1))
        assert cell == f"{100 * row.measured:.1f} % ± {100 * sd:.1f}"
    e2e = next(t for t in exp.tables if t[0].startswith("E2E latency by policy"))[2]
    by_policy = {r[0]: r for r in e2e}
    assert at_claim[4] == f"{by_policy['tenant-sjf'][2]} / {by_policy['tenant-fifo'][2]}"
    fifo_p50 = {r[0]: float(r[3].split(" / ")[1]) for r in rows}
    assert fifo_p50[f"{min(STRESS_LOADS)}x"] < fifo_p50[f"{STRESS_LOAD}x"]  # each row ran at its own load
    assert any(n.startswith("Is SJF's P99 starvation?") for n in exp.notes)
