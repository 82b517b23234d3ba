from __future__ import annotations

import numpy as np
import pytest

from headway.core import PolicyQueue, Request, Tier, make_policy
from headway.policies import DriftEstimator, classify_prompt

from .conftest import make_request


def test_classify_prompt_rules():
    assert classify_prompt("Please summarize the following article") == "summary"
    assert classify_prompt("Write a Python function that reverses a list") == "technical"
    assert classify_prompt("Write a detailed report on solar power") == "report"
    assert classify_prompt("What is the capital of France?") == "short_qa"
    assert classify_prompt(None, 4000) == "summary"
    assert classify_prompt("anything", category="report") == "report"


def test_estimate_formula_by_hand():
    est = DriftEstimator(tenant_scale={"acme": 2.0})
    r = make_request(prompt_tokens=256 * 16, category="technical", tenant="acme")
    # T_base 384 x B 1 x S 2 x F (16^0.25 = 2)
    assert est.estimate(r) == pytest.approx(384 * 2 * 2)
    est.observe(r, 384 * 2 * 2 * 3)  # observed 3x the base: B <- 0.9 + 0.1 * 3
    assert est.b_runtime["technical"] == pytest.approx(1.2)
    with pytest.raises(ValueError, match="alpha must be in"):
        DriftEstimator(alpha=2.0)


def test_ema_learning_reduces_error_on_drifted_stream():
    rng = np.random.default_rng(0)
    drift = {"short_qa": 1.8, "summary": 0.6, "technical": 1.5, "report": 1.3}
    cats = list(drift)
    static, adaptive = DriftEstimator(adaptive=False), DriftEstimator()
    err_s, err_a = [], []
    for i in range(3000):
        cat = cats[i % 4]
        r = make_request(prompt_tokens=int(rng.integers(50, 2000)), category=cat)
        truth = static.static_estimate(r) * drift[cat] * rng.lognormal(0.0, 0.3)
        if i >= 1000:
            err_s.append(abs(static.estimate(r) - truth))
            err_a.append(abs(adaptive.estimate(r) - truth))
        static.observe(r, round(truth))
        adaptive.observe(r, round(truth))
    assert np.mean(err_a) < 0.8 * np.mean(err_s)  # noise (CV 0.3) is irreducible
    assert adaptive.b_runtime["summary"] == pytest.approx(0.6 * np.exp(0.045), rel=0.15)
    assert static.b_runtime == {c: 1.0 for c in cats}


def test_weighted_tier_shares_are_5_3_2():
    pol = make_policy("tenant-weighted")
    q = PolicyQueue(pol)
    for i in range(300):  # all tiers backlogged at t = 0
        r = make_request(tier=Tier(i % 3), arrival=0.0)
        pol.on_arrival(r, 0.0)
        q.add(r, 0.0)
    served = []
    for _ in range(100):
        r = q.pop()
        pol.on_progress(r, 0.0, 1)
        served.append(r.tier)
    counts = [served.count(t) for t in Tier]
    assert counts == [50, 30, 20]


def test_weighted_idle_tier_does_not_bank_credit():
    pol = make_policy("tenant-weighted", weights={"premium": 1, "standard": 1, "batch": 1})
    first = make_request(tier=Tier.BATCH)
    pol.on_arrival(first, 0.0)
    for _ in range(10):
        r = make_request(tier=Tier.STANDARD)
        pol.on_arrival(r, 0.0)
        pol.on_progress(r, 0.0, 1)
    late = make_request(tier=Tier.PREMIUM)
    pol.on_arrival(late, 1.0)
    assert pol.key(late, 1.0)[0] == pytest.approx(pol.virtual_time)


def test_strict_priority_and_aging_inversion():
    prio = make_policy("tenant-priority")
    aging = make_policy("tenant-aging", rate=1 / 30)
    batch_old = make_request(tier=Tier.BATCH, arrival=0.0)
    premium_new = make_request(tier=Tier.PREMIUM, arrival=70.0)
    premium_soon = make_request(tier=Tier.PREMIUM, arrival=50.0)
    assert prio.key(premium_new, 70.0) < prio.key(batch_old, 70.0)
    # batch waited 70 s = 2.33 tiers of aging: it now outranks a fresh premium request
    assert aging.key(batch_old, 70.0) < aging.key(premium_new, 70.0)
    # but not one that waited 50 s less (gap 50 s = 1.67 tiers < 2)
    assert aging.key(premium_soon, 70.0) < aging.key(batch_old, 70.0)


