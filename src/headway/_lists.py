"""The listing commands: ``headway policies``, ``presets``, ``workloads`` and ``routers``.

Wired into ``headway.cli`` through :func:`add_list_parsers`.
"""

from __future__ import annotations

import argparse
import sys

from headway._help import plain_text

__all__ = ["add_list_parsers"]


def add_list_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("policies", help="list registered scheduling policies").set_defaults(func=_cmd_policies)
    sub.add_parser("presets", help="list cost-model presets").set_defaults(func=_cmd_presets)
    sub.add_parser("workloads", help="list built-in workloads").set_defaults(func=_cmd_workloads)
    sub.add_parser("routers", help="list fleet routers").set_defaults(func=_cmd_routers)


def _cmd_policies(args: argparse.Namespace) -> int:
    from headway.core import available_policies, get_policy_class

    for name in available_policies():
        cls = get_policy_class(name)
        doc = plain_text((cls.__doc__ or "").strip().splitlines()[0]) if cls.__doc__ else ""
        flags = ",".join(f for f, on in (("oracle", cls.oracle), ("preemptive", cls.preemptive)) if on)
        print(f"{name:22s} {('[' + flags + '] ') if flags else ''}{doc}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from headway.sim import PRESETS
    from headway.sim._calibrate import load_saved_presets

    saved, problems = load_saved_presets()  # a bad file is reported, the rest still listed
    for name, c in {**dict(sorted(PRESETS.items())), **saved}.items():
        try:
            blocks = c.num_gpu_blocks(0.9, 16)
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
            continue
        print(f"{name:20s} {c.describe()}; KV capacity {blocks * 16:,} tokens")
    for problem in problems:
        print(f"headway: warning: skipped {problem}", file=sys.stderr)
    return 0


def _cmd_routers(args: argparse.Namespace) -> int:
    from headway.routers import available_routers, get_router_class

    for name in available_routers():
        doc = (get_router_class(name).__doc__ or "").strip().splitlines()
        print(f"{name:20s} {plain_text(doc[0]) if doc else ''}")
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    from headway.workload import available_workloads, workload_description

    names = available_workloads()
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:{width}s} {workload_description(name)}")
    return 0
