"""Engine fidelity targets: preemptive policies against FCFS and oracle SJF, prefix caching.

    python benchmarks/bench_engine_fidelity.py [--out FILE.md] [--azure-requests N] [--repeats N]

1. Mean E2E (and P99 TTFT, preemptions, engine steps, simulator events, simulated requests per second) of ``fcfs``,
   ``sjf-oracle`` and the preemptive ``srpt-oracle``, ``trail-oracle``, ``trail``, ``ltr``,
   ``uniboost-base`` on the default workload (2,000 requests) and the Azure conv trace
   (``azure-conv``, replayed at its recorded times), each preemptive policy in its declared
   displacement mode and in the other two (``--policy-arg NAME.displacement=...``), with
   vLLM's engine rules and prefix caching on (the default ``llama3-8b-a100`` preset).
2. ``sharegpt-sessions`` (2,000 turns): prefix-cache hit rate and TTFT with and without
   prefix caching, FCFS and oracle SJF.
3. Async scheduling (``SchedulerConfig.async_scheduling``, vLLM's default on GPUs) against the
   synchronous scheduler of the tables above, on both workloads: ``fcfs``, ``sjf-oracle`` and each
   preemptive policy in its declared mode.

With ``--out FILE.md`` the first two tables are also drawn, next to it (``FILE.png``): each policy's
mean E2E against FCFS's, per displacement mode, on both workloads. A section of the existing file
from ``## Reading the tables`` on (written by hand from its figures) is kept, and the run says so:
check its figures against the new tables.

Every row is one simulation, run ``--repeats`` times (default 3; seeded: every figure but the speed
repeats exactly, which is checked); the requests-per-second column is the fastest run's wall clock,
as ``timeit`` reports, and still moves with the machine's load. "engine steps" counts the engine steps the run
simulated (``SimResult.num_steps``: every decode step of a fast-forwarded stretch is one) and
"events" the simulator's events (``SimResult.num_events``: arrivals, step ends, timers, admissions
after a preemption), so a policy that pauses, evicts and readmits shows the extra work it made the
simulator do per request even where the number of engine steps hardly moves.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headway._files import save_figure, write_atomic
from headway.core import get_policy_class
from headway.metrics import summarize
from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import Workload, load_workload

PREEMPTIVE = ("srpt-oracle", "trail-oracle", "trail", "ltr", "uniboost-base")
MODES = ("none", "pause", "evict")
HAND_WRITTEN = "## Reading the tables"
"""Where the section written by hand from the tables begins (kept when the file is written again)."""

Bar = tuple[str, str, bool, float, int]
"""One bar of the figure: policy, displacement mode, whether declared, mean E2E / FCFS's, preemptions."""


def _kwargs(name: str, workload: Workload) -> dict[str, object]:
    """Score-based policies get the noisy-oracle score `headway simulate` gives them (tau 0.75)."""
    from headway.policies import noisy_oracle_defaults

    if all(s.score is not None for s in workload):
        return {}
    return dict(noisy_oracle_defaults(name, None, tau=0.75, seed=0) or {})


def _row(
    workload: Workload, name: str, mode: str | None, cache: CacheConfig, repeats: int, *, async_scheduling: bool = False
) -> dict[str, object]:
    kw = _kwargs(name, workload)
    if mode is not None:
        kw["displacement"] = mode
    sched = SchedulerConfig(async_scheduling=async_scheduling)
    res = simulate(workload, name, policy_kwargs=kw or None, cache=cache, scheduler=sched)
    fastest = res.wall_time
    for _ in range(repeats - 1):
        again = simulate(workload, name, policy_kwargs=kw or None, cache=cache, scheduler=sched)
        if (again.num_steps, again.num_events) != (res.num_steps, res.num_events) or [
            r.finish_time for r in again.requests
        ] != [r.finish_time for r in res.requests]:
            raise SystemExit(f"{workload.name} {name} {mode}: a repeat decided differently (not reproducible)")
        fastest = min(fastest, again.wall_time)
    s = summarize(res.requests)
    return {
        "e2e": s.e2e.mean,
        "ttft_p99": s.ttft.p99,
        "ttft_mean": s.ttft.mean,
        "preempt": s.num_preemptions,
        "pauses": sum(r.num_pauses for r in res.requests),
        "recomputed": s.num_recomputed_tokens,
        "rps": len(workload) / fastest,
        "steps": res.num_steps,
        "events": res.num_events,
        "hit": res.replicas[0].prefix_cache_hit_rate,
    }


