"""Speed checks before a replay only, or on both sides of it: which predicts the replay better.

``bench_fidelity.py --speed-check N`` replays N requests under fcfs before each measured replay (and,
since 2026-11-30, once more after the last), and simulates each replay with the preset scaled by the
checks' speed. For each measured replay in the kept step logs of such runs (``--workdir``), this
simulates it twice: with the speed of the check just before it, and with the mean of that check and
the one just after it (the next replay's check). It prints both errors against the real replay and
counts, over all the runs given, how many are within ``--within`` (5 %).

A run that replays a policy more than once (``--policies fcfs,pars,fcfs,pars``) also gets two pooled
tables: per policy, the requests of all its bracketed replays together, real against simulated, with
each replay simulated at its checks' speed, and with all of them at one speed for the whole run (the
mean of all its checks). One replay's error mixes the simulator's with the VM's speed moving during
it; pooling averages the second over several replays, spread through the run.

    python benchmarks/fidelity_checks.py DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fidelity_ablation import stats
from fidelity_ttft import load_run, segments
from headway.integrations._probe import FidelityRow, pool_rows, simulate_replay
from headway.sim._calibrate import relative_error, scaled, speed_factor, step_samples

METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90")


def replay_row(policy: str, eng: list[dict], checked: list[tuple[float, float]]) -> FidelityRow:
    """One replay as ``bench_fidelity``'s rows hold it: its real (TTFT, E2E) and those simulated at a
    checked speed, for :func:`pool_rows`."""
    real = [(e["first_token"] - e["added"], e["finish"] - e["added"]) for e in eng]
    return FidelityRow(policy, len(eng), pairs={"real": real, "checked": checked})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdirs", type=Path, nargs="+", help="bench_fidelity.py --speed-check N --workdir DIRs")
    ap.add_argument("--within", type=float, default=0.05, help="the error counted as met (default 0.05)")
    args = ap.parse_args()
    for wd in args.workdirs:
        if not (wd / "steps.jsonl").is_file() or not (wd / "run.json").is_file():
            ap.error(f"{wd}: needs steps.jsonl and run.json from bench_fidelity.py --workdir")
    hits = {k: {m: [0, 0] for m in METRICS} for k in ("before", "bracket")}
    bracketed: list[tuple[str, FidelityRow]] = []  # (run, a policy's replays pooled), each at its checks' speed
    run_wide: list[tuple[str, FidelityRow]] = []  # the same, each replay at the mean speed of all the run's checks
    print("| run | policy | speed (own) | check before / after | " + " | ".join(
        f"{m} err, before / bracketed" for m in METRICS) + " |")  # fmt: skip
    print("|---|---|---:|---:|" + "---:|" * len(METRICS))
    for wd in args.workdirs:
        run, lines, header, preset, specs = load_run(wd)
        segs = segments(lines, run["probe_lines"][1])
        ids = {s.request_id for s in specs}
        replay = [ids <= {r.get("client_id") for r in reqs} for _, _, reqs in segs]
        checks = [speed_factor(preset, step_samples(seg[1])) for seg, r in zip(segs, replay, strict=True) if not r]
        run_speed = sum(checks) / len(checks) if checks else 1.0
        rows_bracketed: list[FidelityRow] = []
        rows_wide: list[FidelityRow] = []
        for i, (policy, steps, reqs) in enumerate(segs):
            if not replay[i] or i == 0 or replay[i - 1]:
                continue  # a check, or a replay without a check just before it
            by = {r.get("client_id"): r for r in reqs}
            eng = [by[s.request_id] for s in specs]
            added = [float(e["added"]) for e in eng]
            real = stats([e["first_token"] - e["added"] for e in eng], [e["finish"] - e["added"] for e in eng])
            before = speed_factor(preset, step_samples(segs[i - 1][1]))
            after = None
            if i + 1 < len(segs) and not replay[i + 1]:
                after = speed_factor(preset, step_samples(segs[i + 1][1]))
            err = {}
            for kind, f in (("before", before), ("bracket", None if after is None else (before + after) / 2)):
                if f is None:
                    continue
                pairs = simulate_replay(added, specs, policy, scaled(preset, f), header)
                sim = stats([t for t, _ in pairs], [e for _, e in pairs])
                err[kind] = {m: relative_error(sim[m], real[m]) for m in METRICS}
                if kind == "bracket":
                    rows_bracketed.append(replay_row(policy, eng, pairs))
                    wide = simulate_replay(added, specs, policy, scaled(preset, run_speed), header)
                    rows_wide.append(replay_row(policy, eng, wide))
            own = speed_factor(preset, step_samples(steps))
            cells = []
            for m in METRICS:
                b = err["before"][m]
                c = err["bracket"][m] if "bracket" in err else None
                cells.append(f"{b:+.1%} / " + ("-" if c is None else f"{c:+.1%}"))
                if c is not None:  # count only replays with both, so the two tallies cover the same ones
                    for kind, e in (("before", b), ("bracket", c)):
                        hits[kind][m][0] += abs(e) <= args.within
                        hits[kind][m][1] += 1
            checks = f"x{before:.2f} / " + ("-" if after is None else f"x{after:.2f}")
            print(f"| {wd.name} | {policy} | x{own:.2f} | {checks} | " + " | ".join(cells) + " |")
        bracketed += [(wd.name, r) for r in pool_rows(rows_bracketed)]
        run_wide += [(wd.name, r) for r in pool_rows(rows_wide)]
    print()
    for kind, label in (("before", "check before only"), ("bracket", "checks before and after")):
        print(f"{label}: " + ", ".join(
            f"{m} {h[0]} of {h[1]} within {args.within:.0%}" for m, h in hits[kind].items()))  # fmt: skip
    if any(r.replays > 1 for _, r in bracketed):  # else the table above says it all
        print_pooled(bracketed, "each replay simulated at the mean speed of the checks on either side", args.within)
        print_pooled(run_wide, "each replay simulated at the mean speed of all the run's checks", args.within)
    return 0


def print_pooled(pooled: list[tuple[str, FidelityRow]], how: str, within: float) -> None:
    """Per run and policy, the requests of all its bracketed replays pooled: real against simulated."""
    print()
    print(f"Pooled over each policy's replays with checks on both sides; {how}:")
    print()
    print("| run | policy | replays | requests | " + " | ".join(f"{m} real / sim (s) | err" for m in METRICS) + " |")
    print("|---|---|---:|---:|" + "---:|---:|" * len(METRICS))
    met = dict.fromkeys(METRICS, 0)
    for run, r in pooled:
        err = r.errors(checked=True)
        cells = []
        for m in METRICS:
            met[m] += abs(err[m]) <= within
            cells.append(f"{r.real[m]:.3f} / {r.sim_checked[m]:.3f} | {err[m]:+.1%}")
        print(f"| {run} | {r.policy} | {r.replays} | {r.num_requests} | " + " | ".join(cells) + " |")
    print()
    print("pooled: " + ", ".join(f"{m} {k} of {len(pooled)} within {within:.0%}" for m, k in met.items()))


if __name__ == "__main__":
    sys.exit(main())
