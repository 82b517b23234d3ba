"""headway's plugin under vLLM features beyond plain text generation, on vLLM 0.32's own schedulers
with no model (``_vllm_features.py``): structured output waiting for its grammar (and one whose grammar
fails), LoRA adapters over ``max_loras``, parallel sampling (child requests of one prompt), aborts of
waiting requests, ``reset_prefix_cache``, the pause states, and the request counts and stats. With
``fcfs`` the plugin makes vLLM's decisions step for step; with ``pars`` and a scorer (background and
inline scoring) every request is finished or aborted exactly once and nothing is left behind."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._server import headway_src_dir

pytestmark = [pytest.mark.vllm]

HERE = Path(__file__).resolve().parent
GEOMETRY = {
    "block_size": 4, "num_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 32,
    "chunked_prefill": True, "prefix_caching": True, "max_model_len": 256,
}  # fmt: skip
FCFS = {"policy": "fcfs", "check_version": False}
WORD_COUNT = "headway.integrations.vllm:word_count_scorer"
PARS = {
    scoring: {"policy": "pars", "scorer": WORD_COUNT, "scoring": scoring, "check_version": False}
    for scoring in ("background", "inline")
}


def _run(vllm_paths: tuple[Path, Path], cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    python, model = vllm_paths
    env = {**os.environ, "PYTHONPATH": str(headway_src_dir())}
    out = subprocess.run(
        [str(python), str(HERE / "_vllm_features.py"), str(model)],
        input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    replies: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    for reply in replies:
        assert "error" not in reply, reply.get("trace")
    return replies


def _requests(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(specs):
        n = int(s.get("n", 8))
        out.append({
            "id": s.get("id", f"r{i}"), "seq": i, "arrive": s.get("arrive", 0),
            "prompt": s.get("prompt", list(range(10 + i, 10 + i + n))), "max_tokens": s.get("max_tokens", 4),
            **{k: s[k] for k in ("grammar", "lora") if k in s},
        })  # fmt: skip
    return out


def _same_decisions(ref: dict[str, Any], got: dict[str, Any], what: str) -> None:
    for a, b in zip(ref["steps"], got["steps"], strict=False):
        assert a == b, f"{what}: vLLM {a}, plugin {b}"
    assert len(ref["steps"]) == len(got["steps"]), what
    assert got["counts"] == ref["counts"], what
    assert (got["finishes"], got["status"]) == (ref["finishes"], ref["status"]), what


def _accounted(r: dict[str, Any], what: str) -> None:
    """Each request finished once (its finishing output) or aborted (none), the scheduler's counts
    hold every request it holds at each step, and neither vLLM nor the plugin holds one at the end."""
    for rid, status in r["status"].items():
        assert (r["finishes"].get(rid, 0) == 1) != (status == "FINISHED_ABORTED"), (what, rid, status, r["finishes"])
    assert all(running + waiting == held for running, waiting, *_, held in r["counts"]), what
    assert not r["left"], what
    hw = r["adapter"]
    assert (hw["reqs"], hw["engine"], hw["pending"], hw["scoring"], hw["queued"]) == ([], 0, 0, 0, [0, 0]), what


def _fcfs_on_both(vllm_paths: tuple[Path, Path], case: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's ``Scheduler`` and ``AsyncScheduler`` on ``case``, each beside the plugin with ``fcfs``:
    the same decisions; vLLM's own runs are returned."""
    cases = []
    for base in ("vllm", "vllm-async"):
        plugin = f"headway{base.removeprefix('vllm')}"
        cases += [{**case, "scheduler": base}, {**case, "scheduler": plugin, "headway": FCFS}]
    replies = _run(vllm_paths, cases)
    for k in (0, 2):
        _same_decisions(replies[k], replies[k + 1], cases[k]["scheduler"])
        _accounted(replies[k + 1], cases[k]["scheduler"])
    return replies[::2]


def test_fcfs_puts_a_preempted_request_back_at_the_front(vllm_paths: tuple[Path, Path]) -> None:
    """``a`` waits for its grammar while ``b`` and ``c`` (who came after it) run; ``c`` is preempted
    and vLLM's FCFS deque takes it back at its front, ahead of ``a``: once ``b`` finishes, vLLM
    resumes ``c`` and then admits ``a``. The plugin's ``fcfs`` put ``c`` back by arrival, behind
    ``a``, and scheduled them the other way round."""
    reqs = _requests([
        {"id": "a", "n": 8, "max_tokens": 2, "grammar": 6},
        {"id": "b", "n": 12, "max_tokens": 20},
        {"id": "c", "arrive": 1, "n": 8, "max_tokens": 20},
    ])  # fmt: skip
    for ref in _fcfs_on_both(vllm_paths, {**GEOMETRY, "num_blocks": 10, "prefix_caching": False, "requests": reqs}):
        assert any(s["preempted"] == ["c"] for s in ref["steps"])
        admitted = next(s["sched"] for s in ref["steps"] if any(rid == "a" for rid, *_ in s["sched"]))
        assert [rid for rid, *_ in admitted] == ["c", "a"]  # the scenario does what it says


