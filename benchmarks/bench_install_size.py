"""Disk size of each install variant: a fresh virtualenv per variant, ``pip install``, ``du``.

    python benchmarks/bench_install_size.py [--variants core serve sim serve,sim] [--workdir DIR]

Builds headway from this checkout (a copy of ``pyproject.toml``, ``README.md`` and ``src``) into a
new venv per variant (``core`` = no extra) under ``--workdir`` (a temporary folder by default),
with the interpreter running this script and pip's default index settings. Sizes include the
empty venv (pip and setuptools), which is measured too. Writes
``benchmarks/results/install_size.md`` (overwritten).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "install_size.md"


def _size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def _measure(work: Path, variant: str, src: Path) -> tuple[float, float, list[str]]:
    venv = work / f"venv-{variant.replace(',', '-')}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    t0 = time.monotonic()
    if variant != "empty":
        spec = str(src) if variant == "core" else f"{src}[{variant}]"
        subprocess.run([*pip, "install", "-q", spec], check=True, stdout=subprocess.DEVNULL)
    took = time.monotonic() - t0
    pkgs = subprocess.run([*pip, "list", "--format=freeze"], check=True, capture_output=True, text=True).stdout
    return _size_mib(venv), took, sorted(p.split("==")[0].lower() for p in pkgs.split())


def shown_command(argv: list[str]) -> str:
    """The command line as the result file shows it: ``--workdir``'s value (a local path) as ``DIR``."""
    shown = ["DIR" if i and argv[i - 1] == "--workdir" else a for i, a in enumerate(argv)]
    shown = ["--workdir=DIR" if a.startswith("--workdir=") else a for a in shown]
    return " ".join(["python benchmarks/bench_install_size.py", *shown])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["core", "serve", "sim", "serve,sim"])
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="headway-install-"))
    src = work / "src-copy"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    rows = []
    base, _, base_pkgs = _measure(work, "empty", src)
    for v in args.variants:
        size, took, pkgs = _measure(work, v, src)
        extra = [p for p in pkgs if p not in base_pkgs and p != "headway"]
        rows.append(f"| `{v}` | {size:.0f} | {size - base:.0f} | {took:.0f} | {', '.join(extra)} |")
        print(rows[-1], flush=True)
    cmd = shown_command(sys.argv[1:])
    OUT.write_text(
        "# Install size per variant\n\n"
        f"Command: `{cmd}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python "
        f"{sys.version.split()[0]}). Each variant in a fresh venv; MiB on disk (files, .pyc included); "
        f"an empty venv is {base:.0f} MiB.\n\n"
        "| variant | MiB | MiB over an empty venv | install s | packages besides headway, pip, setuptools |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
