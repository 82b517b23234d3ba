"""Time Microsoft Vidur's event loop on the Splitwise conversation trace (the speed anchor).

This script runs **inside Vidur's own virtualenv**, never ours: it imports Vidur from a
source checkout named by ``--vidur-path`` or the ``VIDUR_PATH`` environment variable
(prepended to ``sys.path``); at import time it needs only the standard library. No Vidur
code is copied here.

What it does:

1. Writes the first ``--num-requests`` rows of the trace (default: our
   ``shared/data/vidur_traces/splitwise_conv.csv``, identical to Vidur's
   ``data/processed_traces/splitwise_conv.csv``) to a temp dir: Vidur's trace-replay
   generator has no request-count option.
2. Builds a ``SimulationConfig``: trace-replay requests (Vidur's default ``max_tokens``
   4096, which trims the prompt of the ~8% of requests longer than that), model
   ``meta-llama/Meta-Llama-3-8B``, device ``a100`` (Vidur's A100-80GB SKU) on node
   ``a100_pairwise_nvlink`` (Vidur's default; no collective is used at TP=1), one
   replica, TP=1, PP=1, round-robin global scheduler, Sarathi replica scheduler with
   Vidur's defaults (chunk size 512, batch size cap 128), Vidur's default random-forest
   execution-time predictor, and metrics, plots, chrome/json traces and wandb off.
3. Constructs ``Simulator(config)``, timed as ``setup_seconds``: trace loading plus the
   execution-time predictor, which trains its models on a cold cache (tens of minutes
   on 2 cores) and loads them from ``--cache-dir`` afterwards.
4. Times only ``simulator.run()`` with ``time.perf_counter`` (and ``time.process_time``:
   on a shared machine CPU seconds are the steadier figure). ``run()`` never calls the
   trained models: the predictor fills lookup tables while it is built, and each batch
   reads them. ``--repeat N`` runs N fresh processes (Vidur's id counters are global)
   and keeps the fastest ``run()``.
5. Counts processed events without touching the loop: every Vidur event takes its id
   from the class counter ``BaseEvent._id``, and ``run()`` drains the heap, so events
   processed = ids handed out from just before the simulator was built to the end
   (checked: the queue is empty afterwards). ``--verify-event-count`` also swaps, at
   run time, the ``heapq`` name in ``vidur.simulator`` for a proxy whose ``heappop``
   counts, and checks both counts agree (this adds a call per event, so it is off by
   default).

``--quick-train`` (smoke tests, or a machine too busy for the cold training) trains a
10-tree random forest with 2-fold CV instead of Vidur's default 27-point grid with 10-fold
CV; give it its own ``--cache-dir``. Trained models and prediction tables are cached
under ``<cache-dir>/attention-<md5 of the attention CSV>/``: Vidur keys cached prediction
tables on its config and the estimator's repr only, so caches of different attention
profiles must not share a directory. When the ``wandb`` package is absent a stub module stands in for it
(Vidur's metrics modules import it at module level; nothing calls it with wandb off).

Prints ONE JSON line on stdout; everything else (Vidur's logs included: they go to
stdout, so file descriptor 1 is pointed at stderr while Vidur runs) goes to stderr.

**Attention profile.** The execution-time models train on Vidur's profiling CSVs under
``data/profiling``. A checkout without Git LFS objects (or a partial mirror) may lack
``compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv`` (a ~9 MB file), or hold only an
LFS pointer in its place. Then, unless ``--attention-csv`` names a real one, this script
writes a *synthetic* attention profile with the same columns and the same kind of grid as
Vidur's attention profiler (prefill chunks x KV sizes, full prefills, decode batch x KV),
timed by a roofline model of one A100 (FlashAttention-class prefill, memory-bound
decode), and says so in the JSON (``config.attention_profile``). The MLP/projection
profile (``mlp.csv``) is always Vidur's measured one. Event-loop speed depends on the
profile only through the batching it induces, so the numbers stay comparable in kind,
but the simulated latencies are not Vidur's published ones.

Usage (Vidur's venv)::

    VIDUR_PATH=/path/to/vidur nice python benchmarks/vidur_runner.py --num-requests 1000
"""

