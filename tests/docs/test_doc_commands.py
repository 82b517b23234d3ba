"""The commands the documentation shows: every `headway` subcommand, flag, policy and router they name exists;
and the pages that list the built-in policies, routers and workloads list every one.

A reader copies commands from the README and the guides; a flag renamed in the code and not in the
docs fails here instead of at the reader's shell. The generated results pages and the changelog
(which keeps the names of its time) are left out.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from headway.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs").glob("policies/*.md"),
     *(ROOT / "docs").glob("predictors/*.md")]
)  # fmt: skip
PAGES = [p for p in PAGES if p.name != "changelog.md"]

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`(headway [^`]+)`")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_ENV = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+")


def _block_commands(block: str) -> list[tuple[str, bool]]:
    """The `headway ...` command lines of a code block (a continuation, after a backslash or
    indented under its command, joined to it; a shell comment dropped), each with whether
    HEADWAY_PLUGINS is set for it."""
    commands: list[str] = []
    open_command = False
    for line in block.splitlines():
        text = line.split(" # ")[0].rstrip()
        stripped = text.strip()
        if open_command and (line[:1].isspace() or commands[-1].endswith("\\")) and stripped:
            commands[-1] = commands[-1].rstrip("\\").rstrip() + " " + stripped
            continue
        stripped = stripped.removeprefix("# ")  # `# headway sweep --grid ...` heading a grid file
        env = _ENV.match(stripped)
        rest = stripped[env.end() :] if env else stripped
        open_command = rest.startswith("headway ")
        if open_command:
            commands.append(stripped)
    return [(c[_ENV.match(c).end() :] if _ENV.match(c) else c, "HEADWAY_PLUGINS=" in c) for c in commands]


def _commands() -> list[tuple[str, str, bool, bool]]:
    """(page, command, from a code block, with HEADWAY_PLUGINS) for every command the pages show."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        for block in _FENCE.findall(text):
            found += [(name, c, True, plugins) for c, plugins in _block_commands(block)]
        prose = _FENCE.sub("", text)
        found += [(name, " ".join(m.split()), False, False) for m in _INLINE.findall(prose)]
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _resolve(words: list[str]) -> tuple[list[str], argparse.ArgumentParser | None]:
    """The subcommand path the words name and its parser (None when the first word names none)."""
    parser, path = build_parser(), []
    for word in words:
        subs = _subparsers(parser)
        if word not in subs:
            break
        parser, path = subs[word], [*path, word]
    return path, (parser if path else None)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _value(words: list[str], flag: str) -> str | None:
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


COMMANDS = _commands()


def test_the_pages_show_commands() -> None:
    # the extraction itself: a change of format that hid every command would pass the rest
    blocks = [c for c in COMMANDS if c[2]]
    assert len(blocks) >= 25 and len(COMMANDS) >= 60
    assert ("README.md", "headway simulate --policies fcfs,shortest-prompt", True, True) in COMMANDS


@pytest.mark.parametrize(("page", "command", "in_block", "plugins"), COMMANDS, ids=lambda v: str(v)[:70])
def test_a_documented_command_names_existing_subcommands_and_flags(
    page: str, command: str, in_block: bool, plugins: bool
) -> None:
    words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))[1:]
    path, parser = _resolve(words)
    if parser is None:
        # a code block's line is a command to run; a span in the prose may quote a log line
        # ("`headway gateway listening on URL`")
        assert not in_block, f"{page}: `{command}`: no such headway command"
        return
    if _subparsers(parser) and words[len(path) :][:1] and not words[len(path)].startswith("-"):
        pytest.fail(f"{page}: `{command}`: no subcommand {words[len(path)]!r} of headway {' '.join(path)}")
    unknown = sorted(set(_FLAG.findall(command)) - _options(parser))
    assert unknown == [], f"{page}: `{command}`: headway {' '.join(path)} has no {', '.join(unknown)}"


@pytest.mark.parametrize(("page", "command", "in_block", "plugins"), COMMANDS, ids=lambda v: str(v)[:70])
def test_a_documented_command_names_registered_policies_and_routers(
    page: str, command: str, in_block: bool, plugins: bool
) -> None:
    from headway.core import available_policies, available_routers

    words = command.split()
    policies = _value(words, "--policies") or _value(words, "--policy")
    if policies and not plugins and policies != "all" and re.fullmatch(r"[a-z0-9,-]+", policies):
        missing = sorted(set(policies.split(",")) - set(available_policies()))
        assert missing == [], f"{page}: `{command}`: no policy {', '.join(missing)}"
    router = _value(words, "--router")
    if router and re.fullmatch(r"[a-z0-9-]+", router):
        assert router in available_routers(), f"{page}: `{command}`: no router {router}"


def _table_names(page: str, heading: str) -> set[str]:
    """Every `name` in the first table under a heading of a page."""
    lines = (ROOT / page).read_text(encoding="utf-8").split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return set(re.findall(r"`([a-z0-9-]+)`", "\n".join(lines[start:end])))


def test_the_tables_of_built_in_names_list_every_one() -> None:
    # a policy, router or workload added to headway and not to the page that lists them all
    from headway.core import available_policies, available_routers, get_policy_class, get_router_class
    from headway.workload import available_workloads

    policies = {n for n in available_policies() if get_policy_class(n).__module__.startswith("headway.")}
    routers = {n for n in available_routers() if get_router_class(n).__module__.startswith("headway.")}
    assert policies - _table_names("docs/policies/index.md", "## The built-in policies") == set()
    assert routers - _table_names("docs/fleets.md", "## Fleets") == set()
    assert set(available_workloads()) - _table_names("docs/workloads.md", "## Built-in workloads") == set()


_ADDITIONAL_CONFIG = re.compile(r"--additional-config\s+'([^']*)'")
_PLUGIN_DOCS = [*PAGES, ROOT / "DEVELOPERS.md", ROOT / "src/headway/integrations/vllm/__init__.py"]
PLUGIN_SETTINGS = [
    (str(page.relative_to(ROOT)), m)
    for page in _PLUGIN_DOCS
    for m in _ADDITIONAL_CONFIG.findall(page.read_text(encoding="utf-8"))
]


def test_the_pages_show_plugin_settings() -> None:
    assert len(PLUGIN_SETTINGS) >= 5 and {p for p, _ in PLUGIN_SETTINGS} >= {"README.md", "DEVELOPERS.md"}


@pytest.mark.parametrize(("page", "settings"), PLUGIN_SETTINGS, ids=lambda v: str(v)[:70])
def test_documented_plugin_settings_pass_plugin_check(page: str, settings: str) -> None:
    # a reader starts vLLM with these: settings the scheduler refuses stop the engine after the model
    # loaded (DEVELOPERS.md's sjf-oracle had no oracle setting). Checked as `headway plugin-check` does,
    # but for the scorer's loading (the predictor, not the settings)
    import dataclasses
    import json

    from headway.integrations.vllm import PluginConfig, PluginConfigError, check_settings

    try:
        cfg = PluginConfig.resolve(json.loads(settings))
        check_settings(dataclasses.replace(cfg, scorer=None, online_learning=False, online_state=None))
    except (PluginConfigError, ValueError) as exc:
        pytest.fail(f"{page}: --additional-config '{settings}': {exc}")
