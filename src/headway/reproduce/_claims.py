"""Claim rows: a paper's claim, what headway ran, the value over seeds, and a verdict from a fixed rule.

A row's verdict comes from a :class:`Rule` written in code before any run (never tuned to the
outcome): *reproduced* when the mean over seeds lies inside a two-sided band around the paper's
figure, *direction only* when it lies on the claimed side of "no effect" but outside the band,
*not reproduced* otherwise. A row never picks the best of several runs: its value is the mean
over seeds of one metric, with the spread shown beside it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ClaimRow", "Rule", "Verdict", "band_rule"]


class Verdict(enum.Enum):
    """Outcome of a claim row."""

    REPRODUCED = "reproduced"
    DIRECTION_ONLY = "direction only"
    NOT_REPRODUCED = "not reproduced"


@dataclass(frozen=True, slots=True)
class Rule:
    """Verdict rule, fixed before the run.

    ``lo <= mean <= hi``: reproduced (``hi`` may be infinite only for a claim that gives no
    figure, only a direction; the row then says so). Otherwise, every seed strictly on the claimed
    side of ``neutral`` (above it when ``higher_is_claim``, below it otherwise): direction only.
    Anything else: not reproduced. ``neutral=None``: a claim of *no* change (throughput kept), with
    no direction to fall back on: in the band or not reproduced.
    """

    lo: float
    hi: float
    neutral: float | None
    higher_is_claim: bool = True

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            if math.isnan(getattr(self, name)):
                raise ValueError(f"Rule.{name} must be a number, got nan")
        if self.neutral is not None and not math.isfinite(self.neutral):
            raise ValueError(f"Rule.neutral must be finite or None, got {self.neutral!r}")
        if self.lo > self.hi:
            raise ValueError(f"Rule band is empty: lo ({self.lo}) > hi ({self.hi})")
        if self.neutral is None:
            return
        inside = self.lo > self.neutral if self.higher_is_claim else self.hi < self.neutral
        if not inside:
            side = "above" if self.higher_is_claim else "below"
            raise ValueError(f"Rule band [{self.lo}, {self.hi}] must lie {side} neutral ({self.neutral})")

    def verdict(self, values: Sequence[float]) -> Verdict:
        """Verdict on seed ``values``: the band is checked on their mean; the direction needs the mean
        *and every seed* on the claimed side of ``neutral``."""
        arr = np.asarray(values, dtype=float)
        if arr.size == 0 or not np.isfinite(arr).all():
            return Verdict.NOT_REPRODUCED
        mean = float(arr.mean())
        if self.lo <= mean <= self.hi:
            return Verdict.REPRODUCED
        if self.neutral is None:
            return Verdict.NOT_REPRODUCED
        if bool((arr > self.neutral).all() if self.higher_is_claim else (arr < self.neutral).all()):
            return Verdict.DIRECTION_ONLY
        return Verdict.NOT_REPRODUCED

    def describe(self, unit: str = "") -> str:
        side = ">" if self.higher_is_claim else "<"
        ref = self.neutral
        if math.isinf(self.hi):
            band = f">= {_num(self.lo, unit, ref)}"
        elif math.isinf(self.lo):
            band = f"<= {_num(self.hi, unit, ref)}"
        else:
            band = f"in [{_num(self.lo, unit, ref)}, {_num(self.hi, unit, ref)}]"
        if self.neutral is None:
            return f"reproduced if the mean is {band}; otherwise not reproduced"
        return f"reproduced if the mean is {band}; direction only if every seed is {side} {_num(self.neutral, unit)}"


def band_rule(paper_lo: float, paper_hi: float | None = None, *, neutral: float, factor: float = 1.5) -> Rule:
    """The band ``[paper_lo / factor, paper_hi * factor]`` around a figure (or a range) measured as an
    effect above ``neutral`` (a speedup against 1, a reduction against 0); for a figure below
    ``neutral`` the band is mirrored through ``neutral`` so it widens away from it both ways.
    """
    hi = paper_lo if paper_hi is None else paper_hi
    if factor < 1.0:
        raise ValueError(f"factor must be >= 1, got {factor}")
    if paper_lo > hi:
        raise ValueError(f"paper range is reversed: {paper_lo} > {hi}")
    if paper_lo > neutral:
        lo_eff, hi_eff = paper_lo - neutral, hi - neutral
        return Rule(neutral + lo_eff / factor, neutral + hi_eff * factor, neutral, True)
    if hi < neutral:
        lo_eff, hi_eff = neutral - hi, neutral - paper_lo
        return Rule(neutral - hi_eff * factor, neutral - lo_eff / factor, neutral, False)
    raise ValueError(f"paper figure {paper_lo}..{hi} must lie on one side of neutral ({neutral})")


_MAX_DIGITS = 6


def _num(x: float, unit: str, neutral: float | None = None) -> str:
    """``x`` for a row: a percentage to 0.1, else 3 significant digits, more (up to 6) where ``x`` lies
    close to ``neutral``, so that its *effect* ``x - neutral`` keeps 3: a band edge of 1.0067x printed
    as "1.01x" stated a rule the code does not apply, and a mean of 1.0016x printed as "1x"."""
    if unit == "%":
        return f"{100 * x:.1f} %"
    return f"{x:.{_digits(x, neutral)}g}{unit}"


def _digits(x: float, neutral: float | None) -> int:
    if neutral is None or not math.isfinite(x) or x == neutral or x == 0.0:
        return 3
    extra = math.floor(math.log10(abs(x))) - math.floor(math.log10(abs(x - neutral)))
    return min(3 + max(extra, 0), _MAX_DIGITS)


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """One claim of a paper against headway's measurement.

    ``claim``: the paper's claim (metric, setting, figure) as the paper states it; ``source``:
    where (figure, table, section). ``paper``: the paper's figure in the unit of ``values`` (the
    low end of a range; ``paper_hi`` its high end). ``setting``: what headway ran for this row.
    ``values``: the measured value of each seed (>= 1). ``unit``: ``"%"`` for fractions shown as
    percentages, ``"x"`` for ratios, ``""`` otherwise. ``reason``: for a row that did not
    reproduce, what the measurements say about why (filled by the experiment, not guessed).
    """

    experiment: str
    claim: str
    source: str
    paper: float
    setting: str
    values: tuple[float, ...]
    rule: Rule
    unit: str = ""
    paper_hi: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"claim row {self.claim!r}: no measured values")

    @property
    def measured(self) -> float:
        """Mean over seeds (the value the verdict is taken on)."""
        return float(np.mean(self.values))

    @property
    def spread(self) -> tuple[float, float, float]:
        """(sample std, min, max) over seeds (std 0 for one seed)."""
        arr = np.asarray(self.values, dtype=float)
        std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
        return std, float(arr.min()), float(arr.max())

    @property
    def verdict(self) -> Verdict:
        return self.rule.verdict(self.values)

    @property
    def reproduced(self) -> bool:
        return self.verdict is Verdict.REPRODUCED

    @property
    def ratio(self) -> float:
        """Measured mean / the paper's figure (its low end for a range)."""
        if self.paper == 0 or not math.isfinite(self.measured):
            return math.nan
        return self.measured / self.paper

    def paper_text(self) -> str:
        lo = _num(self.paper, self.unit)
        return lo if self.paper_hi is None else f"{lo} - {_num(self.paper_hi, self.unit)}"

    def measured_text(self) -> str:
        std, lo, hi = self.spread
        if self.unit == "%":
            return f"{100 * self.measured:.1f} % ± {100 * std:.1f} ({100 * lo:.1f} to {100 * hi:.1f})"
        ref = self.rule.neutral
        return f"{_num(self.measured, self.unit, ref)} ± {std:.2g} ({_num(lo, '', ref)} to {_num(hi, '', ref)})"
