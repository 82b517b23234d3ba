"""The vLLM plugin's ordering logic (PolicyAdapter, HeadwayRequestQueue, settings) without vLLM."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core import Policy, PolicyKey, Request, make_policy, register_policy
from headway.integrations.vllm import (
    SUPPORTED_VLLM_VERSIONS,
    PluginConfig,
    PluginConfigError,
    PolicyAdapter,
    VllmVersionError,
    check_settings,
    check_vllm_version,
    load_text_scorer,
    word_count_scorer,
)
from integrations._fake import FakeEngine, FakeRequest

# A burst: long and short requests interleaved, arriving at the same instant.
BURST = [("r0", 200), ("r1", 180), ("r2", 10), ("r3", 150), ("r4", 8), ("r5", 12), ("r6", 160), ("r7", 9)]


def burst(engine: FakeEngine) -> None:
    for i, (rid, out) in enumerate(BURST):
        engine.add(FakeRequest(rid, 1000.0 + i * 1e-6, 16, out))


def test_fcfs_keeps_arrival_order() -> None:
    eng = FakeEngine(make_policy("fcfs"), max_num_seqs=2)
    burst(eng)
    eng.run()
    assert eng.started == [r for r, _ in BURST]
    assert sorted(eng.finished) == sorted(r for r, _ in BURST)  # nothing lost or duplicated


def test_sjf_oracle_finishes_short_first_fcfs_does_not() -> None:
    short = {rid for rid, out in BURST if out < 20}
    results = {}
    for name in ("fcfs", "sjf-oracle"):
        eng = FakeEngine(make_policy(name), max_num_seqs=2, oracle="max_tokens")
        burst(eng)
        eng.run()
        assert sorted(eng.finished) == sorted(r for r, _ in BURST)  # nothing lost or duplicated
        results[name] = eng.finished
    # SJF: the shorts finish before any long request
    assert set(results["sjf-oracle"][: len(short)]) == short
    # FCFS: the two longs at the head of the queue finish before the last short ones
    assert set(results["fcfs"][: len(short)]) != short


def test_oracle_policy_needs_the_max_tokens_setting() -> None:
    with pytest.raises(PluginConfigError, match="max_tokens"):
        PolicyAdapter(make_policy("sjf-oracle"))


def test_oracle_length_is_max_tokens_capped_by_model_len() -> None:
    pol = make_policy("sjf-oracle")
    a = PolicyAdapter(pol, oracle="max_tokens", max_model_len=100, clock=lambda: 5.0, epoch=0.0)
    q = a.make_queue()
    q.add_request(FakeRequest("a", 1.0, 40, 500))
    q.add_request(FakeRequest("b", 1.0, 10, 70))
    a.flush()
    # a: min(500, 100 - 40) = 60 < b: 70
    assert [r.request_id for r in q] == ["a", "b"]


def test_queue_protocol_like_vllm() -> None:
    a = PolicyAdapter(make_policy("fcfs"), clock=lambda: 10.0, epoch=0.0)
    q = a.make_queue()
    assert not q and len(q) == 0
    with pytest.raises(IndexError):
        q.peek_request()
    with pytest.raises(IndexError):
        q.pop_request()
    reqs = [FakeRequest(f"r{i}", 1.0 + i, 8, 4) for i in range(5)]
    for r in reqs:
        q.add_request(r)
    assert len(q) == 5 and bool(q)  # counted before they are scored/keyed
    assert q.peek_request() is reqs[0]
    assert reqs[3] in q
    q.remove_requests([reqs[1], reqs[3]])
    assert [r.request_id for r in q] == ["r0", "r2", "r4"]
    first = q.pop_request()
    assert first is reqs[0] and len(q) == 2
    q.prepend_requests([first])  # a skipped request goes back to the front, as in vLLM's FCFS deque
    assert [r.request_id for r in q] == ["r0", "r2", "r4"]
    q.remove_request(reqs[2])
    assert len(q) == 2


@pytest.mark.parametrize("policy", ["fcfs", "sjf-oracle"])
def test_only_fcfs_puts_requests_back_at_the_front(policy: str) -> None:
    """vLLM's FCFS queue is a deque: requests put back go to its front, the last of
    ``prepend_requests`` first (``extendleft``), ahead of any that arrived before them, and its
    victim is the last of the running list. Another policy puts them back by key and picks its
    victim by key."""
    a = PolicyAdapter(make_policy(policy), oracle="max_tokens", clock=lambda: 10.0, epoch=0.0)
    q = a.make_queue()
    reqs = [FakeRequest(f"r{i}", 1.0 + i, 8, 4 + i) for i in range(4)]
    for r in reqs:
        q.add_request(r)
    popped = [q.pop_request() for _ in range(2)]
    q.prepend_requests(popped)
    want = ["r1", "r0", "r2", "r3"] if policy == "fcfs" else ["r0", "r1", "r2", "r3"]
    assert [r.request_id for r in q] == want and len(q) == 4 and reqs[1] in q
    assert q.peek_request().request_id == want[0]
    q.remove_request(reqs[1])
    a.finish(reqs[1], aborted=True)
    assert [r.request_id for r in q] == [r for r in want if r != "r1"] and len(q) == 3 and reqs[1] not in q
    assert q.pop_request() is reqs[0]
    victims = a.eviction_order([reqs[2], reqs[0]])
    assert victims == ([reqs[2], reqs[0]] if policy == "fcfs" else [reqs[0], reqs[2]])


def test_pending_requests_removed_before_scoring() -> None:
    a = PolicyAdapter(make_policy("fcfs"), clock=lambda: 10.0, epoch=0.0)
    q = a.make_queue()
    r = FakeRequest("x", 1.0, 8, 4)
    q.add_request(r)
    q.remove_requests([r])
    assert len(q) == 0
    a.finish(r, aborted=True)
    a.flush()
    assert len(q) == 0 and not a.reqs


def test_scores_from_request_xargs_and_batched_scorer() -> None:
    calls: list[list[str]] = []

    def scorer(prompts: list[str]) -> list[float]:
        calls.append(list(prompts))
        return word_count_scorer(prompts)

    a = PolicyAdapter(
        make_policy("pars"), score_batch=scorer, decode=lambda batch: [" ".join(["w"] * len(i)) for i in batch],
        clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    given = FakeRequest("given", 0.5, 4, 10)
    given.sampling_params = SimpleNamespace(extra_args={"headway_score": 0.1}, ignore_eos=True)
    q.add_request(given)
    for i, n in enumerate([30, 3, 12]):
        q.add_request(FakeRequest(f"p{i}", 0.5, n, 10, prompt_token_ids=list(range(n))))
    order = [r.request_id for r in q]  # iteration flushes: one scorer call for all three arrivals
    assert len(calls) == 1 and len(calls[0]) == 3
    assert order == ["given", "p1", "p2", "p0"]
    assert a.num_scored == 3 and a.score_time >= 0


def test_missing_score_falls_back_to_setting_or_mean() -> None:
    a = PolicyAdapter(make_policy("pars"), missing_score=99.0, clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    q.add_request(FakeRequest("x", 0.5, 4, 10))
    q.add_request(FakeRequest("y", 0.6, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 5.0})))
    assert [r.request_id for r in q] == ["y", "x"]
    assert a.num_missing_scores == 1
    # default: the mean of the scores seen so far (the middle of the queue), never an engine error
    a = PolicyAdapter(make_policy("pars"), clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    for rid, sc in (("lo", 1.0), ("hi", 9.0)):
        q.add_request(FakeRequest(rid, 0.5, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": sc})))
    a.flush()
    q.add_request(FakeRequest("none", 0.7, 4, 10))
    assert [r.request_id for r in q] == ["lo", "none", "hi"]


def test_a_request_s_bad_fields_never_stop_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    """A client's headway_score that is not a finite number is ignored (the request counts as one
    without a score) and a headway_tier that is not a tier is standard: raising instead stopped
    vLLM's engine core, and with it every request."""
    a = PolicyAdapter(make_policy("pars"), missing_score=50.0, clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    bad = [("nan", {"headway_score": math.nan}), ("inf", {"headway_score": math.inf}),
           ("text", {"headway_score": "abc"}), ("bool", {"headway_score": True}),
           ("tier", {"headway_tier": "bogus", "headway_score": 1.0}), ("tier9", {"headway_tier": 9}),
           ("tier15", {"headway_tier": 1.5}), ("ok", {"headway_score": 10.0, "headway_tier": "premium"})]  # fmt: skip
    for rid, xa in bad:
        q.add_request(FakeRequest(rid, 0.5, 4, 10, sampling_params=SimpleNamespace(extra_args=xa)))
    assert sorted(r.request_id for r in q) == sorted(rid for rid, _ in bad)
    assert [a.reqs[rid].score for rid in ("nan", "inf", "text", "bool", "tier", "ok")] == [
        50.0, 50.0, 50.0, 50.0, 1.0, 10.0]  # fmt: skip
    assert {a.reqs[rid].tier.name for rid in ("tier", "tier9", "tier15")} == {"STANDARD"}
    assert a.reqs["ok"].tier.name == "PREMIUM"
    assert "is not a finite number; ignored" in caplog.text and "is not a tier; standard used" in caplog.text


def test_a_scorer_s_non_finite_score_takes_the_missing_score_path() -> None:
    a = PolicyAdapter(
        make_policy("pars"), score_batch=lambda prompts: [math.nan] * len(prompts), missing_score=3.0,
        decode=lambda batch: ["x"] * len(batch), clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    q.add_request(FakeRequest("r", 0.5, 4, 10, prompt_token_ids=[1, 2, 3, 4]))
    a.flush()
    assert a.reqs["r"].score == 3.0 and a.num_missing_scores == 1


def _raises_on_boom(prompts: list[str]) -> list[float]:
    if any("boom" in p for p in prompts):
        raise ValueError("cannot score this prompt")
    return [float(len(p)) for p in prompts]


@pytest.mark.parametrize(
    ("scorer", "scores", "failures"),
    [
        (_raises_on_boom, (7.0, 4.0), 1),  # the batch is retried prompt by prompt: only boom fails
        (lambda prompts: [1.0], (1.0, 1.0), 0),  # one score per call: right for one prompt at a time
        (lambda prompts: ["high"] * len(prompts), (7.0, 7.0), 2),
        (lambda prompts: None, (7.0, 7.0), 2),
    ],
    ids=["raises", "wrong-count", "not-numbers", "none"],
)
def test_a_scorer_that_fails_on_a_prompt_never_stops_the_engine(
    scorer, scores, failures, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """A scorer that raises on a prompt, or answers with the wrong count or no numbers, raised out of
    the queue's flush, inside vLLM's engine core: the engine died and every request in flight failed
    (seen live with a 'module:attr' scorer). Those prompts now get the missing score, with a warning;
    a failed batch is retried one prompt at a time, so the prompts the scorer can take keep theirs."""
    texts = {1: "boom boom", 2: "fine"}
    a = PolicyAdapter(
        make_policy("pars"), score_batch=scorer, missing_score=7.0,
        decode=lambda batch: [texts[len(i)] for i in batch], clock=lambda: 1.0, epoch=0.0,
    )  # fmt: skip
    q = a.make_queue()
    q.add_request(FakeRequest("given", 0.4, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 9.0})))
    q.add_request(FakeRequest("boom", 0.5, 1, 10, prompt_token_ids=[1]))
    q.add_request(FakeRequest("fine", 0.6, 2, 10, prompt_token_ids=[1, 2]))
    a.flush()
    assert (a.reqs["boom"].score, a.reqs["fine"].score) == scores
    assert [r.request_id for r in q] == [*sorted(["boom", "fine"], key=lambda r: a.reqs[r].score), "given"]
    assert a.num_score_failures == failures and a.num_scored == 2 - failures and a.num_missing_scores == failures
    assert (f"the scorer failed on {failures} prompt(s)" in caplog.text) == (failures > 0)
    # the engine goes on: a later batch the scorer can take is scored by it
    if scorer is _raises_on_boom:
        q.add_request(FakeRequest("later", 0.7, 2, 10, prompt_token_ids=[3, 4]))
        a.flush()
        assert a.reqs["later"].score == 4.0 and a.num_scored == 2


def test_pars_starvation_promotion_timer_rekeys_queued_requests() -> None:
    now = [0.0]
    a = PolicyAdapter(make_policy("pars", starvation_threshold=5.0), clock=lambda: now[0], epoch=0.0)
    q = a.make_queue()
    old = FakeRequest("old", 0.0, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 9.0}))
    q.add_request(old)
    now[0] = 1.0
    a.step_start()
    new = FakeRequest("new", 1.0, 4, 10, sampling_params=SimpleNamespace(extra_args={"headway_score": 1.0}))
    q.add_request(new)
    a.step_start()
    assert q.peek_request() is new
    now[0] = 5.5  # the old request waited past the threshold: promoted at its timer
    a.step_start()
    assert q.peek_request() is old


