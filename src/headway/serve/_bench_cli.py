"""argparse wiring of ``headway bench serve``: replay a workload against an OpenAI-compatible
endpoint (:mod:`headway.serve._bench`) and report it as ``headway simulate`` does, or as
``vllm bench serve --save-result`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from headway._help import add_shared_prefix_args, fail, key_value, name_flags, nonempty, unwritable

__all__ = ["add_bench_parser", "add_bench_serve_parser"]


def add_bench_serve_parser(bench_subparsers: Any) -> argparse.ArgumentParser:
    """``headway bench serve`` (add under an existing ``bench`` command's subparsers)."""
    p: argparse.ArgumentParser = bench_subparsers.add_parser(
        "serve",
        help="replay a workload against an OpenAI-compatible endpoint",
        description="Replay a workload (arrivals, prompts, output lengths via max_tokens + "
        "ignore_eos) against any OpenAI-compatible endpoint and report simulator metrics.",
    )
    p.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="server base URL, e.g. http://127.0.0.1:8000 (as vllm bench serve)",
    )
    p.add_argument(
        "--endpoint",
        default="/v1/completions",
        metavar="PATH",
        help="API path: /v1/completions or /v1/chat/completions (default %(default)s). "
        "A full URL here is taken as --base-url (the old spelling)",
    )
    p.add_argument(
        "--workload",
        type=nonempty,
        default="burst",
        help="workload name or file (headway.workload.load_workload; default: burst, every request at once: "
        "use --workload default with --request-rate for timed arrivals)",
    )
    p.add_argument(
        "--format",
        default=None,
        help="the workload file's format when it cannot be told from the content, as headway simulate --format",
    )
    p.add_argument(
        "--num-prompts",
        "--num-requests",
        dest="num_requests",
        metavar="N",
        type=int,
        default=None,
        help="number of requests (default: the workload's own)",
    )
    p.add_argument(
        "--request-rate",
        "--rate",
        dest="rate",
        type=float,
        default=None,
        help="requests per second of the arrivals (default: the workload's own)",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=None,
        help="Gamma burstiness factor (1 = Poisson, < 1 burstier), as vllm bench serve and headway simulate",
    )
    p.add_argument(
        "--arrivals",
        default=None,
        choices=["trace", "gamma", "gamma-vllm", "poisson", "burst"],
        help="arrival process, chosen as headway simulate --arrivals chooses it (its --help gives the defaults)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of every random draw of the workload and of its synthetic prompt texts (default 0)",
    )
    p.add_argument("--tenants", default=None, help="tenant mix for load_workload ('default' or 'none')")
    add_shared_prefix_args(p)
    p.add_argument("--model", type=nonempty, default=None, help="model name (default: first of /v1/models)")
    p.add_argument(
        "--workload-models",
        action="store_true",
        help="send each request under its workload's model (a prompt log's 'model'; --model for those without "
        "one): for a gateway or fleet serving those models, and per-model online learning",
    )
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions (same as --endpoint PATH)")
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="ask for whole answers instead of streams: no per-token work in the client (TTFT then equals E2E)",
    )
    p.add_argument("--api-key", default=None, help="bearer key for every request")
    p.add_argument(
        "--tenant-key",
        action="append",
        default=[],
        type=key_value,
        metavar="TENANT=KEY",
        help="bearer key for one tenant's requests (repeatable)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=0, help="most requests in flight (default 0: no limit, open loop)"
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=0,
        help="cap synthetic prompt length (a conversation's first message: later turns carry its history whole)",
    )
    p.add_argument("--max-output-tokens", type=int, default=0, help="cap output lengths")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every gap between arrivals by this (default 1; 0.5 replays twice as fast)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="whole-run limit in seconds")
    p.add_argument("--request-timeout", type=float, default=600.0, help="one request's limit in seconds (default 600)")
    p.add_argument("--name", type=nonempty, default="bench", help="run name in the report")
    p.add_argument("--out", type=nonempty, default=None, help="write a headway report (JSON/CSV/plots) to this folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr while the requests run (there is none when stderr is not a terminal)",
    )
    p.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="METRIC:MS",
        help="SLO targets in milliseconds as `vllm bench serve --goodput`, e.g. "
        "ttft:500 tpot:50 e2el:2000: report goodput (requests/s meeting every target) "
        "and SLO attainment",
    )
    p.add_argument("--save-result", action="store_true", help="write vllm bench serve's result JSON")
    p.add_argument("--result-dir", default=None, help="folder of the --save-result file (default: here)")
    p.add_argument(
        "--result-filename",
        default=None,
        help="name of the --save-result file (default: vLLM's {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json)",
    )
    p.add_argument("--label", default=None, help="label of the --save-result file (default: openai)")
    p.add_argument(
        "--metric-percentiles",
        default="99",
        help="comma-separated percentiles in the --save-result file (default %(default)s)",
    )
    p.set_defaults(func=_run_bench)
    return p


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``headway bench`` with its ``serve`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser("bench", help="benchmarks against live endpoints")
    sub = p.add_subparsers(dest="bench_command", required=True)
    add_bench_serve_parser(sub)
    return p


class _Progress:
    """How many requests were sent and are done (and aborted), and, when ``show``, a progress bar on
    stderr with the time so far. ``on_sent`` and ``on_done`` are ``run_bench``'s callbacks."""

    def __init__(self, total: int, console: Any = None, *, show: bool = True) -> None:
        self.sent = self.done = self.aborted = 0
        self._bar: Any = None
        if not show:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("requests done"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sent]} sent, {task.fields[aborted]} aborted"),
            TimeElapsedColumn(),
            console=console if console is not None else Console(stderr=True),
        )
        self._task = self._bar.add_task("bench", total=total, sent=0, aborted=0)
        self._bar.start()

    def on_sent(self, req: Any) -> None:
        self.sent += 1
        if self._bar is not None:
            self._bar.update(self._task, sent=self.sent)

    def on_done(self, req: Any) -> None:
        self.done += 1
        self.aborted += req.state.name == "ABORTED"
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, aborted=self.aborted)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


_FLAGS = {
    "endpoint": "--base-url",
    "num_requests": "--num-prompts", "rate": "--request-rate", "format": "--format", "time_scale": "--time-scale",
    "timeout_s": "--timeout", "request_timeout_s": "--request-timeout", "max_concurrency": "--max-concurrency",
    "max_prompt_tokens": "--max-prompt-tokens", "max_output_tokens": "--max-output-tokens",
    **{n: "--" + n.replace("_", "-") for n in (
        "burstiness", "arrivals", "tenants", "seed", "system_prompts", "system_prompt_tokens", "think_time",
    )},
}  # fmt: skip
"""The workload's and the client's settings this command takes -> the flag that gives each (for errors)."""


def _arrivals(workload: Any, rate: float | None, time_scale: float) -> tuple[float, float]:
    """The span of the arrivals as sent (seconds, scaled by ``time_scale``) and their rate in
    requests/s: ``rate`` (the ``--request-rate`` asked for) over ``time_scale``, else the rate of the
    process that generated them (the workload's ``meta["arrival_rate"]``), else (a trace's times) their
    own mean, (k - 1) / span; ``inf`` when they all come at once (``vllm bench serve``'s ``request_rate``)."""
    # a turn that follows another (sharegpt-sessions) is sent after it: its own arrival time is not used
    arrivals = [s.arrival_time for s in workload if s.after is None] or [0.0]
    span = (max(arrivals) - min(arrivals)) * time_scale
    if span <= 0:
        return 0.0, math.inf
    if rate is None and isinstance(generated := workload.meta.get("arrival_rate"), float):
        rate = generated
    return span, rate / time_scale if rate is not None else (len(arrivals) - 1) / span


def _burstiness(workload: Any, request_rate: float) -> float | None:
    """``vllm bench serve``'s ``burstiness``, the Gamma shape of the arrivals' gaps: that of the process
    that generated them (the workload's ``meta["burstiness"]``; 1 for Poisson); 1.0 when they all come
    at once (what vLLM writes at an infinite rate, where it draws no gap); None (null) for a trace's
    times, which no Gamma drew."""
    shape = workload.meta.get("burstiness")
    if isinstance(shape, float):
        return shape
    return 1.0 if math.isinf(request_rate) else None


def _start_line(workload: Any, url: str, rate: float | None, time_scale: float, max_concurrency: int) -> str:
    """What a run is about to do, said before it starts: how many requests, to where, over about
    how long (the workload's arrivals, scaled by ``time_scale``) and at what rate (:func:`_arrivals`)."""
    n = len(workload)
    span, per_s = _arrivals(workload, rate, time_scale)
    line = f"headway: sending {n} request{'s' if n != 1 else ''} to {url}"
    if span <= 0:
        line += ", all at once"
    else:
        line += f", arriving over about {_duration(span)} ({per_s:.3g} requests/s)"
    if max_concurrency:
        line += f", at most {max_concurrency} at a time"
    if workload.skipped_note:
        line += f"; {workload.skipped_note}"
    return line


_MESSAGE_CHARS = 200
"""Longest backend message printed under the abort reasons (one line each)."""

_CONTEXT_LENGTH = re.compile(r"(?:context|model) length(?: is| of)? (\d+)|context length", re.IGNORECASE)
"""A message saying a request does not fit the model's context (vLLM: "This model's maximum context
length is 2048 tokens. However, ..."; its engine: "... longer than the maximum model length of 2048")."""


def _one_line(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 3] + "..."


def _abort_messages(requests: Sequence[Any], count: Mapping[str, int], workload: Any, cfg: Any) -> list[str]:
    """Under the abort reasons (``count``: the summary's ``aborted_by_reason``): for each reason, the
    first message a backend gave with it (the request that ended first), one line each; then a hint
    at ``--max-prompt-tokens`` when a message says that prompts did not fit the server's context and
    the cap would shorten them (:func:`~headway.serve._bench.synthetic_first_prompt`)."""
    from headway.serve._bench import ERROR_MESSAGE_KEY, synthetic_first_prompt

    first: dict[str, Any] = {}
    for r in requests:
        if r.state.name != "ABORTED":
            continue
        reason = str(r.extra.get("abort_reason", "unknown"))
        if r.extra.get(ERROR_MESSAGE_KEY) and (
            reason not in first or (r.finish_time or 0.0) < (first[reason].finish_time or 0.0)
        ):
            first[reason] = r
    lines = [f"  {k} ({count[k]}): {_one_line(str(first[k].extra[ERROR_MESSAGE_KEY]))}" for k in sorted(first)]
    cappable = {s.request_id for s in workload if synthetic_first_prompt(s, cfg)}
    too_long = [
        m
        for r in requests
        if r.state.name == "ABORTED"
        and r.request_id in cappable
        and (m := _CONTEXT_LENGTH.search(str(r.extra.get(ERROR_MESSAGE_KEY, ""))))
    ]
    if too_long:
        limit = next((m.group(1) for m in too_long if m.group(1)), None)
        context = f"context ({limit} tokens)" if limit else "context"
        now = f" (now {cfg.max_prompt_tokens})" if cfg.max_prompt_tokens else ""
        n = len(too_long)
        lines.append(
            f"hint: {n} request{'s' if n != 1 else ''} did not fit the server's {context}: "
            f"--max-prompt-tokens N{now} caps the synthetic prompts (N + the output tokens must fit in it)"
        )
    return lines


def _run_bench(args: argparse.Namespace) -> int:
    from headway._help import CLIError, prepare_out_dir
    from headway.metrics import SLO, comparison_table, summarize, write_report
    from headway.serve._bench import BenchConfig, BenchError, request_url, run_bench_sync
    from headway.workload import load_workload

    try:
        slo = SLO.parse(args.goodput) if args.goodput else None
    except ValueError as exc:
        return fail(f"--goodput: {exc}")
    if args.num_requests is not None and args.num_requests < 1:
        return fail(f"--num-prompts must be >= 1, got {args.num_requests}")
    base_url, chat = args.base_url, args.chat
    if args.endpoint.startswith(("http://", "https://")):
        if base_url is not None:
            return fail("--endpoint is the API path (e.g. /v1/completions) when --base-url is given")
        print("headway: --endpoint URL is the old spelling of --base-url URL", file=sys.stderr)
        base_url = args.endpoint
    elif args.endpoint.rstrip("/") in ("/v1/chat/completions", "/chat/completions"):
        chat = True
    elif args.endpoint.rstrip("/") not in ("/v1/completions", "/completions"):
        return fail(f"--endpoint must be /v1/completions or /v1/chat/completions, got {args.endpoint!r}")
    if base_url is None:
        return fail("--base-url URL is required (the server, e.g. http://127.0.0.1:8000)")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
        if not all(0 <= p <= 100 for p in percentiles):
            raise ValueError
    except ValueError:
        return fail(
            f"--metric-percentiles must be numbers in 0..100 separated by commas, got {args.metric_percentiles!r}"
        )
    opts: dict[str, Any] = {"seed": args.seed}
    for name in (
        "num_requests", "rate", "burstiness", "arrivals", "tenants", "system_prompts", "system_prompt_tokens",
        "think_time", "format",
    ):  # fmt: skip
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    try:
        workload = load_workload(args.workload, **opts)
        cfg = BenchConfig(
            endpoint=base_url,
            model=args.model,
            workload_models=args.workload_models,
            chat=chat,
            stream=not args.no_stream,
            api_key=args.api_key,
            tenant_keys=dict(args.tenant_key),
            max_concurrency=args.max_concurrency,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
            time_scale=args.time_scale,
            prompt_seed=args.seed,
            timeout_s=args.timeout,
            request_timeout_s=args.request_timeout,
        )
    except ValueError as exc:  # a setting's error (it starts with the setting's name) is told with its flag
        text = str(exc)
        return fail(name_flags(text, _FLAGS) if text.split(" ", 1)[0] in _FLAGS else text)
    if not len(workload):
        return fail(f"workload {args.workload!r} has no requests")
    try:
        if args.out:
            prepare_out_dir(args.out)
    except CLIError as exc:
        return fail(str(exc))
    if args.save_result:  # the file's folder, checked before the run: not after it, its results then lost
        folder = Path(args.result_dir or ".")
        target = folder / args.result_filename if args.result_filename else None
        # (a folder the file name brings is --result-filename's; --result-dir's own is its)
        flag = "--result-filename" if target is not None and target.parent != folder else "--result-dir"
        if target is not None and target.is_dir():
            return fail(f"--result-filename {target}: is a folder; give the result file's name")
        if (bad := unwritable(target.parent if target is not None else folder)) is not None:
            return fail(f"{flag}: {bad[0]} {bad[1]}")
    start = _start_line(workload, request_url(cfg), args.rate, args.time_scale, args.max_concurrency)
    print(start, file=sys.stderr, flush=True)
    progress = _Progress(len(workload), show=sys.stderr.isatty() and not args.no_progress)
    try:
        requests = run_bench_sync(workload, cfg, on_sent=progress.on_sent, on_done=progress.on_done)
    except BenchError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say how far it got; a cut-off run gets no report
        progress.close()
        print(
            f"headway: bench serve stopped with {progress.done} of {len(workload)} requests done "
            f"({progress.sent} sent); no report or result file: the requests still running are the slowest, "
            "so a cut-off run's latencies would read low",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        progress.close()
    summary = summarize(requests, slo=slo, name=args.name)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, default=str))
    else:
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 200).print(
            comparison_table({args.name: summary}, title=f"{args.workload} -> {base_url}")
        )
        if summary.aborted_by_reason:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary.aborted_by_reason.items()))
            print(f"aborted requests by reason: {reasons}")
            for line in _abort_messages(requests, summary.aborted_by_reason, workload, cfg):
                print(line)
    if args.out:
        write_report(
            Path(args.out),
            {args.name: (summary, requests)},
            title=f"bench serve {args.workload}",
            notes=[start.removeprefix("headway: ")],
            command=getattr(args, "command_line", None),  # summary.json says how it was made, as simulate's
        )
    if args.save_result:
        from headway.serve._bench_result import result_filename, vllm_bench_result, write_result

        model = str(requests[0].extra.get("model", args.model or "")) if requests else (args.model or "")
        rate = _arrivals(workload, args.rate, args.time_scale)[1]  # the rate sent at, scaled
        result = vllm_bench_result(
            requests,
            label=args.label or "openai",
            model_id=model,
            request_rate=rate,
            burstiness=_burstiness(workload, rate),
            max_concurrency=args.max_concurrency or None,
            goodput=summary.goodput,
            duration=summary.makespan,
            percentiles=percentiles,
        )
        path = result_filename(result, result_dir=args.result_dir, result_filename=args.result_filename)
        write_result(path, result)
        print(f"result saved to {path}", file=sys.stderr)
    return 0 if summary.num_completed else 1
