"""``HEADWAY_HUNT``: the differential tests' switch from their fixed scenarios to random ones (and,
with ``,wide``, larger ones); no vLLM needed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from integrations._stepdiff import HUNT_ENV, drawn, hunt, scenarios


@pytest.mark.parametrize(("value", "read"), [("", None), ("1500", (1500, False)), (" 400 , wide ", (400, True))])
def test_the_switch_reads_a_count_and_an_optional_wide(
    value: str, read: tuple[int, bool] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HUNT_ENV, value)
    assert hunt() == read
    s = drawn(300)
    if read is None:
        assert s.derandomize and s.max_examples == 300
    else:
        assert not s.derandomize and s.max_examples == read[0]


@pytest.mark.parametrize("value", ["0", "many", "10,deep", "10,", ",wide", "-3"])
def test_a_bad_switch_is_named(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HUNT_ENV, value)
    with pytest.raises(ValueError, match=f"{HUNT_ENV} must be a number of scenarios >= 1.*got {value!r}"):
        drawn()


@pytest.mark.parametrize("wide", [False, True])
def test_a_wide_hunt_draws_larger_scenarios(wide: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HUNT_ENV, "10,wide" if wide else "10")
    seen: list[dict[str, Any]] = []

    @settings(max_examples=300, derandomize=True, database=None)
    @given(scenarios())
    def draw(sc: dict[str, Any]) -> None:
        seen.append(sc)

    draw()
    most = max(len(sc["requests"]) for sc in seen)
    latest = max(r["arrive"] for sc in seen for r in sc["requests"])
    blocks = {sc["block_size"] for sc in seen}
    if wide:
        assert 10 < most <= 24 and 30 < latest <= 80 and len(blocks) > 1
    else:
        assert most <= 10 and latest <= 30 and blocks == {16}