@register_policy("test-plugin-epoch")
class _EpochPolicy(Policy):
    """Key = sign * arrival; flipping the sign bumps key_epoch."""

    sign = 1.0

    def key(self, request: Request, now: float) -> PolicyKey:
        return (self.sign * request.arrival_time,)


def test_key_epoch_rekeys_everything() -> None:
    pol = make_policy("test-plugin-epoch")
    a = PolicyAdapter(pol, clock=lambda: 10.0, epoch=0.0)
    q = a.make_queue()
    for i in range(4):
        q.add_request(FakeRequest(f"r{i}", float(i), 4, 4))
    a.step_start()
    assert q.peek_request().request_id == "r0"
    pol.sign = -1.0  # type: ignore[attr-defined]
    pol.key_epoch += 1
    a.step_start()
    assert q.peek_request().request_id == "r3"


def test_srpt_displaces_longer_running_request() -> None:
    eng = FakeEngine(make_policy("srpt-oracle"), max_num_seqs=1, oracle="max_tokens")
    eng.add(FakeRequest("long", 1000.0, 8, 100))
    eng.step()
    eng.step()
    eng.add(FakeRequest("short", 1000.02, 8, 5))
    eng.run()
    assert eng.preempted == ["long"]
    assert eng.finished == ["short", "long"]
    assert eng.adapter.reqs == {}


