"""What ``headway simulate`` says about a run beside its table: the notes on its scores, its router and
its policies' decisions, and where a user's policy raised."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = [
    "decided_alike",
    "default_scorers",
    "prefix_router_notes",
    "raised_outside_headway",
    "recompute_notes",
    "starvation_notes",
]


def default_scorers(
    names: Sequence[str],
    policy_args: dict[str, dict[str, Any]],
    workload: Any,
    args: argparse.Namespace,
    notes: list[str],
) -> None:
    """Give score-based policies a noisy-oracle scorer when nothing else provides scores (settings
    the user gave, such as --policy-arg NAME.tau=..., win)."""
    from headway.policies import noisy_oracle_defaults

    if all(spec.score is not None for spec in workload.requests):
        return
    for name in names:
        kwargs = noisy_oracle_defaults(name, policy_args.get(name), tau=args.scorer_tau, seed=args.seed)
        if kwargs is not None:
            policy_args[name] = kwargs
            notes.append(
                f"{name}: no scores in the workload, using a noisy-oracle length score with "
                f"Kendall tau {kwargs['tau']} (--scorer-tau; or --policy-arg {name}.scorer=...)"
            )


def prefix_router_notes(args: argparse.Namespace, workload: Any, notes: list[str]) -> None:
    """Say when a router that routes to cached prefixes has none to find: the workload's requests
    carry no block hashes, or the replicas' prefix cache is off (it then routes as its load rule)."""
    from headway.routers import get_router_class

    if not get_router_class(args.router).uses_block_hashes:
        return
    if not any(spec.block_hashes for spec in workload.requests):
        notes.append(
            f"router {args.router}: no request of workload {workload.name} carries prefix block hashes, so it "
            "routes by load alone (shared prefixes: --system-prompts K, sharegpt-sessions, a Mooncake trace)"
        )
    elif not args.enable_prefix_caching:
        notes.append(
            f"router {args.router} routes requests to the replica caching their prefix, and "
            "--no-enable-prefix-caching turns the replicas' prefix cache off"
        )


def raised_outside_headway(exc: BaseException) -> str | None:
    """Where ``exc`` was raised (``at FILE:LINE, in FUNCTION``) when its innermost frame outside
    Python's and the installed libraries' files is not headway's (a policy of the user's, from
    ``HEADWAY_PLUGINS``), else None: headway's own errors keep their traceback."""
    import sys
    import traceback
    from pathlib import Path

    package = Path(__file__).resolve().parents[1]
    libraries = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(package):
            return None
        if any(path.is_relative_to(lib) for lib in libraries):
            continue
        return f"at {frame.filename}:{frame.lineno}, in {frame.name}"
    return None


def decided_alike(runs: dict[str, Any]) -> list[str]:
    """The policies run, when there are several, each finished every request, and each gave every
    request the same first-token and finish times (to a microsecond: engines that cut decode
    stretches at other steps sum the same step times in another order); else nothing. (Runs that
    aborted or rejected requests are not said to be alike: their clients, not the load, decided.)"""
    from headway.core import RequestState

    done = RequestState.FINISHED
    if len(runs) < 2 or any(r.state is not done for _, requests in runs.values() for r in requests):
        return []

    def times(requests: Sequence[Any]) -> list[tuple[str, float, float]]:
        return sorted(
            (r.request_id, round(r.first_token_time or -1.0, 6), round(r.finish_time or -1.0, 6)) for r in requests
        )

    first, *rest = (times(requests) for _, requests in runs.values())
    return list(runs) if all(t == first for t in rest) else []


def starvation_notes(runs: dict[str, Any], policy_args: dict[str, dict[str, Any]]) -> list[str]:
    """Say when a policy's starvation guard, not its ranking, ordered much of a run: a policy with a
    ``starvation_threshold`` (PARS's: seconds since arrival, after which a waiting request is promoted
    ahead of every ranked one) that a tenth or more of the run's requests waited out before they were
    first scheduled. Under such a load (Azure conv's on one A100, for one) the policy runs mostly as its
    guard orders (PARS: arrival order), and its table row is read with that in mind."""
    import inspect

    from headway.core import UnknownPolicyError, get_policy_class

    out = []
    for name, (_, requests) in runs.items():
        try:
            param = inspect.signature(get_policy_class(name)).parameters.get("starvation_threshold")
        except (UnknownPolicyError, TypeError, ValueError):  # (a user's class without a readable signature)
            continue
        if param is None:
            continue
        limit = (policy_args.get(name) or {}).get("starvation_threshold", param.default)
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            continue
        # the policy's own test (PARS's key: promoted once now >= arrival + threshold)
        waited = sum(
            1
            for r in requests
            if r.first_scheduled_time is not None and r.first_scheduled_time >= r.arrival_time + limit
        )
        if requests and waited * 10 >= len(requests):
            out.append(
                f"{name}: {waited:,} of {len(requests):,} requests ({waited / len(requests):.0%}) waited out its "
                f"starvation threshold ({limit:g} s) before they were first scheduled, each then promoted ahead of "
                f"the ranked requests: at this load its guard, not its ranking, ordered them (a lower --rate, or "
                f"--policy-arg {name}.starvation_threshold=SECONDS)"
            )
    return out


def recompute_notes(runs: dict[str, Any], policy_args: dict[str, dict[str, Any]]) -> list[str]:
    """Say when a run recomputed at least as many tokens as its requests needed: preempted by
    recompute, each eviction lost the victim's work, and the run spent more on that than on the
    work itself (LTR's starvation rotation under KV pressure on the Azure conv trace: 1.9x). The
    table's preemption count alone does not say what they cost."""
    from headway.core import UnknownPolicyError, get_policy_class

    out = []
    for name, (_, requests) in runs.items():
        again = sum(r.num_recomputed_tokens for r in requests)
        need = sum(r.num_prompt_tokens + r.num_output_tokens for r in requests)
        if not again or again < need:
            continue
        try:
            cls = get_policy_class(name)
        except UnknownPolicyError:
            cls = None
        ways = "--preemption-mode swap keeps a victim's work"
        if cls is not None and cls.preemptive:
            mode = (policy_args.get(name) or {}).get("displacement", cls.displacement)
            if mode != "none":
                ways += (
                    f"; --policy-arg {name}.displacement=none evicts only for a running request's KV blocks, "
                    "vLLM's rule"
                )
        out.append(
            f"{name}: {again:,} tokens recomputed after preemptions, {again / need:.1f}x the {need:,} its requests "
            f"computed once: each eviction lost the victim's work, and at this load that cost more than the work "
            f"itself ({ways})"
        )
    return out