from __future__ import annotations

import argparse
import atexit
import csv
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent

MODEL_NAME = "meta-llama/Meta-Llama-3-8B"
DEVICE = "a100"
NETWORK_DEVICE = "a100_pairwise_nvlink"

# Roofline constants of the synthetic attention profile (one A100-80GB SXM, fp16).
_PEAK_FLOPS = 312e12  # dense fp16 tensor-core peak
_PREFILL_MFU = 0.62  # FlashAttention-2 forward reaches ~60% of peak on long sequences
_PREFILL_HALF_EFFICIENCY_TOKENS = 96  # short chunks fill the GPU poorly: eff * c / (c + 96)
_HBM_BYTES_PER_S = 1.6e12  # ~80% of 2.0 TB/s, what paged decode kernels reach
_KERNEL_OVERHEAD_MS = 0.010  # launch + tail per attention call
_KV_SAVE_BASE_MS = 0.015
_KV_SAVE_BYTES_PER_S = 0.8e12
_SYNTHETIC_MAX_SEQ_LEN = 8192
_SYNTHETIC_MAX_BATCH_SIZE = 128


def _log(msg: str) -> None:
    print(f"[vidur_runner] {msg}", file=sys.stderr, flush=True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--vidur-path", default=os.environ.get("VIDUR_PATH"), help="Vidur source checkout (default: $VIDUR_PATH)"
    )
    data_dir = Path(os.environ.get("HEADWAY_DATA_DIR") or _HERE.parent.parent / "shared" / "data")
    p.add_argument(
        "--trace",
        default=str(data_dir / "vidur_traces" / "splitwise_conv.csv"),
        help="Vidur processed trace CSV (default: $HEADWAY_DATA_DIR/vidur_traces/splitwise_conv.csv)",
    )
    p.add_argument("--num-requests", type=int, default=1000, help="replay the first N requests of the trace (0 = all)")
    p.add_argument("--chunk-size", type=int, default=512, help="Sarathi chunk size (Vidur default 512)")
    p.add_argument("--batch-size-cap", type=int, default=128, help="Sarathi batch size cap (Vidur default)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="Vidur trims prompts so prompt+output <= this (Vidur default 4096); larger values "
        "also raise the predictor's prediction_max_tokens_per_request",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="where Vidur caches trained execution-time models "
        "(default: $VIDUR_CACHE_DIR or <vidur-path>/cache, Vidur's own default location)",
    )
    p.add_argument(
        "--attention-csv",
        default=None,
        help="attention profile to use instead of the checkout's "
        "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv",
    )
    p.add_argument(
        "--no-synthetic-attention",
        action="store_true",
        help="fail instead of synthesizing an attention profile when the real one is missing",
    )
    p.add_argument(
        "--training-jobs", type=int, default=-1, help="n_jobs for Vidur's GridSearchCV (Vidur default -1: all cores)"
    )
    p.add_argument(
        "--with-metrics",
        action="store_true",
        help="keep Vidur's metrics store on (write_metrics=True, Vidur's default request/batch/"
        "utilization metrics; plots, traces and wandb stay off)",
    )
    p.add_argument(
        "--verify-event-count",
        action="store_true",
        help="also count heap pops through a proxy (adds a call per event to the timed loop)",
    )
    p.add_argument(
        "--quick-train",
        action="store_true",
        help="smoke test only: tiny random-forest grid and 2-fold CV (use with its own --cache-dir)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run this many times, each in a fresh process; the fastest run() counts (shared machine)",
    )
    p.add_argument("--keep-output", action="store_true", help="keep the temp dir (trace subset, Vidur's output dir)")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def _git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _write_trace_subset(src: Path, dst: Path, num_requests: int) -> int:
    """Copy the header and the first ``num_requests`` rows (all when 0); return the row count."""
    n = 0
    with src.open(newline="") as fin, dst.open("w", newline="") as fout:
        reader = csv.reader(fin)
        writer = csv.writer(fout)
        writer.writerow(next(reader))
        for row in reader:
            if num_requests and n >= num_requests:
                break
            writer.writerow(row)
            n += 1
    return n