def test_fcfs_never_displaces() -> None:
    eng = FakeEngine(make_policy("fcfs"), max_num_seqs=1)
    eng.add(FakeRequest("long", 1000.0, 8, 50))
    eng.step()
    eng.add(FakeRequest("short", 1000.02, 8, 5))
    eng.run()
    assert eng.preempted == [] and eng.finished == ["long", "short"]


def test_eviction_order_puts_victims_last() -> None:
    a = PolicyAdapter(make_policy("sjf-oracle"), oracle="max_tokens", clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    reqs = [FakeRequest(f"r{i}", 0.0, 4, out) for i, out in enumerate([50, 10, 30])]
    for r in reqs:
        q.add_request(r)
    running = [q.pop_request() for _ in range(3)]
    for h in a.take_popped():
        a.mark_running(h, a.engine[h])
    order = a.eviction_order(running[::-1])
    assert [r.request_id for r in order] == ["r1", "r2", "r0"]  # the largest key is evicted first


def test_eviction_order_follows_custom_choose_victim() -> None:
    pol = make_policy("uniboost-memguard")
    a = PolicyAdapter(pol, clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    reqs = [FakeRequest(f"r{i}", 0.0, 4, 100) for i in range(4)]
    for r in reqs:
        q.add_request(r)
    running = [q.pop_request() for _ in range(4)]
    for h in a.take_popped():
        a.mark_running(h, a.engine[h])
    order = a.eviction_order(running)
    rest = [a.reqs[r.request_id] for r in order]
    assert pol.choose_victim(rest, 1.0) is rest[-1]
    assert sorted(r.request_id for r in order) == ["r0", "r1", "r2", "r3"]


def test_a_run_starts_with_the_token_a_request_got_while_preempted() -> None:
    """Async scheduling: vLLM preempts r0 (4-token prompt) at 31 output tokens with its 32nd in flight;
    the token reaches r0 while it waits, and vLLM resumes it with 32. MemGuard (thresholds 32, 64, ...)
    guards that run until 64: the run starts with the token. It started at 31 (the count at the
    preemption), so at 40 r0 could be evicted again, where the simulator guards it (found by a wide
    ``HEADWAY_HUNT`` round: uniboost-memguard, async, the plugin evicted another request than vLLM's
    twin run in the simulator)."""
    pol = make_policy("uniboost-memguard")
    a = PolicyAdapter(pol, clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    e = FakeRequest("r0", 0.0, 4, 100)
    q.add_request(e)
    assert q.pop_request() is e
    e.status, e.output, e.num_computed_tokens = "RUNNING", 31, 35
    for h in a.take_popped():
        a.mark_running(h, a.engine[h])
    a.preempt(e)
    e.status, e.num_computed_tokens = "PREEMPTED", 0
    q.prepend_request(e)
    e.output = 32  # the token in flight, delivered while r0 waits
    assert q.pop_request() is e
    e.status = "RUNNING"
    for h in a.take_popped():
        a.mark_running(h, a.engine[h])
    h = a.reqs["r0"]
    assert h.run_start_output_tokens == 32
    e.output = 40
    a.progress({"r0": 1})
    a._sync(h, e, 1.0)
    assert not pol.can_preempt(h, 1.0)  # guarded until 64
    e.output = 64
    a._sync(h, e, 1.0)
    assert pol.can_preempt(h, 1.0)


def test_on_finish_gets_observed_length_and_aborts_do_not() -> None:
    seen: list[tuple[str, int]] = []

    class Spy(Policy):
        name = "spy"

        def key(self, request: Request, now: float) -> PolicyKey:
            return (request.arrival_time,)

        def on_finish(self, request: Request, now: float) -> None:
            seen.append((request.request_id, request.num_output_tokens))
            # no on_progress hook: counters are synced lazily, the first token is still timed
            assert request.first_token_time is not None and request.first_scheduled_time is not None
            assert request.first_scheduled_time < request.first_token_time < now

    eng = FakeEngine(Spy(), max_num_seqs=4)
    eng.add(FakeRequest("a", 1000.0, 4, 7))
    aborted = FakeRequest("b", 1000.0, 4, 7)
    eng.add(aborted)
    eng.waiting.remove_requests([aborted])
    eng.adapter.finish(aborted, aborted=True)
    eng.run()
    assert seen == [("a", 7)]


def test_policy_swap_only_when_empty() -> None:
    a = PolicyAdapter(make_policy("fcfs"), clock=lambda: 1.0, epoch=0.0)
    q = a.make_queue()
    r = FakeRequest("a", 0.0, 4, 4)
    q.add_request(r)
    with pytest.raises(RuntimeError, match="no requests"):
        a.set_policy(make_policy("sjf-oracle"), "max_tokens")
    q.remove_requests([r])
    a.finish(r, aborted=True)
    a.set_policy(make_policy("sjf-oracle"), "max_tokens")
    assert a.policy.name == "sjf-oracle" and q._pq.policy is a.policy


# ------------------------------------------------------------------ settings
def test_config_from_additional_config_env_and_defaults(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = PluginConfig.resolve({"headway": {"policy": "pars", "policy_args": {"starvation_threshold": 5}}}, {})
    assert cfg.policy == "pars" and cfg.policy_args == {"starvation_threshold": 5}
    assert PluginConfig.resolve({}, {}).policy == "fcfs"
    assert PluginConfig.resolve(None, {"HEADWAY_VLLM_CONFIG": '{"policy": "sjf-oracle"}'}).policy == "sjf-oracle"
    f = tmp_path / "hw.json"
    f.write_text(json.dumps({"policy": "ltr"}))
    assert PluginConfig.resolve({"other": 1}, {"HEADWAY_VLLM_CONFIG": str(f)}).policy == "ltr"
    # the variable also takes --additional-config's shape, its headway section included (it said
    # "unknown setting(s) headway")
    wrapped = '{"headway": {"policy": "pars", "policy_args": {"starvation_threshold": 5}}}'
    assert PluginConfig.resolve(None, {"HEADWAY_VLLM_CONFIG": wrapped}) == cfg
    with pytest.raises(PluginConfigError, match="unknown setting"):
        PluginConfig.from_mapping({"polcy": "fcfs"})
    with pytest.raises(PluginConfigError, match="oracle"):
        PluginConfig(oracle="yes")
    assert PluginConfig(scorer_backend="onnx-int8").scorer_backend == "onnx-int8"  # every scoring backend
    with pytest.raises(PluginConfigError, match="scorer_backend must be one of torch, onnx, onnx-int8, got 'gpu'"):
        PluginConfig(scorer_backend="gpu")
    with pytest.raises(PluginConfigError, match="not valid JSON"):
        PluginConfig.resolve(None, {"HEADWAY_VLLM_CONFIG": "{bad"})
    for bad, message in [
        ({"scorer_threads": 0}, "scorer_threads must be an integer >= 1, got 0"),
        ({"scorer_threads": "2"}, "scorer_threads must be an integer >= 1, got '2'"),
        ({"step_log": 5}, "step_log must be a non-empty string or null, got 5"),
        ({"scorer": ""}, "scorer must be a non-empty string or null, got ''"),
        ({"check_version": "no"}, "check_version must be true or false, got 'no'"),
        ({"missing_score": True}, "missing_score must be a finite number or null, got True"),
    ]:
        with pytest.raises(PluginConfigError, match=re.escape(message)):
            PluginConfig.from_mapping(bad)


def test_check_settings_finds_what_the_scheduler_would_refuse(tmp_path: Path) -> None:
    """The pre-launch check refuses what the scheduler's constructor refuses, naming it."""
    word_count = "headway.integrations.vllm:word_count_scorer"
    (tmp_path / "s.jsonl").write_text("")
    new_dir = str(tmp_path / "new" / "s.jsonl")  # the scheduler creates missing directories
    lines = check_settings(PluginConfig(policy="pars", scorer=word_count, step_log=new_dir))
    assert lines[0].startswith("policy 'pars' (default settings)")
    assert any("scored a test prompt" in line for line in lines) and any("writable" in line for line in lines)
    assert any("no scorer is set" in line for line in check_settings(PluginConfig(policy="sjf-score")))
    assert not any("no scorer" in line for line in check_settings(PluginConfig(policy="fcfs")))
    for cfg, message in [
        (PluginConfig(policy="no-such-policy"), "no-such-policy"),
        (PluginConfig(policy="pars", policy_args={"starvation_thresold": 5}), "starvation_thresold"),
        (PluginConfig(policy="sjf-oracle"), "oracle='max_tokens'"),
        (PluginConfig(scorer="headway.nope:fn"), "cannot load"),
        (PluginConfig(scorer="builtins:len"), "failed on a test prompt"),
        (PluginConfig(step_log=str(tmp_path)), "cannot be written"),  # a directory
        (PluginConfig(step_log=str(tmp_path / "s.jsonl" / "under-a-file.jsonl")), "cannot be written"),
    ]:
        with pytest.raises(PluginConfigError, match=re.escape(message)):
            check_settings(cfg)
    # a step log whose folders do not exist yet is writable, and the check leaves nothing behind
    fresh = tmp_path / "new" / "deeper" / "steps.jsonl"
    assert check_settings(PluginConfig(step_log=str(fresh)))[-1] == f"step_log {str(fresh)!r}: writable"
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept.jsonl"
    kept.write_text("{}\n")
    check_settings(PluginConfig(step_log=str(kept)))
    assert kept.read_text() == "{}\n"  # an existing log is neither truncated nor removed
    if sys.platform.startswith("linux"):  # a folder that cannot be made whatever the permission bits say
        with pytest.raises(PluginConfigError, match="cannot be written"):
            check_settings(PluginConfig(step_log="/proc/headway-no-such/steps.jsonl"))
    assert check_settings(PluginConfig(policy="sarathi"), chunked_prefill=True)[1].endswith("fits the policy")
    with pytest.raises(PluginConfigError, match="needs chunked prefill"):
        check_settings(PluginConfig(policy="sarathi"), chunked_prefill=False)
    control = tmp_path / "control.json"
    assert "not there yet" in check_settings(PluginConfig(control_file=str(control)))[-1]
    control.write_text(json.dumps({"policy": "srpt-oracle", "oracle": "max_tokens"}))
    assert check_settings(PluginConfig(control_file=str(control)))[-1].endswith("valid (policy 'srpt-oracle')")
    for text, message in [
        ('{"policy": "srpt-oracle"}', "oracle='max_tokens'"),  # the startup oracle setting is 'none'
        ('{"polcy": "fcfs"}', "unknown key(s) polcy"),
        ("[1]", "expected a JSON object"),
        ("{bad", "not valid JSON"),
        ('{"policy": "\xff"}'.encode("latin-1"), "not UTF-8 text (invalid start byte)"),
    ]:
        control.write_bytes(text) if isinstance(text, bytes) else control.write_text(text)
        with pytest.raises(PluginConfigError, match=re.escape(message)):
            check_settings(PluginConfig(control_file=str(control)))


def test_version_guard_names_supported_versions() -> None:
    check_vllm_version(SUPPORTED_VLLM_VERSIONS[0] + ".0")
    with pytest.raises(VllmVersionError, match=r"supports vLLM 0\.32\.x.*found vLLM 0\.11\.0"):
        check_vllm_version("0.11.0")
    with pytest.raises(VllmVersionError):
        check_vllm_version("0.320.1")


def test_interface_check_lists_what_is_missing() -> None:
    from headway.integrations.vllm._version import _check_interface

    class Sched:
        def schedule(self) -> None: ...

    with pytest.raises(VllmVersionError, match="update_from_output"):
        _check_interface(Sched, object, "9.9")


def test_import_does_not_need_vllm() -> None:
    import sys

    import headway.integrations.vllm as mod

    assert "vllm" not in sys.modules or hasattr(mod, "PolicyAdapter")
    with pytest.raises(AttributeError):
        mod.NoSuchThing  # noqa: B018


def test_load_text_scorer_specs() -> None:
    fn = load_text_scorer("headway.integrations.vllm:word_count_scorer")
    assert fn(["a b c"]) == [math.log1p(3)]
    with pytest.raises(PluginConfigError, match="cannot load"):
        load_text_scorer("headway.nope:fn")
    with pytest.raises(PluginConfigError, match="module:attr"):
        load_text_scorer("not-a-spec")


def test_load_text_scorer_takes_the_backend_from_a_predictor_spec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The plugin reads predictor specs as the gateway does: ``DIR:BACKEND`` beats ``scorer_backend``."""
    import headway.predict.score as score_mod

    seen: list[tuple[str, str, int]] = []

    class Fake:
        def score(self, prompts: list[str]) -> list[float]:
            return [2.0] * len(prompts)

    def fake_from_checkpoint(path: Path, backend: str = "torch", *, threads: int = 1) -> Fake:
        seen.append((str(path), backend, threads))
        return Fake()

    monkeypatch.setattr(score_mod, "ensure_predictor", lambda p, **kw: Path(p))
    monkeypatch.setattr(score_mod.Scorer, "from_checkpoint", fake_from_checkpoint)
    assert load_text_scorer(f"{tmp_path}:onnx-int8", backend="torch", threads=2)(["a"]) == [2.0]
    load_text_scorer(str(tmp_path), backend="onnx")
    assert seen == [(str(tmp_path), "onnx-int8", 2), (str(tmp_path), "onnx", 1)]
    with pytest.raises(PluginConfigError, match="unknown backend 'gpu'"):
        load_text_scorer(f"{tmp_path}:gpu")


def test_load_text_scorer_names_a_missing_checkpoint_directory(tmp_path: Path) -> None:
    from headway.predict import CheckpointError

    with pytest.raises(CheckpointError, match="no predictor checkpoint"):
        load_text_scorer(str(tmp_path / "missing"))


def test_engine_cpus_parses_lists_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from headway.integrations._server import engine_cpus

    assert engine_cpus("0-2,5") == {0, 1, 2, 5}
    assert engine_cpus("all") is None
    monkeypatch.delenv("HEADWAY_VLLM_CPUS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert engine_cpus() == {0}  # a small machine keeps its last CPU for clients
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert engine_cpus() is None
    monkeypatch.setenv("HEADWAY_VLLM_CPUS", "1")
    assert engine_cpus() == {1}
    with pytest.raises(ValueError, match="bad CPU list 'x-1'"):
        engine_cpus("x-1")


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["uniboost-memguard", "uniboost-base", "uniboost", "srpt-oracle", "trail-oracle"]),
    lengths=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 300), st.integers(0, 30)), min_size=2, max_size=14),
    slots=st.integers(1, 4),
    gain_bound=st.sampled_from([1, None]),
)
def test_cached_victim_scan_decides_like_a_fresh_scan(
    name: str, lengths: list[tuple[int, int, int]], slots: int, gain_bound: int | None
) -> None:
    """The plugin caches running requests' keys and can_preempt between rekey points, and
    skips a check that failed while no rekey point can have been reached; every
    displacement decision must be the one a fresh scan of every running request makes."""

    def run(cache: bool) -> tuple[list[str], list[str]]:
        eng = FakeEngine(make_policy(name), max_num_seqs=slots, oracle="max_tokens", gain_bound=gain_bound)
        eng.adapter._cache_victims = eng.adapter._skip_failed = cache
        t = 1000.0
        for i, (prompt, out, gap) in enumerate(lengths):
            for _ in range(gap):
                eng.step()
            t += 1e-3
            eng.add(FakeRequest(f"r{i}", t, prompt, out))
        eng.run()
        return eng.finished, eng.preempted

    cached, fresh = run(True), run(False)
    assert cached == fresh
    assert sorted(cached[0]) == sorted(f"r{i}" for i in range(len(lengths)))


def test_a_cpu_list_outside_this_process_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from headway.integrations._server import start_vllm_server

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    python, model = tmp_path / "python", tmp_path / "model"
    python.write_text("")
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("HEADWAY_VLLM_CPUS", "4096")
    with (
        pytest.raises(ValueError, match="HEADWAY_VLLM_CPUS='4096' names none of the CPUs"),
        start_vllm_server(python, model),
    ):
        pass


def test_displacement_inside_vllm_is_the_declared_mode_but_pause() -> None:
    """vLLM's model runner holds at most max_num_seqs requests: a declared ``pause`` runs as ``none``
    (vLLM's decisions), ``evict`` as declared; non-preemptive policies never displace."""
    from headway.integrations.vllm._settings import plugin_displacement

    assert plugin_displacement(make_policy("fcfs")) == "none"
    assert plugin_displacement(make_policy("srpt-oracle")) == "none"  # declared pause
    assert plugin_displacement(make_policy("srpt-oracle", displacement="evict")) == "evict"
    assert plugin_displacement(make_policy("uniboost")) == "evict"
    a = PolicyAdapter(make_policy("srpt-oracle", displacement="evict"), oracle="max_tokens")
    assert a.displacement == "evict" and a.preemptive
    done = check_settings(PluginConfig(policy="srpt-oracle", oracle="max_tokens"))
    assert "displacement: none (declared 'pause': not available inside vLLM)" in done


def test_check_settings_tries_a_user_policy_on_a_request() -> None:
    """A policy that raises on a request, or whose key is no tuple of numbers, is refused before
    vLLM starts (it failed in vLLM's engine core at the first request, after the model loaded)."""
    from headway.core._policy import _POLICIES

    class Raises(Policy):
        def on_arrival(self, request: Request, now: float) -> None:
            raise KeyError("oops")

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    class IntKey(Policy):
        def key(self, request: Request, now: float) -> PolicyKey:
            return request.num_prompt_tokens  # type: ignore[return-value]

    _POLICIES.register("test-raises")(Raises)
    _POLICIES.register("test-int-key")(IntKey)
    try:
        with pytest.raises(PluginConfigError, match=r"policy 'test-raises' failed on a test request: KeyError: 'oops'"):
            check_settings(PluginConfig(policy="test-raises"))
        with pytest.raises(PluginConfigError, match=r"key\(\) must return a tuple of numbers .* got int 16"):
            check_settings(PluginConfig(policy="test-int-key"))
    finally:
        _POLICIES.unregister("test-raises")
        _POLICIES.unregister("test-int-key")
    # every built-in policy keys the test request (score-ranked ones on the score the plugin gives)
    for name in _POLICIES.names():
        check_settings(PluginConfig(policy=name, oracle="max_tokens"))


def test_a_control_file_others_may_write_is_not_read(tmp_path: Path) -> None:
    """Whoever writes the control file switches the engine's policy and scorer (a module imported, a
    checkpoint loaded in the engine's process): one that group or others may write, or another user
    owns, is refused, by ``headway plugin-check`` and by the scheduler's reload alike (both read it
    through ``read_control_file``)."""
    import os

    control = tmp_path / "control.json"
    control.write_text(json.dumps({"policy": "fcfs"}))
    control.chmod(0o644)
    assert check_settings(PluginConfig(control_file=str(control)))[-1].endswith("valid (policy 'fcfs')")
    for mode in (0o666, 0o664):
        control.chmod(mode)
        with pytest.raises(PluginConfigError, match=f"writable by group or others .*mode {mode:o}"):
            check_settings(PluginConfig(control_file=str(control)))
    link = tmp_path / "link.json"  # a symlink is judged by the file it leads to
    link.symlink_to(control)
    with pytest.raises(PluginConfigError, match="writable by group or others"):
        check_settings(PluginConfig(control_file=str(link)))
    control.chmod(0o600)
    assert check_settings(PluginConfig(control_file=str(link)))[-1].endswith("valid (policy 'fcfs')")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # (only root can give a file away)
        os.chown(control, 65534, 65534)
        with pytest.raises(PluginConfigError, match="writable by another user"):
            check_settings(PluginConfig(control_file=str(control)))

    from headway.integrations.vllm._settings import read_control_file

    control.chmod(0o646)
    with pytest.raises(PermissionError):
        read_control_file(str(control))


@pytest.mark.parametrize("gain", [0, 1])
def test_a_request_evicted_again_and_again_without_getting_further_is_warned_of_once(
    gain: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The simulator's livelock check (``SimulationStalled``) as a warning: the engine keeps running."""
    from headway.core import STALL_EVICTIONS

    a = PolicyAdapter(make_policy("fcfs"), clock=lambda: 1000.0, epoch=1000.0)
    q = a.make_queue()
    e = FakeRequest("r0", 1000.0, 64, 16)
    q.add_request(e)
    for i in range(STALL_EVICTIONS + 5):
        a.step_start()
        assert q.pop_request() is e
        e.status = "RUNNING"
        for h in a.take_popped():
            a.mark_running(h, a.engine[h])
        e.num_computed_tokens = 40 + i * gain  # how far this turn got before the eviction
        with caplog.at_level("WARNING", logger="headway.integrations.vllm"):
            a.preempt(e)
        warned = [r for r in caplog.records if "evicted 1000 times in a row" in r.getMessage()]
        # warned at the 1,000th eviction in a row that got no further than the first, once
        assert len(warned) == (1 if gain == 0 and i >= STALL_EVICTIONS else 0), i
        e.status, e.num_computed_tokens = "PREEMPTED", 0
        q.prepend_request(e)
    a.step_start()
    assert q.pop_request() is e
    for h in a.take_popped():
        a.mark_running(h, a.engine[h])
    e.output = 16
    a.finish(e, aborted=False)
    assert a._stalls == {}
