"""argparse wiring: ``headway serve`` (the gateway) and the stub backend; ``headway bench serve``
is :mod:`headway.serve._bench_cli`'s.

``headway.cli`` calls :func:`add_serve_parser`, ``add_bench_parser`` and :func:`add_stub_parser` on
its subparsers; each subcommand stores its handler in ``func`` (``args.func(args) -> int``).
``python -m headway.serve serve ...`` / ``bench serve ...`` / ``stub ...`` (:func:`main`) also runs
them, as ``headway serve``, ``headway bench serve`` and ``headway stub`` do.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from headway._help import CLIParser, fail, key_value, nonempty, refuse_abbreviations
from headway.serve._bench_cli import add_bench_parser

__all__ = ["add_serve_parser", "add_stub_parser", "build_config", "main"]


def _bad_port(port: int) -> str | None:
    return None if 0 <= port <= 65535 else f"--port must be in 0..65535, got {port}"


_FLAGS: dict[str, str] = {
    "max_queue_len": "--max-queue", "queue_ttl_s": "--queue-ttl", "drain_timeout_s": "--drain-timeout",
    "read_timeout_s": "--read-timeout", "headers_timeout_s": "--headers-timeout", "redis_url": "--redis",
    "redis_lease_s": "--redis-lease", "scorer_hold_s": "--scorer-hold",
    "client_send_timeout_s": "--client-send-timeout",
    "backends.max_concurrency": "--backend-concurrency", "backends.metrics_poll_s": "--saturation-poll",
    **{n: "--" + n.replace("_", "-") for n in (
        "scorer", "scorer_threads", "scorer_max_length", "scorer_batch_size", "max_queue_per_tenant",
        "max_tokens_limit", "default_max_tokens", "online_learning", "online_state", "passthrough",
        "forwarded_allow_ips", "min_priority", "tokenizer",
    )},
}  # fmt: skip
"""The gateway settings ``serve`` has a flag for -> the flag (for errors)."""


def _flag_named(message: str, args: argparse.Namespace) -> str:
    """A setting's error told with its flag when the flag gave the setting (``max_queue_len must be >= 1,
    got 0`` -> ``--max-queue must be >= 1, got 0``); else as it is (a config file's or a variable's)."""
    for key, flag in _FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None or value is False or (key.startswith("backends.") and f"got {value}" not in message):
            continue  # not given, or (a --backend-* flag) not the value the error is about
        for subject in (f"{key} ", f"gateway setting {key!r} "):
            if message.startswith(subject):
                return f"{flag} {message.removeprefix(subject)}"
    return message


def _parse_value(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


_D: dict[str, Any] = {
    "policy": "fcfs",
    "router": "least-outstanding",
    "api_keys": "auto",
    "max_queue_len": 10_000,
    "max_queue_per_tenant": 0,
    "max_tokens_limit": 0,
    "default_max_tokens": 0,
    "queue_ttl_s": 60.0,
    "drain_timeout_s": 30.0,
    "read_timeout_s": 300.0,
    "headers_timeout_s": 30.0,
    "client_send_timeout_s": 60.0,
    "scorer_batch_size": 32,
}
"""GatewayConfig's defaults as ``serve --help`` states them (the serve flags default to None so that a
config file's values stand; a test checks these against the dataclass)."""
_DEFAULT_POLL = 0.5
"""BackendConfig's default ``/metrics`` period without a fixed limit (checked by the same test)."""


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
    p.add_argument("--policy", default=None, help=f"scheduling policy (default {_D['policy']}; see headway policies)")
    p.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="NAME.KEY=VALUE",
        help="policy setting, as in headway simulate: NAME.KEY=VALUE with NAME the --policy (value parsed as "
        "JSON when possible), repeatable; KEY=VALUE alone is accepted too",
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
        help=f"which backend with room gets a request: a headway router (default {_D['router']})",
    )
    p.add_argument(
        "--router-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="router setting, as in headway simulate (value parsed as JSON when possible), repeatable",
    )
    p.add_argument(
        "--api-keys",
        default=None,
        choices=["auto", "required", "off"],
        help=f"require API keys (auto: when the config lists tenants; default {_D['api_keys']})",
    )
    p.add_argument("--config", default=None, metavar="FILE", help="TOML or JSON gateway config")
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1; HEADWAY_HOST)")
    p.add_argument("--port", type=int, default=None, help="listen port (default 8000; HEADWAY_PORT)")
    p.add_argument(
        "--backend-api-key",
        default=None,
        metavar="KEY",
        help="sent upstream as 'Authorization: Bearer KEY' to every --backend (vLLM's --api-key; "
        "default none; HEADWAY_BACKEND_API_KEY)",
    )
    p.add_argument(
        "--backend-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="a fixed limit of in-flight requests per --backend instead of following its /metrics "
        "(default 0: no fixed limit)",
    )
    p.add_argument(
        "--saturation-poll",
        type=float,
        default=None,
        metavar="S",
        help="read each --backend's /metrics (vLLM's or SGLang's waiting count and KV usage) every S seconds "
        f"(default {_DEFAULT_POLL} without --backend-concurrency, else 0: never)",
    )
    p.add_argument(
        "--max-queue", type=int, default=None, help=f"queued requests before 429 (default {_D['max_queue_len']})"
    )
    p.add_argument(
        "--max-queue-per-tenant",
        type=int,
        default=None,
        help=f"queued requests per tenant before 429 (default {_D['max_queue_per_tenant']}: no limit)",
    )
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        help="400 above this many requested tokens; a request asking for none is sent with this many "
        f"(default {_D['max_tokens_limit']}: no limit)",
    )
    p.add_argument(
        "--min-priority",
        type=int,
        default=None,
        metavar="N",
        help="400 for a request whose priority (vLLM's field: lower runs first) is below N, for tenants "
        "without a min_priority of their own (default: no bound)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="add max_tokens=N to requests that have none (default "
        f"{_D['default_max_tokens']}: add nothing, or --max-tokens-limit if set; the backend's own default applies)",
    )
    p.add_argument(
        "--add-stream-usage",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add stream_options.include_usage to streams that lack it, for exact token counts (hidden from "
        "the client; default: off, requests go as sent)",
    )
    p.add_argument(
        "--queue-ttl",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds queued before 408 (503 if no backend is reachable; default {_D['queue_ttl_s']:g})",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="on SIGTERM, finish in-flight and queued work for up to S seconds, then end the rest "
        f"(503 with Retry-After, or a final error event in a stream; default {_D['drain_timeout_s']:g})",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=None,
        metavar="S",
        help="longest silence from a backend while waiting for or reading a response, which also bounds a "
        f"whole non-streamed answer (default {_D['read_timeout_s']:g})",
    )
    p.add_argument(
        "--headers-timeout",
        type=float,
        default=None,
        metavar="S",
        help="streamed requests: a backend that sends no response headers, or then no first event, within S "
        f"seconds is stalled: the request is retried on another (default {_D['headers_timeout_s']:g}; "
        "0: only --read-timeout)",
    )
    p.add_argument(
        "--client-send-timeout",
        type=float,
        default=None,
        metavar="S",
        help="a client that takes none of its answer for S seconds (a stream it does not read) is cut off and "
        f"its backend slot freed (default {_D['client_send_timeout_s']:g})",
    )
    p.add_argument(
        "--scorer",
        default=None,
        help="prompt scorer for score-ranked policies: 'default' (the trained predictor), a predictor "
        "checkpoint DIR, either with ':BACKEND' ('default:onnx-int8': int8 ONNX Runtime, faster on CPUs with VNNI; "
        "'default:onnx': the float graph), "
        "or 'module:callable' (default: none)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH_OR_NAME",
        help="with --scorer: the tokenizer that decodes a completions prompt of token ids into text to score "
        "(vLLM's --tokenizer: a local directory or a name in the local Hugging Face cache, nothing downloaded; "
        "needs the predict extra; default: none, such a prompt gets the fallback score)",
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
        "(default: its training length, 96 for the shipped default; shorter scores faster)",
    )
    p.add_argument(
        "--scorer-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="most prompts scored together; arrivals meanwhile wait for the next batch "
        f"(default {_D['scorer_batch_size']})",
    )
    p.add_argument(
        "--scorer-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="score in a worker process, apart from the event loop's GIL (default: off)",
    )
    p.add_argument(
        "--scorer-fast-path",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dispatch a request that competes with no other (nothing queued, a free slot for every "
        "request being scored) at once and score it in the background (default: on; without --redis)",
    )
    p.add_argument(
        "--online-learning",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="refit the scorer per model on the requests it finished (needs --scorer default; default: off)",
    )
    p.add_argument(
        "--online-state",
        default=None,
        metavar="FILE",
        help="with --online-learning and no --redis: save the learned windows to FILE and resume from it",
    )
    p.add_argument(
        "--passthrough",
        type=nonempty,
        default=None,
        metavar="all|none|PATHS",
        help="which other /v1 endpoints go to a backend unscheduled: all, none, or paths (each with the paths "
        "under it) separated by commas, e.g. /v1/embeddings,/v1/tokenize; any other is a 404 (default all)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        type=nonempty,
        default=None,
        metavar="IPS",
        help="proxies (addresses, networks, or *) whose X-Forwarded-For and X-Forwarded-Proto name the client, "
        "separated by commas; backends are sent the client's address as X-Forwarded-For, never a client's own "
        "(default: none trusted)",
    )
    p.add_argument("--log-level", default=None, help="default info (HEADWAY_LOG_LEVEL)")
    p.add_argument(
        "--log-format",
        default=None,
        choices=["text", "json"],
        help="text lines, or one JSON object per line (default text; HEADWAY_LOG_FORMAT)",
    )
    p.add_argument("--access-log", action="store_true", help="log every HTTP request (uvicorn access log)")
    p.set_defaults(func=_run_serve)
    return p


def build_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Any:
    """The gateway config of ``headway serve``: the --config file, then ``HEADWAY_*`` variables of
    ``env`` (default ``os.environ``), then the flags."""
    from headway.serve._config import BackendConfig, ConfigError, check_backend_url
    from headway.serve._config_load import load_config

    env = os.environ if env is None else env
    backend_kw: dict[str, Any] = {}
    if args.backend_concurrency is not None:
        backend_kw["max_concurrency"] = args.backend_concurrency
    if args.saturation_poll is not None:
        if not (args.saturation_poll >= 0 and math.isfinite(args.saturation_poll)):  # (-1 is the unset default)
            raise ConfigError(f"--saturation-poll must be a finite number of seconds >= 0, got {args.saturation_poll}")
        backend_kw["metrics_poll_s"] = args.saturation_poll
    key = getattr(args, "backend_api_key", None) or env.get("HEADWAY_BACKEND_API_KEY")
    if key:
        backend_kw["api_key"] = key
    for url in args.backend:
        check_backend_url(url, "--backend")
    backends = [BackendConfig(url, **backend_kw) for url in args.backend]
    overrides: dict[str, Any] = {
        "backends": backends,
        "policy": args.policy,
        "redis_url": args.redis,
        "max_queue_len": args.max_queue,
        "queue_ttl_s": args.queue_ttl,
        "drain_timeout_s": args.drain_timeout,
        "scorer": args.scorer,
        "tokenizer": getattr(args, "tokenizer", None),
        "scorer_hold_s": getattr(args, "scorer_hold", None),
        "scorer_threads": getattr(args, "scorer_threads", None),
        "scorer_max_length": getattr(args, "scorer_max_length", None),
        "scorer_batch_size": getattr(args, "scorer_batch_size", None),
        "scorer_process": getattr(args, "scorer_process", None),
        "scorer_fast_path": getattr(args, "scorer_fast_path", None),
        "online_learning": getattr(args, "online_learning", None),
        "online_state": getattr(args, "online_state", None),
        "api_keys": args.api_keys,
        "redis_lease_s": getattr(args, "redis_lease", None),
        "router": getattr(args, "router", None),
        "max_queue_per_tenant": getattr(args, "max_queue_per_tenant", None),
        "max_tokens_limit": getattr(args, "max_tokens_limit", None),
        "min_priority": getattr(args, "min_priority", None),
        "read_timeout_s": getattr(args, "read_timeout", None),
        "headers_timeout_s": getattr(args, "headers_timeout", None),
        "client_send_timeout_s": getattr(args, "client_send_timeout", None),
        "default_max_tokens": getattr(args, "default_max_tokens", None),
        "add_stream_usage": getattr(args, "add_stream_usage", None),
        "passthrough": getattr(args, "passthrough", None),
        "forwarded_allow_ips": getattr(args, "forwarded_allow_ips", None),
    }
    if args.policy_arg:
        overrides["policy_args"] = _policy_args(args.policy_arg, args.policy)
    if getattr(args, "router_arg", None):
        overrides["router_args"] = {key: _parse_value(value) for key, value in args.router_arg}
    return load_config(args.config, env=env, **overrides)


def _policy_args(items: list[tuple[str, str]], policy: str | None) -> dict[str, Any]:
    """``--policy-arg NAME.KEY=VALUE`` (headway simulate's syntax; NAME must be the --policy) or
    ``KEY=VALUE`` -> settings (values parsed as JSON when they parse)."""
    from headway.serve._config import ConfigError

    out: dict[str, Any] = {}
    for target, value in items:
        name, dot, key = target.rpartition(".")
        if dot and not key:
            raise ConfigError(f"--policy-arg expects NAME.KEY=VALUE, got {target}={value}")
        if dot and policy is not None and name != policy:
            raise ConfigError(
                f"--policy-arg {target}={value}: NAME.KEY=VALUE names policy {name!r}, but --policy is {policy!r}"
            )
        out[key if dot else target] = _parse_value(value)
    return out


def _listen_problem(exc: OSError) -> str:
    """What ``headway serve`` or ``headway stub`` says when it cannot listen on ``--host``/``--port``."""
    import errno

    if exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror}: stop what listens there or choose another --port"
    return f"{exc.strerror}: check --host and --port"


def _run_serve(args: argparse.Namespace) -> int:
    from headway.serve._config import ConfigError
    from headway.serve._config_load import describe_config
    from headway.serve._gateway import create_app
    from headway.serve._logging import setup_logging
    from headway.serve._runner import ListenError, bind_sockets, run_app

    env = os.environ
    host = args.host or env.get("HEADWAY_HOST") or "127.0.0.1"
    try:
        port = args.port if args.port is not None else int(env.get("HEADWAY_PORT") or 8000)
    except ValueError:
        return fail(f"HEADWAY_PORT must be an integer, got {env.get('HEADWAY_PORT')!r}")
    bad = _bad_port(port)
    if bad:
        return fail(bad)
    log_level = (args.log_level or env.get("HEADWAY_LOG_LEVEL") or "info").lower()
    log_format = args.log_format or env.get("HEADWAY_LOG_FORMAT") or "text"
    if log_format not in ("text", "json"):
        return fail(f"HEADWAY_LOG_FORMAT must be text or json, got {log_format!r}")
    if log_level not in ("debug", "info", "warning", "error", "critical"):
        return fail(f"the log level must be debug, info, warning, error or critical, got {log_level!r}")
    try:
        config = build_config(args, env)
    except (ConfigError, ValueError) as exc:
        return fail(_flag_named(str(exc), args))
    try:  # bound before the app starts (a scorer may take a while to load): a port in use fails at once
        sockets = bind_sockets(host, port)
    except ListenError as exc:
        return fail(_listen_problem(exc))
    app = None
    try:
        setup_logging(log_level, log_format)  # before the app is made: what it logs while starting shows
        app = create_app(config)
    except (ConfigError, ValueError) as exc:
        return fail(_flag_named(str(exc), args))
    finally:
        if app is None:
            for sock in sockets:
                sock.close()
    log = logging.getLogger("headway.serve")
    log.info(
        "headway gateway on http://%s:%d, effective configuration: %s",
        host,
        port,
        json.dumps(describe_config(config), default=str),
    )
    run_app(
        app,
        host,
        port,
        drain_timeout_s=config.drain_timeout_s,
        log_level=log_level,
        access_log=getattr(args, "access_log", False),
        own_logging=log_format == "json",
        sockets=sockets,
        on_listening=lambda url: log.info("headway gateway listening on %s (press CTRL+C to quit)", url),
    )
    return 0


def add_stub_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``stub``: the fake OpenAI-compatible backend (tests, overhead benchmark)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "stub",
        help="run a fake OpenAI-compatible backend (tests, the gateway's overhead)",
        description="A fast fake vLLM: /v1/completions and /v1/chat/completions generate exactly max_tokens "
        "tokens (as with ignore_eos), /metrics publishes vLLM's gauges.",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    p.add_argument("--port", type=int, default=8001, help="listen port (default %(default)s)")
    p.add_argument("--model", default="stub-model", help="model name it lists and answers as (default %(default)s)")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens (default %(default)s)")
    p.add_argument(
        "--max-num-seqs", type=int, default=0, help="requests generating at once (default %(default)s: no limit)"
    )
    p.add_argument(
        "--first-token-delay", type=float, default=0.0, help="seconds before the first token (default %(default)s)"
    )
    p.set_defaults(func=_run_stub)
    return p


def _run_stub(args: argparse.Namespace) -> int:
    from headway.serve._logging import setup_logging
    from headway.serve._runner import ListenError, bind_sockets, run_app
    from headway.serve._stub import StubConfig, create_stub_app

    bad = _bad_port(args.port)
    if bad:
        return fail(bad)
    for flag, value in (("--token-delay", args.token_delay), ("--first-token-delay", args.first_token_delay)):
        if not (math.isfinite(value) and value >= 0):
            return fail(f"{flag} must be a finite number of seconds >= 0, got {value}")
    if args.max_num_seqs < 0:
        return fail(f"--max-num-seqs must be >= 0 (0: no limit), got {args.max_num_seqs}")
    try:
        sockets = bind_sockets(args.host, args.port)
    except ListenError as exc:
        return fail(_listen_problem(exc))
    setup_logging("info")  # for its one line once listening, as the gateway's; uvicorn's own say warnings only
    config = StubConfig(
        model=args.model,
        token_delay_s=args.token_delay,
        max_num_seqs=args.max_num_seqs,
        first_token_delay_s=args.first_token_delay,
    )
    app = create_stub_app(config)

    def listening(url: str) -> None:
        logging.getLogger("headway.serve").info(
            "headway stub on %s: a fake OpenAI-compatible backend answering as model %r (press CTRL+C to quit)",
            url,
            config.model,
        )

    # SIGTERM: requests still running after a second are cut (a fake backend has nothing to finish)
    run_app(
        app, args.host, args.port, drain_timeout_s=1.0, log_level="warning", sockets=sockets, on_listening=listening
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = CLIParser(prog="python -m headway.serve")  # as `headway`'s: one-line errors, no abbreviations
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_stub_parser(sub)
    refuse_abbreviations(parser)
    args = parser.parse_args(argv)
    args.command_line = "python -m headway.serve " + shlex.join(sys.argv[1:] if argv is None else argv)
    rc: int = args.func(args)
    return rc