def _is_real_csv(path: Path) -> bool:
    """True when ``path`` exists and is not a Git LFS pointer."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(64)
    return not head.startswith(b"version https://git-lfs")


# ------------------------------------------------------------------ synthetic attention
_ATTN_STATS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode", "attn_output_reshape")
_STAT_SUFFIXES = ("min", "max", "mean", "median", "std")
_ATTN_KEYS = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "max_model_len",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "attention_backend",
)


def _attention_grid(max_seq_len: int, max_batch_size: int) -> list[tuple[int, int, int, bool]]:
    """(prefill_chunk_size, kv_cache_size, batch_size, is_prefill) points, the kind of grid
    Vidur's attention profiler sweeps: chunked prefills (each chunk size at every multiple
    of itself as KV), full prefills, and decodes (batch size x KV length)."""
    chunks = [*range(64, 129, 16), *range(160, 1025, 32), *range(1088, 4097, 64), *range(4224, 16385, 128)]
    lengths = [*range(32, 1025, 32), *range(1088, 4097, 64), *range(4352, 65537, 256)]
    lengths = [x for x in lengths if x < max_seq_len]
    points: list[tuple[int, int, int, bool]] = []
    for c in chunks:
        if c > max_seq_len:
            break
        points.extend((c, i * c, 1, True) for i in range(max_seq_len // c))
    points.extend((n, 0, 1, True) for n in lengths)
    points.extend((0, kv, b, False) for kv in lengths for b in range(1, max_batch_size + 1))
    return list(dict.fromkeys(points))


def _attention_times_ms(
    chunk: int, kv: int, batch: int, is_prefill: bool, *, q_heads: int, kv_heads: int, head_dim: int
) -> dict[str, float]:
    kv_bytes_per_token = kv_heads * head_dim * 2 * 2  # K and V, fp16
    if is_prefill:
        # causal attention of `chunk` new queries over `kv` cached + the chunk itself
        flops = 4.0 * q_heads * head_dim * chunk * (kv + (chunk + 1) / 2)
        eff = _PEAK_FLOPS * _PREFILL_MFU * chunk / (chunk + _PREFILL_HALF_EFFICIENCY_TOKENS)
        mem = (kv + chunk) * kv_bytes_per_token / _HBM_BYTES_PER_S
        prefill = _KERNEL_OVERHEAD_MS + 1e3 * max(flops / eff, mem)
        decode = 0.0
        num_tokens = chunk
    else:
        prefill = 0.0
        decode = _KERNEL_OVERHEAD_MS + 1e3 * batch * kv * kv_bytes_per_token / _HBM_BYTES_PER_S
        num_tokens = batch
    kv_save = _KV_SAVE_BASE_MS + 1e3 * num_tokens * kv_bytes_per_token / _KV_SAVE_BYTES_PER_S
    return {
        "attn_input_reshape": 0.0,
        "attn_kv_cache_save": kv_save,
        "attn_prefill": prefill,
        "attn_decode": decode,
        "attn_output_reshape": 0.0,
    }


def _write_synthetic_attention(
    path: Path, *, embedding_dim: int, num_q_heads: int, num_kv_heads: int, block_size: int, tensor_parallel_size: int
) -> int:
    head_dim = embedding_dim // num_q_heads
    q_heads = num_q_heads // tensor_parallel_size
    kv_heads = max(1, num_kv_heads // tensor_parallel_size)
    header = [f"time_stats.{s}.{x}" for s in _ATTN_STATS for x in _STAT_SUFFIXES] + list(_ATTN_KEYS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    rows = 0
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for chunk, kv, batch, is_prefill in _attention_grid(_SYNTHETIC_MAX_SEQ_LEN, _SYNTHETIC_MAX_BATCH_SIZE):
            t = _attention_times_ms(chunk, kv, batch, is_prefill, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
            stats: list[Any] = []
            for s in _ATTN_STATS:
                v = round(t[s], 6)
                stats += [v, v, v, v, 0.0]
            keys = [embedding_dim, num_q_heads, num_kv_heads, block_size, tensor_parallel_size]
            keys += [2 * _SYNTHETIC_MAX_SEQ_LEN, batch, chunk, kv, is_prefill, "AttentionBackend.FLASHINFER"]
            w.writerow([*stats, *keys])
            rows += 1
    tmp.replace(path)
    return rows


# ------------------------------------------------------------------ runtime shims
def _ensure_wandb_importable() -> bool:
    """Vidur's metrics modules ``import wandb`` at module level; with metrics to wandb off
    nothing else of it is used. Install a stub module when the package is absent (we do
    not install wandb). Returns True when the stub was installed."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    try:
        import wandb  # noqa: F401

        return False
    except ImportError:
        stub = types.ModuleType("wandb")
        stub.run = None  # type: ignore[attr-defined]

        def _disabled(*_a: Any, **_k: Any) -> None:
            raise RuntimeError("wandb is stubbed out by vidur_runner.py")

        stub.init = stub.log = _disabled  # type: ignore[attr-defined]
        sys.modules["wandb"] = stub
        return True


