"""``headway simulate`` (``headway.sim._cli``): what the run says about its own settings."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from headway.cli import main

FLEET = ["simulate", "--policies", "fcfs", "--num-requests", "60", "--replicas", "2", "--no-report"]


@pytest.mark.parametrize("router", ["prefix-aware", "cache-aware"])
def test_a_prefix_router_without_block_hashes_says_it_routes_by_load(
    router: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*FLEET, "--router", router]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"router {router}: no request of workload default carries prefix block hashes" in out
    assert "--system-prompts K" in out


def test_a_prefix_router_with_the_prefix_cache_off_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*FLEET, "--router", "prefix-aware", "--system-prompts", "2"]
    assert main(argv) == 0
    assert "prefix cache off" not in capsys.readouterr().out  # hashes and a cache: nothing to say
    assert main([*argv, "--no-enable-prefix-caching"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--no-enable-prefix-caching turns the replicas' prefix cache off" in out


def test_the_report_records_the_workload_flags_arrivals_and_policy_settings(tmp_path: Path) -> None:
    # a report that names only the seed cannot be rerun: the rate and the policy settings go with it
    out = tmp_path / "rep"
    argv = ["simulate", "--policies", "fcfs,pars", "--num-requests", "80", "--rate", "9", "--out", str(out),
            "--policy-arg", "pars.starvation_threshold=30"]  # fmt: skip
    assert main(argv) == 0
    text = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    assert "workload default: 80 requests (--seed 0 --num-requests 80 --rate 9.0; arrivals GammaArrivals(rate=9" in text
    assert "--policy-arg pars.starvation_threshold=30" in text


@pytest.mark.parametrize("tau", ["2", "-1.5", "nan"])
def test_a_scorer_tau_out_of_range_is_told_as_that_flag(tau: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policies", "fcfs,pars", "--num-requests", "20", "--scorer-tau", tau, "--no-report"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--scorer-tau must be a Kendall tau in [-1, 1]" in err and "--policy-arg" not in err


@pytest.mark.parametrize("error", [KeyError, ValueError, RuntimeError])
def test_a_user_policy_that_raises_fails_alone_saying_where(
    error: type[Exception], capsys: pytest.CaptureFixture[str]
) -> None:
    # a policy of the user's that raises (a KeyError, or an error of the kinds headway's own
    # settings raise) in on_arrival is that policy's failure, told in one line with the place in
    # the user's file, as docs/policies/index.md says; the other policies' results stand
    from headway.core import Policy, PolicyKey, Request
    from headway.core._policy import _POLICIES

    class Raises(Policy):
        def on_arrival(self, request: Request, now: float) -> None:
            raise error("oops")

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    _POLICIES.register("test-raises")(Raises)
    try:
        code = main(["simulate", "--policies", "fcfs,test-raises", "--num-requests", "20", "--no-report"])
    finally:
        _POLICIES.unregister("test-raises")
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert "fcfs: 20 requests" in out
    message = str(error("oops"))
    assert f"policy test-raises failed: {error.__name__}: {message} (raised at {__file__}:" in out
    assert "in on_arrival)" in out


def test_headway_s_own_errors_keep_their_traceback() -> None:
    from headway.core import make_policy
    from headway.sim._cli_notes import raised_outside_headway

    with pytest.raises(ValueError) as caught:
        make_policy("fcfs", nonsense=1)
    assert raised_outside_headway(caught.value) is None


def test_runs_do_not_depend_on_the_interpreter_s_hash_seed(tmp_path: Path) -> None:
    """Every built-in policy, and a fleet behind the prefix-aware router, decide the same
    under two string-hash seeds: nothing iterates a set or dict of strings where order matters."""
    import json
    import os
    import subprocess
    import sys

    def run(seed: str, *argv: str) -> tuple[str, dict[str, bytes]]:
        out = tmp_path / f"{seed}-{abs(hash(argv))}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        cmd = [sys.executable, "-m", "headway", "simulate", "--num-requests", "300", "--system-prompts", "3",
               "--out", str(out), *argv]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        summary["meta"].pop("command", None)
        return json.dumps(summary, sort_keys=True), {p.name: p.read_bytes() for p in sorted(out.glob("*.csv"))}

    for argv in (("--policies", "all"), ("--replicas", "3", "--router", "prefix-aware")):
        assert run("0", *argv) == run("4242", *argv), argv


def test_a_run_that_livelocks_fails_alone_with_the_stall_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ltr's rotation (20-step starvation, 3-step quantum) with one slot, 8-token chunks and 22 blocks:
    # the simulator stops it with SimulationStalled instead of running for ever; fcfs's result stands
    rows = [(0.2, 11, 199), (0.21, 279, 160), (3.21, 125, 181), (4.21, 198, 90), (4.26, 169, 58),
            (7.26, 107, 59), (7.31, 112, 90), (8.31, 247, 123), (8.32, 274, 54)]  # fmt: skip
    trace = tmp_path / "livelock.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{46 + t:010.7f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    code = main([
        "simulate", "--workload", str(trace), "--policies", "ltr,fcfs", "--policy-arg", "ltr.starvation_steps=20",
        "--policy-arg", "ltr.quantum_steps=3", "--max-num-seqs", "1", "--long-prefill-token-threshold", "8",
        "--watermark", "0.2", "--num-gpu-blocks", "22", "--block-size", "16", "--no-report",
    ])  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert "fcfs: 9 requests" in out
    assert "policy ltr failed: SimulationStalled: request 'livelock-8' was evicted 1,000 times in a row" in out


def test_a_run_ordered_mostly_by_pars_starvation_guard_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # the default load queues requests for seconds: with a 5 s guard most of them are promoted, each
    # then ahead of the ranked ones, and the table's pars row is its guard's order more than its ranking's
    argv = ["simulate", "--policies", "fcfs,pars", "--no-report"]
    assert main([*argv, "--policy-arg", "pars.starvation_threshold=5"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pars: 1,089 of 2,000 requests (54%) waited out its starvation threshold (5 s)" in out
    assert "--policy-arg pars.starvation_threshold=SECONDS" in out
    assert main(argv) == 0  # its default 120 s: none waits that long at this load
    assert "starvation threshold" not in capsys.readouterr().out


def test_the_starvation_note_counts_requests_as_the_guard_promotes_them() -> None:
    from headway.core import Request
    from headway.sim._cli_notes import starvation_notes

    def req(i: int, waited: float | None) -> Request:
        r = Request(request_id=f"r{i}", arrival_time=10.0, num_prompt_tokens=8, max_tokens=4)
        r.first_scheduled_time = None if waited is None else 10.0 + waited
        return r

    # one of ten at 120 s exactly (PARS promotes once now >= arrival + threshold): a tenth, said
    runs = {"pars": (None, [req(0, 120.0), *(req(i, 119.9) for i in range(1, 9)), req(9, None)])}
    [note] = starvation_notes(runs, {})
    assert note.startswith("pars: 1 of 10 requests (10%) waited out its starvation threshold (120 s)")
    assert starvation_notes(runs, {"pars": {"starvation_threshold": 120.5}}) == []  # the user's setting counts
    assert starvation_notes({"sjf-oracle": runs["pars"]}, {}) == []  # no guard: nothing to say


def test_a_run_that_recomputed_more_than_its_work_says_what_its_preemptions_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a small KV cache: LTR's rotation (pause, recompute) evicts requests again and again; FCFS's
    # evictions for KV cost far less than the work
    argv = ["simulate", "--policies", "fcfs,ltr", "--num-requests", "400", "--num-gpu-blocks", "2000", "--no-report"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ltr: 1,356,859 tokens recomputed after preemptions, 2.6x the 520,868 its requests computed once" in out
    assert "--policy-arg ltr.displacement=none evicts only for a running request's KV blocks" in out
    assert "fcfs: " not in out.split("└")[-1]  # (after the table: fcfs's evictions are not said)


def test_the_recompute_note_weighs_recomputed_tokens_against_the_requests_work() -> None:
    from headway.core import Request
    from headway.sim._cli_notes import recompute_notes

    def req(i: int, again: int) -> Request:
        r = Request(request_id=f"r{i}", arrival_time=0.0, num_prompt_tokens=30, max_tokens=20)
        r.num_output_tokens, r.num_recomputed_tokens = 20, again
        return r

    even = [req(0, 50), req(1, 50)]  # 100 recomputed, 100 computed once: said
    [note] = recompute_notes({"srpt-oracle": (None, even)}, {})
    assert note.startswith("srpt-oracle: 100 tokens recomputed after preemptions, 1.0x the 100 its requests")
    assert "--policy-arg srpt-oracle.displacement=none" in note  # (its declared mode: pause)
    [note] = recompute_notes({"srpt-oracle": (None, even)}, {"srpt-oracle": {"displacement": "none"}})
    assert "displacement=none" not in note and "--preemption-mode swap" in note
    [note] = recompute_notes({"fcfs": (None, even)}, {})  # not preemptive: no displacement to turn off
    assert "displacement" not in note
    assert recompute_notes({"srpt-oracle": (None, [req(0, 50), req(1, 49)])}, {}) == []
