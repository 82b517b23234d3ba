"""Service-level objectives, with the ``vllm bench serve --goodput`` syntax."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SLO"]

_MS = 1000.0
# CLI key -> SLO field. "e2el" is vLLM's spelling; "e2e" is accepted as an alias.
_KEYS: dict[str, str] = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e", "e2e": "e2e"}


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets in **seconds**; ``None`` means no target for that metric.

    A request meets the SLO when it finished (not aborted) and every given target
    holds with ``value <= target``. As in vLLM, a request with fewer than two output
    tokens has no TPOT and counts as TPOT 0, so it always meets a TPOT target.
    """

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "e2e"):
            value = getattr(self, name)
            if value is not None and not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"SLO target {name} must be a finite number >= 0, got {value!r}")
        if self.ttft is None and self.tpot is None and self.e2e is None:
            raise ValueError("an SLO needs at least one of ttft, tpot, e2e")

    @classmethod
    def parse(cls, spec: str | Sequence[str]) -> SLO:
        """Parse ``vllm bench serve --goodput`` pairs, values in **milliseconds**.

        ``"ttft:500 tpot:50 e2el:2000"`` (or the list ``["ttft:500", "tpot:50"]`` that
        ``argparse`` makes of ``nargs="+"``) gives ``SLO(ttft=0.5, tpot=0.05, e2e=2.0)``.
        Pairs may also be separated by commas. Keys: ``ttft``, ``tpot``, ``e2el``
        (alias ``e2e``).
        """
        items = [spec] if isinstance(spec, str) else list(spec)
        tokens = [tok for item in items for tok in item.replace(",", " ").split()]
        if not tokens:
            raise ValueError("empty SLO spec; expected pairs like 'ttft:500 tpot:50 e2el:2000'")
        targets: dict[str, float] = {}
        for tok in tokens:
            key, sep, raw = tok.partition(":")
            key = key.strip().lower()
            if not sep or not raw:
                raise ValueError(f"invalid SLO pair {tok!r}; expected KEY:VALUE with the value in milliseconds")
            if key not in _KEYS:
                raise ValueError(f"unknown SLO metric {key!r} in {tok!r}; valid: ttft, tpot, e2el")
            try:
                value_ms = float(raw)
            except ValueError:
                raise ValueError(f"invalid SLO value {raw!r} in {tok!r}; expected milliseconds") from None
            if not (value_ms >= 0.0 and math.isfinite(value_ms)):
                raise ValueError(f"SLO value must be a finite number >= 0 ms, got {tok!r}")
            field = _KEYS[key]
            if field in targets:
                raise ValueError(f"SLO metric {key!r} given more than once")
            targets[field] = value_ms / _MS
        return cls(**targets)

    def to_spec(self) -> str:
        """The ``--goodput`` form, e.g. ``"ttft:500 tpot:50 e2el:2000"`` (milliseconds)."""
        parts = []
        for key, value in (("ttft", self.ttft), ("tpot", self.tpot), ("e2el", self.e2e)):
            if value is not None:
                parts.append(f"{key}:{value * _MS:g}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, float | None]:
        """Targets in seconds (keys ``ttft_s``, ``tpot_s``, ``e2e_s``)."""
        return {"ttft_s": self.ttft, "tpot_s": self.tpot, "e2e_s": self.e2e}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SLO:
        def get(key: str) -> float | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, int | float):
                raise TypeError(f"SLO {key} must be a number, got {value!r}")
            return float(value)

        return cls(ttft=get("ttft_s"), tpot=get("tpot_s"), e2e=get("e2e_s"))

    def is_met(self, ttft: float | None, tpot: float | None, e2e: float | None) -> bool:
        """Whether one finished request's metrics (seconds) meet every given target.

        A missing TTFT or E2E latency fails its target; a missing TPOT counts as 0.
        """
        if self.ttft is not None and (ttft is None or ttft > self.ttft):
            return False
        if self.tpot is not None and tpot is not None and tpot > self.tpot:
            return False
        return not (self.e2e is not None and (e2e is None or e2e > self.e2e))