def test_fcfs_evicts_the_last_running_request(vllm_paths: tuple[Path, Path]) -> None:
    """``a`` came first but waited for its grammar, so vLLM's running list is ``[b, a]``; short of KV
    blocks, vLLM's FCFS evicts the last of that list, ``a``. The plugin ranked victims by the
    policy's key (arrival) and evicted ``b``."""
    reqs = _requests([{"id": "a", "n": 8, "max_tokens": 20, "grammar": 2}, {"id": "b", "n": 12, "max_tokens": 20}])
    for ref in _fcfs_on_both(vllm_paths, {**GEOMETRY, "num_blocks": 10, "prefix_caching": False, "requests": reqs}):
        assert next(s["preempted"] for s in ref["steps"] if s["preempted"]) == ["a"]


def _scenario(rng: random.Random, features: str) -> dict[str, Any]:
    specs: list[dict[str, Any]] = []
    for i in range(rng.randint(3, 10)):
        s: dict[str, Any] = {"arrive": rng.randint(0, 6), "n": rng.randint(2, 24), "max_tokens": rng.randint(1, 12)}
        if "grammar" in features and rng.random() < 0.4:
            s["grammar"] = rng.choice([rng.randint(0, 10), rng.randint(0, 10), "error"])
        if "lora" in features and rng.random() < 0.6:
            s["lora"] = rng.randint(1, 3)
        if "children" in features and specs and rng.random() < 0.4:  # n > 1: one prompt, one arrival
            parent = specs[-1]
            parent.setdefault("prompt", list(range(9 + i, 9 + i + parent["n"])))
            s.update(arrive=parent["arrive"], n=parent["n"], prompt=parent["prompt"])
        specs.append(s)
    specs.sort(key=lambda s: s["arrive"])
    reqs = _requests(specs)
    events: dict[str, list[list[Any]]] = {}
    if "abort" in features:
        for r in reqs:
            if rng.random() < 0.3:
                events.setdefault(str(r["arrive"] + rng.randint(0, 4)), []).append(["abort", [r["id"]]])
    if "reset" in features:
        events.setdefault(str(rng.randint(1, 8)), []).append(["reset_prefix_cache"])
    if "pause" in features:
        at = rng.randint(0, 6)
        events.setdefault(str(at), []).append(["pause", rng.choice(["PAUSED_NEW", "PAUSED_ALL"])])
        events.setdefault(str(at + rng.randint(1, 5)), []).append(["pause", "UNPAUSED"])
    geometry = {
        "num_blocks": rng.choice([10, 12, 20, 64]), "max_num_seqs": rng.choice([2, 3, 4]),
        "max_num_batched_tokens": rng.choice([8, 16, 32]), "prefix_caching": rng.random() < 0.5,
    }  # fmt: skip
    if "lora" in features:
        geometry["max_loras"] = rng.choice([1, 2])
    return {**GEOMETRY, **geometry, "requests": reqs, "events": events}


@pytest.mark.parametrize(
    ("features", "seed"),
    [("grammar", 1), ("lora", 2), ("children,abort,reset", 3), ("pause,grammar,abort", 4), ("grammar,lora,reset", 5)],
)
def test_the_plugin_under_vllm_features(vllm_paths: tuple[Path, Path], features: str, seed: int) -> None:
    """Random scenarios of these features, on vLLM's ``Scheduler`` and ``AsyncScheduler``: ``fcfs``
    makes vLLM's decisions (every step's scheduled requests in order, preemptions, finishes, request
    counts and stats); ``pars`` with a scorer, in the background and inline, loses no request and
    leaves none behind."""
    rng = random.Random(seed)
    scenarios = [_scenario(rng, features) for _ in range(3)]
    cases = []
    for sc in scenarios:
        for base in ("vllm", "vllm-async"):
            plugin = f"headway{base.removeprefix('vllm')}"
            cases += [
                {**sc, "scheduler": base}, {**sc, "scheduler": plugin, "headway": FCFS},
                {**sc, "scheduler": plugin, "headway": PARS["background"]},
                {**sc, "scheduler": plugin, "headway": PARS["inline"]},
            ]  # fmt: skip
    replies = _run(vllm_paths, cases)
    for k in range(0, len(cases), 4):
        what = f"{features} case {k // 4} on {cases[k]['scheduler']}: {json.dumps(cases[k])}"
        ref, fcfs, background, inline = replies[k : k + 4]
        _same_decisions(ref, fcfs, what)
        for r, name in ((ref, "vllm"), (fcfs, "fcfs"), (background, "pars background"), (inline, "pars inline")):
            if name != "vllm":
                _accounted(r, f"{name}: {what}")
