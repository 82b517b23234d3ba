"""SLO parsing in ``vllm bench serve --goodput`` form and the per-request check."""

from __future__ import annotations

import pytest

from headway.metrics import SLO


def test_parse_cli_string_in_milliseconds() -> None:
    slo = SLO.parse("ttft:500 tpot:50 e2el:2000")
    assert slo == SLO(ttft=0.5, tpot=0.05, e2e=2.0)
    assert slo.to_spec() == "ttft:500 tpot:50 e2el:2000"
    assert SLO.parse(slo.to_spec()) == slo


def test_parse_argparse_list_commas_and_alias() -> None:
    assert SLO.parse(["ttft:500", "e2el:2000"]) == SLO(ttft=0.5, e2e=2.0)
    assert SLO.parse("ttft:250,tpot:20") == SLO(ttft=0.25, tpot=0.02)
    assert SLO.parse("E2E:1500") == SLO(e2e=1.5)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "empty"),
        ("itl:5", "unknown SLO metric"),
        ("ttft", "KEY:VALUE"),
        ("ttft:", "KEY:VALUE"),
        ("ttft:abc", "invalid SLO value"),
        ("ttft:-1", ">= 0"),
        ("ttft:nan", ">= 0"),
        ("ttft:1 ttft:2", "more than once"),
        ("e2e:1 e2el:2", "more than once"),
    ],
)
def test_parse_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SLO.parse(spec)


def test_needs_a_target_and_valid_values() -> None:
    with pytest.raises(ValueError, match="at least one"):
        SLO()
    with pytest.raises(ValueError, match=">= 0"):
        SLO(ttft=-0.1)


def test_is_met_boundaries() -> None:
    slo = SLO(ttft=0.5, tpot=0.05, e2e=2.0)
    assert slo.is_met(0.5, 0.05, 2.0)  # equal to the target meets it (value <= target)
    assert not slo.is_met(0.5000001, 0.05, 2.0)
    assert not slo.is_met(0.1, 0.06, 1.0)
    assert not slo.is_met(0.1, 0.01, 2.1)
    assert slo.is_met(0.1, None, 1.0)  # 1-token output: TPOT counts as 0, as in vLLM
    assert not slo.is_met(None, 0.01, 1.0)  # no first token: TTFT target missed
    assert SLO(tpot=0.05).is_met(None, 0.01, None)  # only given targets matter


def test_dict_round_trip() -> None:
    slo = SLO(tpot=0.04, e2e=3.0)
    assert slo.to_dict() == {"ttft_s": None, "tpot_s": 0.04, "e2e_s": 3.0}
    assert SLO.from_dict(slo.to_dict()) == slo