def policy_table(
    workload: Workload, lines: list[str], repeats: int, bars: list[Bar] | None = None
) -> dict[str, dict[str, object]]:
    """The table's rows (each preemptive one also a bar of ``bars``); returns the synchronous rows of
    fcfs, sjf-oracle and each declared mode."""
    cache = CacheConfig()
    base = _row(workload, "fcfs", None, cache, repeats)
    sjf = _row(workload, "sjf-oracle", None, cache, repeats)
    lines += [
        f"### {workload.name}: {len(workload):,} requests over {workload.duration:,.1f} s",
        "",
        "| policy | displacement | E2E mean (s) | vs fcfs | vs sjf-oracle | TTFT p99 (s) | preemptions "
        "(pauses) | recomputed tokens | engine steps | events | simulated req/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def add(name: str, mode: str, r: dict[str, object], declared: bool = False) -> None:
        e2e = float(r["e2e"])  # type: ignore[arg-type]
        label = f"**{mode}** (declared)" if declared else mode
        lines.append(
            f"| {name} | {label} | {e2e:.2f} | {e2e / float(base['e2e']):.3f}x | "  # type: ignore[arg-type]
            f"{e2e / float(sjf['e2e']):.3f}x | {float(r['ttft_p99']):.2f} | {r['preempt']:,} ({r['pauses']:,}) | "  # type: ignore[arg-type]
            f"{r['recomputed']:,} | {r['steps']:,} | {r['events']:,} | {float(r['rps']):,.0f} |"  # type: ignore[arg-type]
        )

    add("fcfs", "-", base)
    add("sjf-oracle", "-", sjf)
    rows = {"fcfs": base, "sjf-oracle": sjf}
    for name in PREEMPTIVE:
        declared = get_policy_class(name).displacement
        for mode in (declared, *[m for m in MODES if m != declared]):
            r = _row(workload, name, mode, cache, repeats)
            add(name, mode, r, declared=mode == declared)
            if bars is not None:
                preempt = r["preempt"]
                assert isinstance(preempt, int)
                bars.append((name, mode, mode == declared, float(r["e2e"]) / float(base["e2e"]), preempt))  # type: ignore[arg-type]
            if mode == declared:
                rows[name] = r
            print(f"{workload.name} {name} {mode}: {float(r['e2e']):.2f} s, {float(r['rps']):,.0f} req/s", flush=True)  # type: ignore[arg-type]
    lines.append("")
    return rows


def async_table(runs: list[tuple[Workload, dict[str, dict[str, object]]]], lines: list[str], repeats: int) -> None:
    """Each policy of ``runs``' synchronous rows again with async scheduling."""
    lines += [
        "### async scheduling (vLLM's default on GPUs) against the synchronous scheduler above",
        "",
        "| workload | policy | E2E mean (s) sync / async | change | TTFT mean (s) sync / async | "
        "TTFT p99 (s) sync / async | preemptions sync / async | simulated req/s async |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, sync_rows in runs:
        for name, s in sync_rows.items():
            mode = None if name in ("fcfs", "sjf-oracle") else get_policy_class(name).displacement
            a = _row(workload, name, mode, CacheConfig(), repeats, async_scheduling=True)
            f = {k: (float(s[k]), float(a[k])) for k in ("e2e", "ttft_mean", "ttft_p99")}  # type: ignore[arg-type]
            lines.append(
                f"| {workload.name} | {name} | {f['e2e'][0]:.2f} / {f['e2e'][1]:.2f} | "
                f"{f['e2e'][1] / f['e2e'][0] - 1:+.1%} | {f['ttft_mean'][0]:.3f} / {f['ttft_mean'][1]:.3f} | "
                f"{f['ttft_p99'][0]:.2f} / {f['ttft_p99'][1]:.2f} | {s['preempt']:,} / {a['preempt']:,} | "
                f"{float(a['rps']):,.0f} |"  # type: ignore[arg-type]
            )
            print(f"{workload.name} {name} async: {f['e2e'][1]:.2f} s", flush=True)
    lines.append("")


def sessions_table(lines: list[str], repeats: int) -> None:
    wl = load_workload("sharegpt-sessions", num_requests=2000)
    lines += [
        f"### sharegpt-sessions: {len(wl):,} turns of {wl.meta['conversations']} conversations",
        "",
        "| policy | prefix caching | hit rate | TTFT mean (s) | TTFT p99 (s) | E2E mean (s) | engine steps "
        "| events | simulated req/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("fcfs", "sjf-oracle"):
        for apc in (True, False):
            r = _row(wl, name, None, CacheConfig(enable_prefix_caching=apc), repeats)
            hit = "-" if r["hit"] is None else f"{float(r['hit']):.1%}"  # type: ignore[arg-type]
            lines.append(
                f"| {name} | {'on' if apc else 'off'} | {hit} | {float(r['ttft_mean']):.3f} | "  # type: ignore[arg-type]
                f"{float(r['ttft_p99']):.3f} | {float(r['e2e']):.2f} | {r['steps']:,} | {r['events']:,} | "  # type: ignore[arg-type]
                f"{float(r['rps']):,.0f} |"  # type: ignore[arg-type]
            )
    lines.append("")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    ap.add_argument("--azure-requests", type=int, default=None, help="first N requests of azure-conv (default all)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per row; req/s is the fastest (default 3)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    cmd = "python benchmarks/bench_engine_fidelity.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()[0]
    lines = [
        "# Engine fidelity: preemptive policies and prefix caching",
        "",
        f"Command: `{cmd.strip()}` (1-minute load average {load:.2f} at the start; 2-core machine; simulated "
        f"req/s: the fastest of {args.repeats} runs of each row, every other figure identical in each run)",
        "",
    ]
    # trail's length refinement imports scipy.special on first use (about 0.2 s): imported here, so
    # the first trail run's req/s is not charged a one-time import
    import scipy.special  # noqa: F401

    default = load_workload("default")
    panels: list[tuple[Workload, float, list[Bar]]] = []
    runs = []
    azure = load_workload("azure-conv", **({"num_requests": args.azure_requests} if args.azure_requests else {}))
    for workload in (default, azure):
        bars: list[Bar] = []
        rows = policy_table(workload, lines, args.repeats, bars)
        runs.append((workload, rows))
        panels.append((workload, float(rows["sjf-oracle"]["e2e"]) / float(rows["fcfs"]["e2e"]), bars))  # type: ignore[arg-type]
    sessions_table(lines, args.repeats)
    async_table(runs, lines, args.repeats)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        png = out.with_suffix(".png")
        plot(panels, png)
        text, kept = with_hand_written(text, out)
        if kept:
            print(f"kept the section of {out} written by hand ({HAND_WRITTEN}...): check its figures against these")
        write_atomic(out, text, encoding="utf-8")
        print(f"wrote {out} and {png}")
    return 0


def with_hand_written(text: str, out: Path) -> tuple[str, bool]:
    """``text`` followed by the section of the file ``out`` written by hand (from :data:`HAND_WRITTEN` on),
    if it has one; and whether it had."""
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    _, mark, rest = old.partition(HAND_WRITTEN)
    if not mark:
        return text, False
    return text.rstrip("\n") + "\n\n" + mark + rest, True


def plot(panels: list[tuple[Workload, float, list[Bar]]], path: Path) -> None:
    """Bars from FCFS's mean E2E (1) to each preemptive policy's, a panel per workload, in each
    displacement mode (the declared one solid and outlined), oracle SJF marked, preemptions at the bars'
    ends; log scale, since a mode that thrashes costs several times FCFS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    colors = {"none": "#4c72b0", "pause": "#dd8452", "evict": "#55a868"}
    fine = (0.8, 0.9, 0.95, 1.0, 1.1, 1.25, 1.5, 2.0)  # (a range within 2.5x)
    coarse = (0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5.2), sharey=True)
    for ax, (workload, sjf, bars) in zip(axes, panels, strict=True):
        ys = list(range(len(bars)))[::-1]
        for y, (_, mode, declared, ratio, preempt) in zip(ys, bars, strict=True):
            ax.barh(y, ratio - 1.0, left=1.0, color=colors[mode], alpha=1.0 if declared else 0.45,
                    edgecolor="black" if declared else "none", linewidth=1.2)  # fmt: skip
            if preempt:
                ax.annotate(f"{preempt:,}", (ratio, y), xytext=(3 if ratio >= 1 else -3, -3),
                            textcoords="offset points", fontsize=7, ha="left" if ratio >= 1 else "right")  # fmt: skip
        ax.axvline(1.0, color="black", linewidth=1, label="fcfs")
        ax.axvline(sjf, color="gray", linewidth=1, linestyle="--", label=f"sjf-oracle ({sjf:.2f}x)")
        ratios = [b[3] for b in bars] + [sjf, 1.0]
        lo, hi = min(ratios) / 1.08, max(ratios) * 1.25
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ticks = fine if hi / lo < 2.5 else coarse
        ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if lo <= t <= hi]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
        ax.set_xlabel("mean E2E / FCFS's (log scale); preemptions at the bars' ends")
        ax.set_title(f"{workload.name}: {len(workload):,} requests", fontsize=10)
        ax.set_yticks(ys, [f"{name} ({mode}{', declared' if declared else ''})" for name, mode, declared, _, _ in bars],
                      fontsize=8)  # fmt: skip
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Preemptive policies under vLLM's engine rules, each displacement mode (declared: solid, outlined)")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_engine_fidelity"))
