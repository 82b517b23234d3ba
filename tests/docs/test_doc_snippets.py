"""The Python the documentation shows runs as written, each block in a fresh interpreter.

A block that registers policies (the policy interface's examples) has each of them simulated too:
registering checks a class's declarations, a run checks its keys. The changelog and the generated
results pages are left out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
PAGES = [p for p in PAGES if p.name != "changelog.md" and "results" not in p.relative_to(ROOT).parts]

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# names a block leaves to the reader (its own prompts and lengths)
_GIVEN = {
    "docs/predictors/README.md": "prompt, output_tokens, model = 'Write a haiku about queues.', 24, 'gpt4'\n"
    "prompts = [prompt, 'Explain TCP congestion control in detail.']\n"
}
_DATA = re.compile(r"load_workload\(\"(?!default|burst)")
_BEFORE = "import headway.core as _hw_core\n_hw_before = set(_hw_core.available_policies())\n"
_AFTER = (
    "\nfrom headway.sim import simulate as _hw_simulate\n"
    "from headway.workload import load_workload as _hw_load\n"
    "for _hw_name in sorted(set(_hw_core.available_policies()) - _hw_before):\n"
    "    _hw_run = _hw_simulate(_hw_load('default', num_requests=200), _hw_name)\n"
    "    assert len(_hw_run.requests) == 200, _hw_name\n"
    "    print('simulated', _hw_name)\n"
)


def _snippets() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        found += [(name, i, code) for i, code in enumerate(_BLOCK.findall(page.read_text(encoding="utf-8")), 1)]
    return found


SNIPPETS = _snippets()


def test_the_pages_show_python() -> None:
    assert {page for page, _, _ in SNIPPETS} >= {"README.md", "docs/simulator.md", "docs/policies/index.md"}


@pytest.mark.parametrize(("page", "number", "code"), SNIPPETS, ids=[f"{p}#{n}" for p, n, _ in SNIPPETS])
def test_a_documented_python_block_runs(
    page: str, number: int, code: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, request
) -> None:
    import headway

    src = str(Path(headway.__file__).resolve().parents[1])  # this headway, installed or not
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HEADWAY_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "headway-cache")}
    if _DATA.search(code):
        env["HEADWAY_DATA_DIR"] = str(request.getfixturevalue("data_dir"))
    if "ShippedPredictor" in code:
        pytest.importorskip("onnxruntime", reason="the score extra")
    script = tmp_path / "snippet.py"
    script.write_text(_BEFORE + _GIVEN.get(page, "") + code + _AFTER, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"{page}, python block {number}:\n{run.stderr[-3000:]}"
    for name in re.findall(r"@register_policy\(\"([a-z0-9-]+)\"\)", code):
        assert f"simulated {name}" in run.stdout
