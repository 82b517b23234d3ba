"""argparse wiring: ``headway serve``, ``headway bench serve`` and the stub backend.

``headway.cli`` calls :func:`add_serve_parser` and :func:`add_bench_parser` on its
subparsers; each subcommand stores its handler in ``func`` (``args.func(args) -> int``).
``python -m headway.serve serve ...`` / ``bench serve ...`` / ``stub ...`` also runs them (the
stub backend has no ``headway`` subcommand).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_bench_parser", "add_bench_serve_parser", "add_serve_parser", "add_stub_parser", "main"]


def _kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _fail(message: str) -> int:
    """A CLI error: ``headway: error: ...`` on stderr; returns the exit status 2."""
    print(f"headway: error: {message}", file=sys.stderr)
    return 2


def _bad_port(port: int) -> str | None:
    return None if 0 <= port <= 65535 else f"--port must be in 0..65535, got {port}"


def _parse_value(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``headway serve``: the gateway."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the scheduling gateway in front of OpenAI-compatible backends",
        description="OpenAI-compatible gateway that queues requests in policy order.",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="URL",
        help="backend base URL (repeatable), e.g. http://127.0.0.1:8001",
    )
    p.add_argument("--policy", default=None, help="scheduling policy (default fcfs; see headway policies)")
    p.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        type=_kv,
        metavar="KEY=VALUE",
        help="policy setting (value parsed as JSON when possible), repeatable",
    )
    p.add_argument("--redis", default=None, metavar="URL", help="keep API keys (and queue state) in Redis")
    p.add_argument(
        "--redis-lease",
        type=float,
        default=None,
        metavar="S",
        help="replica liveness lease in Redis mode (default 5): a dead replica's queue entries "
        "and backend slots are reclaimed after S seconds",
    )
    p.add_argument(
        "--router",
        default=None,
        help="which backend with room gets a request: a headway router (default least-outstanding)",
    )
    p.add_argument(
        "--api-keys",
        default=None,
        choices=["auto", "required", "off"],
        help="require API keys (auto: when the config lists tenants)",
    )
    p.add_argument("--config", default=None, metavar="FILE", help="TOML or JSON gateway config")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--backend-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="max in-flight requests per --backend (default 8)",
    )
    p.add_argument(
        "--saturation-poll",
        type=float,
        default=None,
        metavar="S",
        help="read each --backend's /metrics every S seconds for saturation",
    )
    p.add_argument("--max-queue", type=int, default=None, help="queued requests before 429")
    p.add_argument("--max-queue-per-tenant", type=int, default=None, help="queued requests per tenant before 429")
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        help="400 above this many requested tokens; a request without max_tokens gets at most this many",
    )
    p.add_argument(
        "--queue-ttl",
        type=float,
        default=None,
        metavar="S",
        help="seconds queued before 408 (503 if no backend is reachable)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="on SIGTERM, finish in-flight and queued work for up to S seconds, then end the rest "
        "(503 with Retry-After, or a final error event in a stream)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=None,
        metavar="S",
        help="longest silence from a backend while waiting for or reading a response, which also bounds a "
        "whole non-streamed answer (default 300)",
    )
    p.add_argument(
        "--headers-timeout",
        type=float,
        default=None,
        metavar="S",
        help="streamed requests: a backend that sends no response headers, or then no first event, within S "
        "seconds is stalled: the request is retried on another (default 30; 0: only --read-timeout)",
    )
    p.add_argument(
        "--scorer",
        default=None,
        help="prompt scorer for score-ranked policies: 'default' (the trained predictor), a predictor "
        "checkpoint DIR, either with ':BACKEND' ('default:onnx-int8' is about twice as fast on CPU), "
        "or 'module:callable'",
    )
    p.add_argument(
        "--scorer-hold",
        type=float,
        default=None,
        metavar="S",
        help="while more requests are being scored than queued, free backends wait for the scores "
        "up to S seconds (default 0: never; with --redis, over all replicas)",
    )
    p.add_argument(
        "--scorer-threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads of a trained predictor (default 2, or 1 when the gateway may use only one CPU "
        "beside those a local vLLM gets: HEADWAY_VLLM_CPUS, by default all but the last on 2-4 CPUs)",
    )
    p.add_argument(
        "--scorer-max-length",
        type=int,
        default=None,
        metavar="TOKENS",
        help="truncate prompts to this many tokens when scoring with a trained predictor "
        "(default: its training length, 128; at 64 alpaca_eval's prompts score 1.4x as fast)",
    )
    p.add_argument(
        "--scorer-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="most prompts scored together; arrivals meanwhile wait for the next batch (default 32)",
    )
    p.add_argument(
        "--scorer-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="score in a worker process, apart from the event loop's GIL (default: off)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request (uvicorn access log)")
    p.set_defaults(func=_run_serve)
    return p


def build_config(args: argparse.Namespace) -> Any:
    from headway.serve._config import BackendConfig, load_config

    backend_kw: dict[str, Any] = {}
    if args.backend_concurrency is not None:
        backend_kw["max_concurrency"] = args.backend_concurrency
    if args.saturation_poll is not None:
        backend_kw["metrics_poll_s"] = args.saturation_poll
    backends = [BackendConfig(url, **backend_kw) for url in args.backend]
    overrides: dict[str, Any] = {
        "backends": backends,
        "policy": args.policy,
        "redis_url": args.redis,
        "max_queue_len": args.max_queue,
        "queue_ttl_s": args.queue_ttl,
        "drain_timeout_s": args.drain_timeout,
        "scorer": args.scorer,
        "scorer_hold_s": getattr(args, "scorer_hold", None),
        "scorer_threads": getattr(args, "scorer_threads", None),
        "scorer_max_length": getattr(args, "scorer_max_length", None),
        "scorer_batch_size": getattr(args, "scorer_batch_size", None),
        "scorer_process": getattr(args, "scorer_process", None),
        "api_keys": args.api_keys,
        "redis_lease_s": getattr(args, "redis_lease", None),
        "router": getattr(args, "router", None),
        "max_queue_per_tenant": getattr(args, "max_queue_per_tenant", None),
        "max_tokens_limit": getattr(args, "max_tokens_limit", None),
        "read_timeout_s": getattr(args, "read_timeout", None),
        "headers_timeout_s": getattr(args, "headers_timeout", None),
    }
    if args.policy_arg:
        overrides["policy_args"] = {k: _parse_value(v) for k, v in args.policy_arg}
    return load_config(args.config, **overrides)


def _run_serve(args: argparse.Namespace) -> int:
    from headway.serve._config import ConfigError
    from headway.serve._gateway import create_app
    from headway.serve._runner import run_app

    bad = _bad_port(args.port)
    if bad:
        return _fail(bad)
    try:
        config = build_config(args)
        app = create_app(config)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_app(
        app,
        args.host,
        args.port,
        drain_timeout_s=config.drain_timeout_s,
        log_level=args.log_level,
        access_log=getattr(args, "access_log", False),
    )
    return 0


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
    p.add_argument("--workload", default="burst", help="workload name or file (headway.workload.load_workload)")
    p.add_argument(
        "--num-prompts",
        "--num-requests",
        dest="num_requests",
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
    p.add_argument("--burstiness", type=float, default=None)
    p.add_argument("--arrivals", default=None, choices=["trace", "gamma", "gamma-vllm", "poisson", "burst"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tenants", default=None, help="tenant mix for load_workload ('default' or 'none')")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
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
        type=_kv,
        metavar="TENANT=KEY",
        help="bearer key for one tenant's requests (repeatable)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=0, help="most requests in flight (default 0: no limit, open loop)"
    )
    p.add_argument("--max-prompt-tokens", type=int, default=0, help="cap synthetic prompt length")
    p.add_argument("--max-output-tokens", type=int, default=0, help="cap output lengths")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=3600.0, help="whole-run limit in seconds")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--name", default="bench", help="run name in the report")
    p.add_argument("--out", default=None, help="write a headway report (JSON/CSV/plots) to this folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
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
    """A ``run_bench`` callback that keeps one status line on stderr (on a terminal)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = self.aborted = 0
        self._shown = 0.0

    def __call__(self, req: Any) -> None:
        self.done += 1
        self.aborted += req.state.name == "ABORTED"
        now = time.monotonic()
        if now - self._shown >= 0.1 or self.done == self.total:
            self._shown = now
            line = f"\r{self.done}/{self.total} requests done, {self.aborted} aborted"
            print(line, end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._shown:
            print(file=sys.stderr, flush=True)


def _run_bench(args: argparse.Namespace) -> int:
    from headway._help import CLIError, prepare_out_dir
    from headway.metrics import SLO, comparison_table, summarize, write_report
    from headway.serve._bench import BenchConfig, BenchError, run_bench_sync
    from headway.workload import load_workload

    try:
        slo = SLO.parse(args.goodput) if args.goodput else None
    except ValueError as exc:
        return _fail(f"--goodput: {exc}")
    if args.num_requests is not None and args.num_requests < 1:
        return _fail(f"--num-prompts must be >= 1, got {args.num_requests}")
    base_url, chat = args.base_url, args.chat
    if args.endpoint.startswith(("http://", "https://")):
        if base_url is not None:
            return _fail("--endpoint is the API path (e.g. /v1/completions) when --base-url is given")
        print("headway: --endpoint URL is the old spelling of --base-url URL", file=sys.stderr)
        base_url = args.endpoint
    elif args.endpoint.rstrip("/") in ("/v1/chat/completions", "/chat/completions"):
        chat = True
    elif args.endpoint.rstrip("/") not in ("/v1/completions", "/completions"):
        return _fail(f"--endpoint must be /v1/completions or /v1/chat/completions, got {args.endpoint!r}")
    if base_url is None:
        return _fail("--base-url URL is required (the server, e.g. http://127.0.0.1:8000)")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
        if not all(0 <= p <= 100 for p in percentiles):
            raise ValueError
    except ValueError:
        return _fail(
            f"--metric-percentiles must be numbers in 0..100 separated by commas, got {args.metric_percentiles!r}"
        )
    opts: dict[str, Any] = {"seed": args.seed}
    for name in ("num_requests", "rate", "burstiness", "arrivals", "tenants"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    try:
        workload = load_workload(args.workload, **opts)
        cfg = BenchConfig(
            endpoint=base_url,
            model=args.model,
            chat=chat,
            stream=not args.no_stream,
            api_key=args.api_key,
            tenant_keys=dict(args.tenant_key),
            max_concurrency=args.max_concurrency,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
            time_scale=args.time_scale,
            timeout_s=args.timeout,
            request_timeout_s=args.request_timeout,
        )
    except ValueError as exc:
        return _fail(str(exc))
    if not len(workload):
        return _fail(f"workload {args.workload!r} has no requests")
    try:
        if args.out:
            prepare_out_dir(args.out)
    except CLIError as exc:
        return _fail(str(exc))
    progress = _Progress(len(workload)) if sys.stderr.isatty() else None
    try:
        requests = run_bench_sync(workload, cfg, on_done=progress)
    except BenchError as exc:
        return _fail(str(exc))
    finally:
        if progress is not None:
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
    if args.out:
        write_report(Path(args.out), {args.name: (summary, requests)}, title=f"bench serve {args.workload}")
    if args.save_result:
        from headway.serve._bench_result import result_filename, vllm_bench_result, write_result

        model = str(requests[0].extra.get("model", args.model or "")) if requests else (args.model or "")
        result = vllm_bench_result(
            requests,
            label=args.label or "openai",
            model_id=model,
            request_rate=args.rate if args.rate is not None else float("inf"),
            burstiness=args.burstiness if args.burstiness is not None else 1.0,
            max_concurrency=args.max_concurrency or None,
            goodput=summary.goodput,
            duration=summary.makespan,
            percentiles=percentiles,
        )
        path = result_filename(result, result_dir=args.result_dir, result_filename=args.result_filename)
        write_result(path, result)
        print(f"result saved to {path}", file=sys.stderr)
    return 0 if summary.num_completed else 1


def add_stub_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``stub``: the fake OpenAI-compatible backend (tests, overhead benchmark)."""
    p: argparse.ArgumentParser = subparsers.add_parser("stub", help="run a fake OpenAI-compatible backend")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--max-num-seqs", type=int, default=0)
    p.add_argument("--first-token-delay", type=float, default=0.0, help="seconds before the first token")
    p.set_defaults(func=_run_stub)
    return p


def _run_stub(args: argparse.Namespace) -> int:
    from headway.serve._runner import run_app
    from headway.serve._stub import StubConfig, create_stub_app

    bad = _bad_port(args.port)
    if bad:
        return _fail(bad)
    app = create_stub_app(
        StubConfig(
            token_delay_s=args.token_delay, max_num_seqs=args.max_num_seqs, first_token_delay_s=args.first_token_delay
        )
    )
    # SIGTERM: requests still running after a second are cut (a fake backend has nothing to finish)
    run_app(app, args.host, args.port, drain_timeout_s=1.0, log_level="warning")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headway.serve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_stub_parser(sub)
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc
