"""Plot styles: one colour per policy family, one line style per run within it, for every policy."""

from __future__ import annotations

from headway.core import available_policies, get_policy_class
from headway.metrics import POLICY_FAMILIES, plot_latency_cdfs, run_styles
from headway.sim import simulate
from headway.workload import load_workload


def test_every_builtin_policy_has_a_family() -> None:
    # policies other tests register (their modules are not headway's) draw as "other"
    builtin = {n for n in available_policies() if get_policy_class(n).__module__.startswith("headway.")}
    assert sorted(builtin - set(POLICY_FAMILIES)) == []


def test_all_policies_get_distinct_styles_and_one_colour_per_family() -> None:
    styles = run_styles(available_policies())
    assert sorted(styles) == sorted(available_policies())
    pairs = [(color, str(ls)) for color, ls, _ in styles.values()]
    assert len(set(pairs)) == len(pairs)
    colour_of: dict[str, set[str]] = {}
    for color, _, family in styles.values():
        colour_of.setdefault(family, set()).add(color)
    assert all(len(c) == 1 for c in colour_of.values())
    colours = [next(iter(c)) for c in colour_of.values()]
    assert len(set(colours)) == len(colours)


def test_runs_are_drawn_grouped_by_family() -> None:
    styles = run_styles(["sjf-oracle", "pars", "fcfs", "mine", "uniboost", "pars (tau=0.6)", "tenant-sjf"])
    assert list(styles) == ["fcfs", "pars", "pars (tau=0.6)", "uniboost", "tenant-sjf", "sjf-oracle", "mine"]
    assert [f for _, _, f in styles.values()] == ["baseline", "PARS", "PARS", "UniBoost", "DriftSched", "oracle",
                                                    "other"]
    assert styles["pars"][0] == styles["pars (tau=0.6)"][0] and styles["pars"][1] != styles["pars (tau=0.6)"][1]


def test_the_cdf_legend_names_each_run_with_its_family_in_family_order() -> None:
    wl = load_workload("default", num_requests=40)
    runs = {name: simulate(wl, name).requests for name in ("sjf-oracle", "fcfs")}
    fig = plot_latency_cdfs(runs)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["baseline: fcfs", "oracle: sjf-oracle"]
    lines = fig.axes[0].get_lines()
    assert [line.get_color() for line in lines] == [run_styles(runs)[n][0] for n in ("fcfs", "sjf-oracle")]
