"""Policies and routers from outside headway: entry points and HEADWAY_PLUGINS, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from headway.integrations._server import headway_src_dir

POLICY_MODULE = '''
from headway import Policy, register_policy

@register_policy("shortest-prompt")
class ShortestPromptPolicy(Policy):
    """Run the request with the shortest prompt first."""

    def key(self, request, now):
        return (request.num_prompt_tokens,)
'''


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``args`` in ``tmp_path``, with none of the caller's PYTHONPATH: a test's own ``PYTHONPATH``
    first, then the headway under test (an installed headway may be another checkout's)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("HEADWAY_PLUGINS", "PYTHONPATH")}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (env.pop("PYTHONPATH", ""), str(headway_src_dir())) if p)
    return subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env={**environ, **env}, timeout=120)


def _headway(*args: str) -> list[str]:
    return [sys.executable, "-m", "headway", *args]


def test_a_py_file_in_headway_plugins_reaches_the_cli(tmp_path: Path) -> None:
    (tmp_path / "my_policy.py").write_text(POLICY_MODULE)
    listed = _run(_headway("policies"), tmp_path, HEADWAY_PLUGINS="my_policy.py")
    assert listed.returncode == 0, listed.stderr
    assert "shortest-prompt" in listed.stdout and "Run the request with the shortest prompt first." in listed.stdout
    sim = _run(_headway("simulate", "--policies", "fcfs,shortest-prompt", "--num-requests", "100", "--no-report"),
               tmp_path, HEADWAY_PLUGINS="my_policy.py")
    assert sim.returncode == 0, sim.stderr
    assert "shortest-prompt: 100 requests" in sim.stdout
    # without the variable the name is unknown, with the list of valid ones
    plain = _run(_headway("simulate", "--policies", "shortest-prompt", "--no-report"), tmp_path)
    assert plain.returncode == 2 and "Unknown policy 'shortest-prompt'" in plain.stderr


def test_taking_a_built_in_name_fails_at_the_users_class_in_a_fresh_process(tmp_path: Path) -> None:
    """Before any lookup the built-ins are not imported yet: the clash is still the user's decorator's
    error, not one raised later from the built-in's import by make_policy."""
    code = textwrap.dedent("""
        from headway import Policy, register_policy
        try:
            @register_policy("fcfs")
            class Mine(Policy):
                def key(self, request, now):
                    return (0,)
        except ValueError as exc:
            print(exc)
    """)
    out = _run([sys.executable, "-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    clash = "policy name 'fcfs' is already registered by FCFSPolicy: register Mine under another name"
    assert out.stdout.strip() == clash


def test_a_module_in_headway_plugins_is_imported_once(tmp_path: Path) -> None:
    (tmp_path / "plugmod.py").write_text(POLICY_MODULE + "\nprint('imported')\n")
    code = ("from headway.core import make_policy, available_policies; available_policies(); "
            "print(type(make_policy('shortest-prompt')).__name__)")
    out = _run([sys.executable, "-c", code], tmp_path, HEADWAY_PLUGINS=" plugmod ,", PYTHONPATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["imported", "ShortestPromptPolicy"]


def test_a_bad_headway_plugins_entry_is_one_clear_error(tmp_path: Path) -> None:
    for item, why in (("no_such_module", "ModuleNotFoundError"), ("missing.py", "FileNotFoundError")):
        out = _run(_headway("simulate", "--policies", "fcfs", "--no-report"), tmp_path, HEADWAY_PLUGINS=item)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(f"headway: error: HEADWAY_PLUGINS: cannot import {item!r}: {why}")
        assert "Traceback" not in out.stderr


def _install_dist(site: Path, entry_points: str, modules: dict[str, str]) -> None:
    """A minimal installed distribution (dist-info with entry points) on a path to put on sys.path."""
    info = site / "myplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_entry_points_register_policies_and_routers_and_a_broken_one_only_warns(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_dist(
        site,
        """
        [headway.policies]
        shortest-prompt = myplug_decorated
        longest-prompt = myplug_plain:LongestPromptPolicy
        broken = myplug_broken
        [headway.routers]
        always-first = myplug_plain:AlwaysFirstRouter
        """,
        {
            "myplug_decorated": POLICY_MODULE,
            "myplug_plain": textwrap.dedent('''
                from headway import Policy
                from headway.core import Router

                class LongestPromptPolicy(Policy):
                    def key(self, request, now):
                        return (-request.num_prompt_tokens,)

                class AlwaysFirstRouter(Router):
                    def choose(self, request, targets, candidates=None, *, estimate=None):
                        return 0
            '''),
            "myplug_broken": "raise RuntimeError('this plugin is broken')\n",
        },
    )
    code = textwrap.dedent("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from headway.core import available_policies, available_routers, get_policy_class, get_router_class
            names = available_policies()
        print(get_policy_class("shortest-prompt").__name__, get_policy_class("longest-prompt").name)
        print("always-first" in available_routers(), get_router_class("always-first").__name__)
        print("broken" in names, [str(w.message) for w in caught])
    """)
    out = _run([sys.executable, "-c", code], tmp_path, PYTHONPATH=str(site))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "ShortestPromptPolicy longest-prompt"
    assert lines[1] == "True AlwaysFirstRouter"
    assert lines[2].startswith("False [\"policy plugin 'broken' (myplug_broken) failed to load: RuntimeError: "
                               "this plugin is broken\"]"), lines[2]