def test_tenant_sjf_orders_by_estimate_and_fifo_by_arrival():
    sjf = make_policy("tenant-sjf")
    fifo = make_policy("tenant-fifo")
    short = make_request(category="short_qa", arrival=5.0)
    long = make_request(category="report", arrival=1.0)
    for r in (short, long):
        sjf.on_arrival(r, r.arrival_time)
    assert sjf.key(short, 5.0) < sjf.key(long, 5.0)
    assert fifo.key(long, 5.0) < fifo.key(short, 5.0)


def test_unknown_output_count_teaches_nothing_but_finishes():
    pol = make_policy("tenant-sjf")
    r = make_request(category="short_qa")
    pol.on_arrival(r, 0.0)
    r.output_tokens_known = False  # the gateway's flag: no usage in the answer
    pol.on_finish(r, 1.0)
    assert pol.estimator.b_runtime["short_qa"] == 1.0
    known = make_request(category="short_qa")
    pol.on_arrival(known, 0.0)
    pol.on_finish(known, 1.0)  # 0 observed tokens, reported as such: a real observation
    assert pol.estimator.b_runtime["short_qa"] < 1.0


@pytest.mark.parametrize("weights", [[1, 2, 3], (1, 2, 3), [1.0, 2.0, 3.0]])
def test_weighted_accepts_sequences(weights):
    pol = make_policy("tenant-weighted", weights=weights)
    assert pol.weights == {Tier.PREMIUM: 1.0, Tier.STANDARD: 2.0, Tier.BATCH: 3.0}


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ("532", r"weights must be a mapping .* got '532'"),
        (5, r"weights must be a mapping .* got 5"),
        (None, r"weights must be a mapping .* got None"),
        ([1, 2], r"weights needs 3 values .* got \[1, 2\]"),
        ([1, "x", 3], r"weights\[standard\] must be a number, got 'x'"),
        ([1, None, 3], r"weights\[standard\] must be a number, got None"),
        ([1, True, 3], r"weights\[standard\] must be a number, got True"),
        ([1, 0, 3], r"weights\[standard\] must be .*> 0, got 0"),
        ({"premium": 1, "standard": 1, "batch": [2]}, r"weights\[batch\] must be a number, got \[2\]"),
        ({"premium": 1, "standard": 1, None: 2}, r"weights key None: unknown tier None"),
        ({"premium": 1, "standard": 1}, r"weights lack tiers \['batch'\]"),
    ],
)
def test_weighted_rejects_bad_weights_naming_them(weights, match):
    with pytest.raises(ValueError, match=match):
        make_policy("tenant-weighted", weights=weights)


def test_weighted_tags_can_come_from_a_shared_queue():
    """tenant-weighted is a SharedStartTags policy: a queue shared by replicas draws its start tags."""
    from headway.core import SharedStartTags

    p = make_policy("tenant-weighted", weights=[4, 2, 1])
    assert isinstance(p, SharedStartTags) and not isinstance(make_policy("tenant-priority"), SharedStartTags)
    r = Request("b", 0.0, 8, 16, tier=Tier.BATCH)
    assert p.tag_flow(r) == ("batch", 1.0) and p.start_tag(r) is None
    p.on_arrival(r, 0.0)
    assert p.start_tag(r) == 0.0 and p.key(r, 0.0) == (0.0,)
    p.set_start_tag(r, 7.5)  # drawn from the shared state instead
    assert p.start_tag(r) == 7.5 and p.key(r, 1.0) == (7.5,)
    assert p.tag_flow(Request("p", 0.0, 8, 16, tier=Tier.PREMIUM)) == ("premium", 0.25)


@pytest.mark.parametrize("value", ["False", "true", 0, 1, [True]])
def test_adaptive_must_be_a_bool(value):
    with pytest.raises(ValueError, match=r"adaptive must be true or false, got"):
        make_policy("tenant-sjf", adaptive=value)
    with pytest.raises(ValueError, match=r"adaptive must be true or false"):
        DriftEstimator(adaptive=value)


def test_adaptive_false_keeps_b_at_one():
    pol = make_policy("tenant-fifo", adaptive=False)
    r = make_request(category="report")
    pol.on_arrival(r, 0.0)
    r.num_output_tokens = 5000
    pol.on_finish(r, 1.0)
    assert pol.estimator.b_runtime["report"] == 1.0


