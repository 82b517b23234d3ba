"""``benchmarks/gpu_steps_figure.py``: the committed GPU step timings drawn against the presets."""

from __future__ import annotations

import json
import math
from pathlib import Path

from factories import load_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_every_timed_step_is_drawn_against_both_presets(tmp_path: Path) -> None:
    fig = load_script("benchmarks/gpu_steps_figure.py")
    for _, fitted, holdout, preset in fig.GPUS:
        points = fig.panel_points(RESULTS / fitted, RESULTS / holdout, preset)
        steps = [len(json.loads((RESULTS / f).read_text(encoding="utf-8"))["points"]) for f in (fitted, holdout)]
        assert len(points) == 2 * sum(steps)  # each step once for the fitted preset, once for the roofline
        assert sum(held for _, _, held, _, _ in points) == 2 * steps[1]
        assert {which for which, *_ in points} == {"fitted", "roofline"}
        assert {kind for _, kind, *_ in points} == {"prefill", "decode", "mixed"}
        # the roofline overestimates every kind on average; the fitted preset is within 0.8-1.25x on the whole
        for which, low, high in (("fitted", 0.8, 1.25), ("roofline", 1.1, 2.5)):
            ratios = [r for w, _, _, _, r in points if w == which]
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            assert low < geo < high, (preset, which, geo)
    out = tmp_path / "steps.png"
    assert fig.main(["--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
