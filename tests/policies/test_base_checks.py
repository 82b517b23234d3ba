"""The shared parameter checks of ``policies._base`` and the noisy-oracle settings of score-ranked policies."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core import make_policy
from headway.policies import NoisyOracleScorer, NoisyOracleSettings
from headway.policies._base import check_nonneg, check_positive

from .conftest import make_request

SCORED = ["pars", "sjf-score", "trail", "ltr", "rank-boost"]


@pytest.mark.parametrize(
    ("check", "bound"), [(check_positive, "a finite number > 0"), (check_nonneg, "a finite number >= 0")]
)
@pytest.mark.parametrize(
    "value", [10**400, -(10**400), math.inf, -math.inf, math.nan], ids=["1e400", "-1e400", "inf", "-inf", "nan"]
)
def test_a_value_no_float_holds_is_refused_by_name(check, bound, value):
    with pytest.raises(ValueError, match=rf"^pars: starvation_threshold must be {bound}, got "):
        check("starvation_threshold", value, "pars")


def test_an_overflowing_starvation_threshold_is_a_value_error_naming_it():
    for value in (10**400, float("inf")):
        with pytest.raises(ValueError, match=r"^pars: starvation_threshold must be a finite number > 0, got "):
            make_policy("pars", starvation_threshold=value)


@given(st.one_of(st.integers(min_value=1, max_value=10**300), st.floats(min_value=1e-300, max_value=1e300)))
def test_check_positive_still_takes_every_finite_positive_number(value):
    assert check_positive("x", value, "p") == float(value)
    assert check_nonneg("x", value, "p") == float(value)


@pytest.mark.parametrize("value", [True, "1", None])
def test_check_positive_still_refuses_what_is_not_a_number(value):
    with pytest.raises(ValueError, match=r"^p: x must be a number, got "):
        check_positive("x", value, "p")


def _callable_scorer(request):
    return 1.0


@pytest.mark.parametrize("policy", SCORED)
@pytest.mark.parametrize(
    ("scorer", "what"),
    [(None, r"scorer=None \(request\.score\)"), (_callable_scorer, "a callable scorer")],
)
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"tau": 0.3}, "tau=0.3 is"),
        ({"seed": 9}, "seed=9 is"),
        ({"log_mean": float("nan")}, "log_mean=nan is"),
        ({"log_std": -5}, "log_std=-5 is"),
        ({"tau": 0.3, "seed": 9, "log_std": -5}, "tau=0.3, seed=9, log_std=-5 are"),
    ],
)
def test_noisy_oracle_settings_for_another_scorer_are_refused_by_name(policy, scorer, what, settings, named):
    with pytest.raises(ValueError, match=rf"^{policy}: {re.escape(named)} only used by scorer='noisy-oracle'; {what}"):
        make_policy(policy, scorer=scorer, **settings)


@pytest.mark.parametrize("settings", [{"seed": 3}, {"log_mean": 4.0}, {"log_std": 2.0}])
def test_the_exact_oracle_refuses_the_noise_settings(settings):
    with pytest.raises(ValueError, match=r"^pars: .* only used by scorer='noisy-oracle'; scorer='oracle' \(exact\)"):
        make_policy("pars", scorer="oracle", **settings)


@pytest.mark.parametrize("policy", SCORED)
def test_settings_at_their_defaults_are_accepted_with_any_scorer(policy):
    defaults = {"tau": None, "seed": 0, "log_mean": 5.0, "log_std": 1.0}
    assert make_policy(policy, **defaults).scorer is None
    assert make_policy(policy, scorer=_callable_scorer, **defaults).scorer is _callable_scorer
    assert make_policy(policy, scorer="oracle", **{**defaults, "tau": 1}).oracle


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_std": -5}, "log_std must be a finite number > 0, got -5"),
        ({"log_std": 0.0}, "log_std must be a finite number > 0, got 0.0"),
        ({"log_std": math.inf}, "log_std must be a finite number > 0, got inf"),
        ({"log_std": "1"}, "log_std must be a number, got '1'"),
        ({"log_mean": math.nan}, "log_mean must be a finite number, got nan"),
        ({"log_mean": -math.inf}, "log_mean must be a finite number, got -inf"),
        ({"log_mean": True}, "log_mean must be a number, got True"),
        ({"tau": "0.5"}, "tau must be in [-1.0, 1.0], got '0.5'"),
        ({"tau": math.nan}, "tau must be in [-1.0, 1.0], got nan"),
    ],
)
def test_noisy_oracle_settings_are_checked_up_front_by_name(settings, message):
    with pytest.raises(ValueError, match=f"^pars: {re.escape(message)}$"):
        make_policy("pars", scorer="noisy-oracle", **{"tau": 0.5, **settings})


@pytest.mark.parametrize("seed", [1.7, 2.0, "3", "x", True, None])
def test_a_seed_that_is_not_an_integer_is_refused_by_name(seed):
    with pytest.raises(ValueError, match=f"^pars: seed must be an integer, got {re.escape(repr(seed))}$"):
        make_policy("pars", scorer="noisy-oracle", tau=0.5, seed=seed)
    with pytest.raises(ValueError, match=f"^seed must be an integer, got {re.escape(repr(seed))}$"):
        NoisyOracleScorer(0.5, lambda r: 1, seed=seed)


def test_a_bad_seed_from_the_command_line_is_named(capsys):
    from headway.cli import main

    argv = ["simulate", "--policies", "pars", "--policy-arg", "pars.seed=x", "--num-requests", "20", "--no-report"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "pars: seed must be an integer, got 'x'" in captured.out + captured.err


def test_an_integer_seed_picks_the_noise():
    def scores(seed):
        pol = make_policy("pars", scorer="noisy-oracle", tau=0.5, seed=seed)
        pol.bind_oracle(lambda r: 100)
        reqs = [make_request(rid=f"q{i}") for i in range(5)]
        return [pol.score_of(r) for r in reqs]

    assert scores(-2) == scores(-2) and scores(-2) != scores(1)
    assert scores(1) != scores(2)  # was: a seed of 1.7 was truncated to 1


def test_noisy_oracle_settings_name_what_is_off_default_and_check_by_name():
    settings = NoisyOracleSettings(tau=0.5, seed=3, log_mean=5.0, log_std=2)
    assert settings.given() == ["tau=0.5", "seed=3", "log_std=2"]
    assert settings.given("log_mean", "log_std") == ["log_std=2"]
    assert NoisyOracleSettings().given() == [] and NoisyOracleSettings(log_mean=True).given() == ["log_mean=True"]
    checked = settings.checked("pars")
    assert checked == NoisyOracleSettings(0.5, 3, 5.0, 2.0) and isinstance(checked.log_std, float)
    with pytest.raises(ValueError, match=r"^pars: scorer='noisy-oracle' needs tau"):
        NoisyOracleSettings().checked("pars")
    with pytest.raises(AttributeError):
        settings.tau = 0.9  # type: ignore[misc]  # frozen


@pytest.mark.parametrize("policy", ["pars", "trail", "ltr", "rank-boost"])
def test_scored_policies_take_the_noisy_oracle_settings_through_to_the_base(policy):
    p = make_policy(policy, scorer="noisy-oracle", tau=0.5, seed=4, log_mean=4.0, log_std=0.5)
    r = make_request()
    p.bind_oracle(lambda req: 100)
    expected = NoisyOracleScorer(0.5, lambda req: 100, seed=4, log_mean=4.0, log_std=0.5)(r)
    assert p.oracle and p.score_of(r) == expected
    with pytest.raises(ValueError, match="tau_typo"):
        make_policy(policy, scorer="noisy-oracle", tau_typo=0.5)
