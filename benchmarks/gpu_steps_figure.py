"""How well the presets predict the GPU step times: predicted / measured for every timed step.

Reads the step timings ``benchmarks/bench_gpu_steps.py`` wrote (the H200's and the H100's, each a
fitted set and a held-out set) and draws, per GPU, each step's predicted time over its measured time
against the measured time: the preset fitted to that GPU's timings (its held-out steps hollow: the
fit never saw them) and the datasheet roofline preset ``llama3-8b-h100``. Markers tell prefill,
decode and mixed steps apart. Writes ``benchmarks/results/gpu_steps.png`` (overwritten).

    python benchmarks/gpu_steps_figure.py [--out benchmarks/results/gpu_steps.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headway._files import save_figure
from headway.sim import load_preset
from headway.sim._timings import compare_timings, read_step_timings

RESULTS = Path(__file__).resolve().parent / "results"
ROOFLINE = "llama3-8b-h100"
GPUS = (
    # (panel title, fitted timings, held-out timings, the preset fitted to them)
    ("NVIDIA H200", "gpu_steps.json", "gpu_steps_holdout.json", "llama3-8b-h200"),
    ("NVIDIA H100 80GB HBM3", "gpu_steps_h100.json", "gpu_steps_h100_holdout.json", "llama3-8b-h100-fit"),
)
MARKERS = {"prefill": "o", "decode": "s", "mixed": "^"}
COLORS = {"fitted": "tab:blue", "roofline": "tab:orange"}


def panel_points(fitted: Path, holdout: Path, preset: str) -> list[tuple[str, str, bool, float, float]]:
    """(which preset, kind, held out, measured ms, predicted / measured) for every timed step."""
    models = {"fitted": load_preset(preset), "roofline": load_preset(ROOFLINE)}
    points = []
    for path, held_out in ((fitted, False), (holdout, True)):
        for row in compare_timings(read_step_timings(path), list(models.values())):
            for which, model in models.items():
                points.append((which, row["kind"], held_out, row["measured_s"] * 1e3, row[model.name]["ratio"]))
    return points


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_steps.png")
    args = ap.parse_args(argv)

    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    fig = Figure(figsize=(13, 5.2), layout="constrained")
    axes = fig.subplots(1, len(GPUS), sharey=True)
    for ax, (title, fitted, holdout, preset) in zip(axes, GPUS, strict=True):
        for which, kind, held_out, ms, ratio in panel_points(RESULTS / fitted, RESULTS / holdout, preset):
            color = COLORS[which]
            ax.scatter(ms, ratio, marker=MARKERS[kind], s=30, linewidths=1.0, edgecolors=color,
                       facecolors="none" if held_out else color, alpha=0.85)  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhspan(0.8, 1.25, color="0.9", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step time (ms)")
        ax.set_title(f"{title}: fitted preset {preset}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("predicted / measured")
    ticks = [0.7, 0.8, 1.0, 1.25, 1.5, 2.0]
    axes[0].set_yticks(ticks, [f"{t:g}" for t in ticks])
    axes[0].yaxis.set_minor_locator(NullLocator())  # (the log scale's own labels would crowd these)
    handles = [Line2D([], [], linestyle="none", marker="o", color=COLORS["fitted"], label="fitted preset"),
               Line2D([], [], linestyle="none", marker="o", color=COLORS["roofline"], label=f"roofline {ROOFLINE}"),
               Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="0.3",
                      label="held-out steps (hollow)")]  # fmt: skip
    handles += [Line2D([], [], linestyle="none", marker=m, color="0.3", label=k) for k, m in MARKERS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small")
    fig.suptitle("Step-time presets against a Llama-3-8B-shaped decoder timed on GPUs (shaded: within 0.8-1.25x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, args.out, dpi=100, metadata={"Software": None})
    print(args.out)
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "gpu_steps_figure"))
