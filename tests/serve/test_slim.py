"""The core install has no scipy or matplotlib: the gateway, the bench client and reports work
without them (reports without figures), and what needs them says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("scipy", "matplotlib"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    """
)


def _run(code: str, tmp_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCK + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip


def test_gateway_bench_and_reports_without_scipy_and_matplotlib(tmp_path):
    proc = _run(
        """
        import sys
        from headway.serve import BackendConfig, GatewayConfig, create_app
        from headway.serve._cli import main
        from headway.metrics import summarize, write_report
        from headway.sim import simulate
        from headway.workload import load_workload

        app = create_app(GatewayConfig(backends=(BackendConfig("http://127.0.0.1:1"),), policy="bands"))
        res = simulate(load_workload("burst", num_requests=20, seed=0), "fcfs")
        paths = write_report("out", {"fcfs": (summarize(res.requests), res.requests)})
        assert paths.figures == {} and paths.html.exists(), paths
        assert "figures need matplotlib, which comes with the sim extra" in paths.html.read_text()
        assert not any(m.split(".")[0] in ("scipy", "matplotlib") for m in sys.modules)
        print("ok")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_what_needs_the_sim_extra_names_it(tmp_path):
    proc = _run(
        """
        from headway._optional import MissingExtraError
        from headway.policies import noisy_oracle_scores
        from headway.metrics import plot_timeline
        for call in (lambda: noisy_oracle_scores([1, 2, 3], 0.5), lambda: plot_timeline({})):
            try:
                call()
            except MissingExtraError as exc:
                print(exc)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "the noisy-oracle scorer needs scipy: pip install -e '.[sim]'",
        "figures needs matplotlib: pip install -e '.[sim]'",
    ]
