"""The policy registry, the request state machine and the policy-ordered queue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import make_request
from headway.core import (
    InvalidTransition,
    Policy,
    PolicyKey,
    PolicyQueue,
    Request,
    RequestState,
    Tier,
    UnknownPolicyError,
    available_policies,
    get_policy_class,
    make_policy,
    register_policy,
)


def test_builtin_policies_are_registered() -> None:
    assert {"fcfs", "priority", "sjf-oracle", "srpt-oracle"} <= set(available_policies())


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        make_policy("fcsf")
    msg = str(info.value)
    assert "Did you mean 'fcfs'" in msg and "sjf-oracle" in msg


def test_unknown_policy_hints_at_case_and_paper_families() -> None:
    def error(name: str) -> str:
        with pytest.raises(UnknownPolicyError) as info:
            get_policy_class(name)  # a name in another case is not taken silently
        msg = str(info.value)
        assert "\n" not in msg and "Valid policies: " in msg and "sjf-oracle" in msg
        return msg

    assert "Did you mean 'fcfs'?" in error("FCFS")
    assert "Did you mean 'tenant-sjf'?" in error("Tenant_SJF")
    assert "Did you mean 'pars'?" in error("prs")
    tenants = "tenant-fifo, tenant-priority, tenant-weighted, tenant-sjf, tenant-aging"
    for name in ("driftsched", "DriftSched", "drift-sched"):
        assert f"Unknown policy {name!r}. DriftSched is a family of policies: {tenants}. Valid" in error(name)
    assert "Did you mean 'pars'? The PARS family also has sjf-score, ltr, trail. Valid" in error("PARS")
    assert "Did you mean 'uniboost'? The UniBoost family also has distboost, uniboost-base" in error("UniBoost")


def test_paper_families_agree_with_the_plots() -> None:
    from headway.core import PAPER_POLICIES as _PAPERS
    from headway.metrics import POLICY_FAMILIES

    for family, members in _PAPERS.items():
        drawn = {n for n, f in POLICY_FAMILIES.items() if f == family and n != "bands"}  # bands: beside DriftSched
        assert set(members) == drawn, family
        assert set(members) <= set(available_policies()), family


def test_bad_policy_settings_name_the_policy() -> None:
    with pytest.raises(ValueError, match="policy 'fcfs' has no setting 'nonsense'; it takes no settings"):
        make_policy("fcfs", nonsense=1)
    with pytest.raises(ValueError, match=r"policy 'pars' has no setting 'starvation' \(did you mean "
                       r"'starvation_threshold'\?\); its settings: starvation_threshold, scorer, tau"):  # fmt: skip
        make_policy("pars", starvation=5)
    # the tenant policies pass the estimator's settings on to their base class: both are valid
    with pytest.raises(ValueError, match=r"no setting 'wieghts' .*its settings: weights, share, estimator, adaptive"):
        make_policy("tenant-weighted", wieghts=[1, 2, 3])
    assert make_policy("tenant-weighted", weights=[1, 2, 3], alpha=0.5).name == "tenant-weighted"


def test_a_policy_that_reads_its_own_kwargs_is_not_second_guessed() -> None:
    from headway.core._policy import _POLICIES

    class ReadsKwargs(Policy):
        def __init__(self, **settings: object) -> None:
            self.depth = settings.get("depth")

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    _POLICIES.register("test-reads-kwargs")(ReadsKwargs)
    try:
        assert make_policy("test-reads-kwargs", depth=3).depth == 3  # type: ignore[attr-defined]
    finally:
        _POLICIES.unregister("test-reads-kwargs")


def test_duplicate_and_malformed_names_rejected() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @register_policy("fcfs")
        class Again(Policy):
            def key(self, request: Request, now: float) -> PolicyKey:
                return (0,)

    with pytest.raises(ValueError, match="kebab case"):
        register_policy("Bad_Name")


def test_a_class_defined_again_replaces_itself_under_its_name() -> None:
    """A notebook cell that defines and registers a policy can be run again: the new definition (same
    module and qualified name) replaces the old one; another class still cannot take the name."""
    from headway.core._policy import _POLICIES

    def define(tag: int) -> type[Policy]:
        @register_policy("test-redefined")
        class Redefined(Policy):
            def key(self, request: Request, now: float) -> PolicyKey:
                return (tag,)

        return Redefined

    first = define(1)
    try:
        second = define(2)
        assert second is not first
        assert type(make_policy("test-redefined")) is second
        with pytest.raises(ValueError, match="already registered"):

            @register_policy("test-redefined")
            class Other(Policy):
                def key(self, request: Request, now: float) -> PolicyKey:
                    return (0,)

    finally:
        _POLICIES.unregister("test-redefined")


def test_state_machine_rejects_illegal_edges() -> None:
    req = make_request()
    req.transition(RequestState.RUNNING)
    req.transition(RequestState.PREEMPTED)
    req.transition(RequestState.RUNNING)
    req.transition(RequestState.FINISHED)
    with pytest.raises(InvalidTransition, match="FINISHED -> RUNNING"):
        req.transition(RequestState.RUNNING)


@pytest.mark.parametrize(
    ("field", "value"), [("num_prompt_tokens", 0), ("max_tokens", -1), ("arrival_time", float("nan"))]
)
def test_request_rejects_bad_values(field: str, value: float) -> None:
    kw: dict[str, float] = {"arrival_time": 0.0, "num_prompt_tokens": 4, "max_tokens": 4, field: value}
    with pytest.raises(ValueError, match=field):
        Request("bad", **kw)  # type: ignore[arg-type]


def test_tier_parse() -> None:
    assert Tier.parse("Premium") is Tier.PREMIUM and Tier.parse(2) is Tier.BATCH
    assert Tier.parse(" batch ") is Tier.BATCH and Tier.parse(Tier.STANDARD) is Tier.STANDARD
    with pytest.raises(ValueError, match="valid tiers: premium, standard, batch"):
        Tier.parse("gold")


@pytest.mark.parametrize("value", [None, True, False, 1.0, 3, -1, b"premium", ["premium"], {"tier": 0}])
def test_tier_parse_rejects_other_types_with_a_value_error(value: object) -> None:
    # bool is an int to Python, but True is no tier (it used to parse as STANDARD)
    with pytest.raises(ValueError, match=r"^unknown tier .*; valid tiers: premium, standard, batch$"):
        Tier.parse(value)


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 100)), min_size=1, max_size=60),
       st.data())
def test_queue_pops_in_key_then_seq_order(items: list[tuple[int, float]], data: st.DataObject) -> None:
    q = PolicyQueue(make_policy("priority"))
    reqs = []
    for i, (prio, t) in enumerate(items):
        r = make_request(f"r{i}", arrival=t, priority=prio, seq=i)
        reqs.append(r)
        q.add(r, 0.0)
    removed = set(data.draw(st.sets(st.integers(0, len(items) - 1))))
    for i in removed:
        assert q.remove(reqs[i])
    assert len(q) == len(items) - len(removed)
    expected = sorted((r for i, r in enumerate(reqs) if i not in removed),
                      key=lambda r: (r.priority, r.arrival_time, r.seq))
    assert list(q) == expected
    popped = []
    for _ in range(len(expected)):
        head = q.head()  # the request and key peek and peek_key give, in one pass
        assert head is not None and head == (q.peek(), q.peek_key())
        popped.append(q.pop())
    assert popped == expected
    assert q.peek() is None and q.head() is None and not q
    with pytest.raises(IndexError):
        q.pop()


def test_queue_rekeys_everything_when_policy_epoch_changes() -> None:
    class Flip(Policy):
        sign = 1

        def key(self, request: Request, now: float) -> PolicyKey:
            return (self.sign * request.arrival_time,)

    pol = Flip()
    q = PolicyQueue(pol)
    a, b = make_request("a", arrival=1.0, seq=0), make_request("b", arrival=2.0, seq=1)
    q.add(a, 0.0)
    q.add(b, 0.0)
    assert q.peek() is a
    assert not q.refresh(0.0)
    pol.sign = -1
    pol.key_epoch += 1
    assert q.refresh(0.0)
    assert q.peek() is b


def test_policy_hooks_name_exactly_the_hooks_a_class_overrides() -> None:
    import dataclasses

    from headway.core import PolicyHooks, get_policy_class

    fcfs = get_policy_class("fcfs").hooks()
    none = {f.name: False for f in dataclasses.fields(PolicyHooks)}
    assert fcfs == PolicyHooks(**{**none, "stable_displacement": True})
    pars = get_policy_class("pars").hooks()
    assert pars.rekey_at_time and pars.on_arrival and pars.score_of and not pars.on_progress
    assert not pars.expected_output_tokens and pars.stable_displacement
    assert get_policy_class("pars").hooks() is pars  # computed once per class
    for name in available_policies():
        cls = get_policy_class(name)
        hooks = cls.hooks()
        for f in dataclasses.fields(PolicyHooks):
            expected = cls.stable_displacement() if f.name == "stable_displacement" else cls.overrides(f.name)
            assert getattr(hooks, f.name) is expected, (name, f.name)