@pytest.mark.parametrize("alpha", [0, 0.0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_alpha_must_be_in_open_closed_unit_interval(alpha):
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        DriftEstimator(alpha=alpha)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        make_policy("tenant-aging", alpha=alpha)
    assert DriftEstimator(alpha=1).alpha == 1.0


@pytest.mark.parametrize("name", ["tenant-fifo", "tenant-priority", "tenant-weighted", "tenant-sjf", "tenant-aging"])
def test_policies_forward_tenant_scale_and_base_tokens(name):
    base = {"short_qa": 10, "summary": 20, "technical": 30, "report": 40}
    pol = make_policy(name, tenant_scale={"acme": 3}, base_tokens=base, alpha=0.5, adaptive=True)
    est = pol.estimator
    assert est.base == {c: float(v) for c, v in base.items()}
    assert est.tenant_scale == {"acme": 3.0}
    assert est.alpha == 0.5
    r = make_request(category="technical", tenant="acme", prompt_tokens=256)
    assert est.estimate(r) == pytest.approx(30 * 3)


def test_estimator_settings_are_checked():
    base = {"short_qa": 10, "summary": 20, "technical": 30, "report": 40}
    with pytest.raises(ValueError, match=r"base_tokens has unknown categories \['poem'\]"):
        make_policy("tenant-sjf", base_tokens={**base, "poem": 5})
    with pytest.raises(ValueError, match=r"base_tokens lacks categories \['report'\]"):
        make_policy("tenant-sjf", base_tokens={k: v for k, v in base.items() if k != "report"})
    with pytest.raises(ValueError, match=r"base_tokens must be a mapping"):
        make_policy("tenant-sjf", base_tokens=[1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"tenant_scale must be a mapping"):
        make_policy("tenant-sjf", tenant_scale=2.0)
    with pytest.raises(ValueError, match=r"tenant_scale\['acme'\] must be .*> 0"):
        make_policy("tenant-sjf", tenant_scale={"acme": 0})
    with pytest.raises(ValueError, match=r"estimator must be a DriftEstimator, got 'static'"):
        make_policy("tenant-fifo", estimator="static")
    est = DriftEstimator(adaptive=False)
    assert make_policy("tenant-fifo", estimator=est).estimator is est
    for extra in ({"alpha": 0.2}, {"adaptive": True}, {"tenant_scale": {"a": 2}}, {"base_tokens": base}):
        with pytest.raises(ValueError, match=r"either estimator= or the estimator's settings, not both"):
            make_policy("tenant-weighted", estimator=est, **extra)


def test_sjf_rekeys_when_bias_drifts():
    pol = make_policy("tenant-sjf", rekey_every=10)
    q = PolicyQueue(pol)
    # queued under B = 1: a summary (192 tokens x F_input 0.79) and ...
    old = make_request(category="summary", arrival=0.0)
    pol.on_arrival(old, 0.0)
    q.add(old, 0.0)
    # ... short_qa answers come back 10x longer than their budget: B(short_qa) -> ~6.5
    for _ in range(9):
        r = make_request(category="short_qa", arrival=1.0)
        pol.on_arrival(r, 1.0)
        r.num_output_tokens = 640
        pol.on_finish(r, 2.0)
    assert pol.key_epoch == 0  # rate-limited: at most one re-key per 10 learning finishes
    r = make_request(category="short_qa", arrival=1.0)
    pol.on_arrival(r, 1.0)
    r.num_output_tokens = 640
    pol.on_finish(r, 2.0)
    assert pol.key_epoch == 1
    b = pol.estimator.b_runtime["short_qa"]
    assert b > 6.0 and pol.key_b["short_qa"] == b
    # a short_qa request queued now is estimated at 64 x B > 192: it sorts after the old summary,
    # and both keys are on the same (new) scale once the queue re-keys
    new = make_request(category="short_qa", arrival=3.0)
    pol.on_arrival(new, 3.0)
    q.add(new, 3.0)
    q.refresh(3.0)
    assert q.pop() is old
    assert pol.key(new, 3.0) == (pytest.approx(new.extra["driftsched.static"] * b),)
    # small moves (within rekey_drift) do not re-key
    for _ in range(20):
        r = make_request(category="short_qa", arrival=4.0)
        pol.on_arrival(r, 4.0)
        r.num_output_tokens = round(r.extra["driftsched.static"] * b)
        pol.on_finish(r, 5.0)
    assert pol.key_epoch == 1


def test_sjf_keys_stay_on_one_scale_before_a_rekey():
    pol = make_policy("tenant-sjf")
    a = make_request(category="summary", arrival=0.0)
    pol.on_arrival(a, 0.0)
    ka = pol.key(a, 0.0)
    r = make_request(category="summary")
    pol.on_arrival(r, 0.0)
    r.num_output_tokens = 1900
    pol.on_finish(r, 1.0)  # B moves, no re-key yet (rate limit)
    b = make_request(category="summary", arrival=1.0)
    pol.on_arrival(b, 1.0)
    assert pol.key(b, 1.0) == ka  # same static estimate, same snapshot of B