class _CountingHeapq:
    """Stands in for the ``heapq`` module inside ``vidur.simulator`` to count pops."""

    def __init__(self, heapq_module: Any) -> None:
        self._heapq = heapq_module
        self.heappush = heapq_module.heappush
        self.num_pops = 0

    def heappop(self, heap: list[Any]) -> Any:
        self.num_pops += 1
        return self._heapq.heappop(heap)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._heapq, name)


def _count_pkl(d: Path) -> int:
    return sum(1 for _ in d.glob("*.pkl")) if d.is_dir() else 0


def _main_repeated(argv: list[str], repeat: int) -> int:
    """Run each repetition in a fresh process (Vidur keeps global id counters, so one
    process can build only one simulator) and report the fastest ``run()``."""
    child_argv: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--repeat":
            skip = True
        elif not a.startswith("--repeat="):
            child_argv.append(a)
    results = []
    for attempt in range(repeat):
        _log(f"repetition {attempt + 1}/{repeat}")
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *child_argv, "--repeat", "1"],
            stdout=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0:
            return proc.returncode
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    best = dict(min(results, key=lambda r: r["run_seconds"]))
    best["config"] = dict(
        best["config"],
        repeat=repeat,
        run_seconds_all=[r["run_seconds"] for r in results],
        setup_seconds_all=[r["setup_seconds"] for r in results],
    )
    best["setup_seconds"] = results[0]["setup_seconds"]
    best["config"]["cache_was_warm"] = results[0]["config"]["cache_was_warm"]
    print(json.dumps(best), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse_args(argv)
    if args.repeat > 1:
        return _main_repeated(argv, args.repeat)
    if not args.vidur_path:
        _log("no Vidur checkout: pass --vidur-path or set VIDUR_PATH")
        return 2
    vidur_path = Path(args.vidur_path).resolve()
    if not (vidur_path / "vidur" / "simulator.py").is_file():
        _log(f"{vidur_path} is not a Vidur source checkout (no vidur/simulator.py)")
        return 2
    trace = Path(args.trace).resolve()
    cache_dir = Path(args.cache_dir or os.environ.get("VIDUR_CACHE_DIR") or vidur_path / "cache").resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)

    # Keep stdout for our JSON line only: Vidur's logger writes to sys.stdout.
    sys.stdout.flush()
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    workdir = Path(tempfile.mkdtemp(prefix="vidur_runner_"))
    if not args.keep_output:
        # Registered before Vidur's own atexit writer, so it runs after it (atexit is LIFO).
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    trace_subset = workdir / "trace.csv"
    num_requests = _write_trace_subset(trace, trace_subset, args.num_requests)
    _log(f"trace: first {num_requests} requests of {trace} -> {trace_subset}")

    load_start = os.getloadavg()[0]
    sys.path.insert(0, str(vidur_path))
    wandb_stubbed = _ensure_wandb_importable()
    t0 = time.perf_counter()
    import heapq

    import vidur.simulator as vidur_simulator_module
    from vidur import config as vc
    from vidur.events.base_event import BaseEvent
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    import_seconds = time.perf_counter() - t0

    model_cfg = vc.BaseModelConfig.create_from_name(MODEL_NAME)
    tp = 1
    scheduler_cfg = vc.SarathiSchedulerConfig(chunk_size=args.chunk_size, batch_size_cap=args.batch_size_cap)

    profiling = vidur_path / "data" / "profiling"
    real_attention = profiling / "compute" / DEVICE / MODEL_NAME / "attention.csv"
    if args.attention_csv:
        attention_csv = Path(args.attention_csv).resolve()
        attention_profile = f"given: {attention_csv}"
    elif _is_real_csv(real_attention):
        attention_csv = real_attention
        attention_profile = "vidur (measured)"
    elif args.no_synthetic_attention:
        _log(f"{real_attention} is missing or an LFS pointer and --no-synthetic-attention was given")
        return 3
    else:
        attention_csv = cache_dir / "headway_synthetic" / DEVICE / MODEL_NAME / "attention.csv"
        rows = _write_synthetic_attention(
            attention_csv,
            embedding_dim=model_cfg.embedding_dim,
            num_q_heads=model_cfg.num_q_heads,
            num_kv_heads=model_cfg.num_kv_heads,
            block_size=scheduler_cfg.block_size,
            tensor_parallel_size=tp,
        )
        attention_profile = "synthetic roofline (Vidur's attention.csv is missing from the checkout)"
        _log(
            f"WARNING: {real_attention} missing or an LFS pointer; wrote a synthetic attention profile "
            f"({rows} rows) to {attention_csv}"
        )

    # Vidur keys its cached *prediction tables* on the config and str(estimator) only, not on
    # the training data: a cache filled from one attention profile would silently serve
    # stale predictions for another. Keep one cache subdir per attention profile.
    with attention_csv.open("rb") as f:
        attention_digest = hashlib.md5(f.read()).hexdigest()[:12]
    model_cache_dir = cache_dir / f"attention-{attention_digest}"
    model_cache_dir.mkdir(parents=True, exist_ok=True)

    predictor_kwargs: dict[str, Any] = dict(
        compute_input_file=str(profiling / "compute" / "{DEVICE}" / "{MODEL}" / "mlp.csv"),
        attention_input_file=str(attention_csv),
        all_reduce_input_file=str(profiling / "network" / "{NETWORK_DEVICE}" / "all_reduce.csv"),
        send_recv_input_file=str(profiling / "network" / "{NETWORK_DEVICE}" / "send_recv.csv"),
        cpu_overhead_input_file=str(profiling / "cpu_overhead" / "{NETWORK_DEVICE}" / "{MODEL}" / "cpu_overheads.csv"),
        num_training_job_threads=args.training_jobs,
    )
    if args.max_tokens > 4096:
        predictor_kwargs["prediction_max_tokens_per_request"] = args.max_tokens
    if args.quick_train:
        predictor_kwargs.update(num_estimators=[10], max_depth=[8], min_samples_split=[2], k_fold_cv_splits=2)
    metrics_on = args.with_metrics
    config = vc.SimulationConfig(
        seed=args.seed,
        cluster_config=vc.ClusterConfig(
            num_replicas=1,
            replica_config=vc.ReplicaConfig(
                model_name=MODEL_NAME,
                device=DEVICE,
                network_device=NETWORK_DEVICE,
                tensor_parallel_size=tp,
                num_pipeline_stages=1,
            ),
            global_scheduler_config=vc.RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=scheduler_cfg,
        ),
        request_generator_config=vc.TraceRequestGeneratorConfig(
            trace_file=str(trace_subset), max_tokens=args.max_tokens
        ),
        execution_time_predictor_config=vc.RandomForrestExecutionTimePredictorConfig(**predictor_kwargs),
        metrics_config=vc.MetricsConfig(
            write_metrics=metrics_on,
            write_json_trace=False,
            enable_chrome_trace=False,
            store_plots=False,
            save_table_to_wandb=False,
            wandb_project=None,
            store_request_metrics=metrics_on,
            store_batch_metrics=metrics_on,
            store_utilization_metrics=metrics_on,
            output_dir=str(workdir / "simulator_output"),
            cache_dir=str(model_cache_dir),
        ),
    )

    set_seeds(config.seed)
    pkl_before = _count_pkl(model_cache_dir)
    id_before = BaseEvent._id
    t0 = time.perf_counter()
    simulator = Simulator(config)
    setup_seconds = time.perf_counter() - t0
    pkl_after = _count_pkl(model_cache_dir)
    _log(
        f"setup (trace load + execution-time predictor) took {setup_seconds:.2f} s; "
        f"cache {model_cache_dir}: {pkl_before} -> {pkl_after} pickles"
    )

    counter = None
    if args.verify_event_count:
        counter = _CountingHeapq(heapq)
        vidur_simulator_module.heapq = counter  # type: ignore[assignment]
    try:
        c0 = time.process_time()
        t0 = time.perf_counter()
        simulator.run()
        run_seconds = time.perf_counter() - t0
        run_cpu_seconds = time.process_time() - c0
    finally:
        if counter is not None:
            vidur_simulator_module.heapq = heapq

    queue_left = len(simulator._event_queue)
    num_events = BaseEvent._id - id_before - queue_left
    if queue_left:
        _log(f"WARNING: {queue_left} events left in the queue (time limit?)")
    if counter is not None and counter.num_pops != num_events:
        _log(f"WARNING: pop count {counter.num_pops} != id count {num_events}")
    _log(
        f"run() took {run_seconds:.3f} s ({run_cpu_seconds:.3f} s CPU) for {num_requests} requests, "
        f"{num_events} events; simulated time {simulator._time:.1f} s"
    )

    import numpy
    import pandas
    import sklearn

    result = {
        "num_requests": num_requests,
        "run_seconds": round(run_seconds, 4),
        "requests_per_second": round(num_requests / run_seconds, 1),
        "num_events": num_events,
        "events_per_second": round(num_events / run_seconds, 1),
        "setup_seconds": round(setup_seconds, 2),
        # CPU time of run() (this process): the shared machine's load inflates wall time
        "run_cpu_seconds": round(run_cpu_seconds, 4),
        "events_per_cpu_second": round(num_events / run_cpu_seconds, 1),
        "vidur_commit": _git_commit(vidur_path),
        "config": {
            "model": MODEL_NAME,
            "device": DEVICE,
            "network_device": NETWORK_DEVICE,
            "num_replicas": 1,
            "tensor_parallel_size": tp,
            "num_pipeline_stages": 1,
            "global_scheduler": "round_robin",
            "replica_scheduler": "sarathi",
            "chunk_size": scheduler_cfg.chunk_size,
            "batch_size_cap": scheduler_cfg.batch_size_cap,
            "num_blocks": scheduler_cfg.num_blocks,
            "request_generator": "trace_replay",
            "trace": str(trace),
            "max_tokens": args.max_tokens,
            "execution_time_predictor": "random_forrest" + (" (quick-train)" if args.quick_train else ""),
            "attention_profile": attention_profile,
            "attention_csv": str(attention_csv),
            "cache_dir": str(model_cache_dir),
            "cache_was_warm": pkl_before > 0 and pkl_after == pkl_before,
            "metrics": "vidur default stores, no plots/traces/wandb" if metrics_on else "off",
            "wandb_stubbed": wandb_stubbed,
            "event_count_method": "BaseEvent._id delta"
            + (f", verified by heappop count {counter.num_pops}" if counter else ""),
            "simulated_seconds": round(float(simulator._time), 3),
            "import_seconds": round(import_seconds, 2),
            "python": platform.python_version(),
            # the interpreter's installation: builds of one version differ in speed (1.5x for Vidur
            # between pyenv's default build and Debian's); bench_simulator.py compares it with headway's
            "python_base_prefix": sys.base_prefix,
            "numpy": numpy.__version__,
            "pandas": pandas.__version__,
            "scikit_learn": sklearn.__version__,
            "cpu_count": os.cpu_count(),
            "loadavg_1m_start": round(load_start, 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
    }
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()
    if math.isfinite(run_seconds):
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
