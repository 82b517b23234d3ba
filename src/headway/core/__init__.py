"""Core types: the request model, the policy interface and the policy-ordered queue.

The routing names (:class:`~headway.routers.Router`, :func:`~headway.routers.make_router`...)
live in :mod:`headway.routers`; they stay importable from here too.
"""

from typing import TYPE_CHECKING, Any

from headway.core._policy import (
    DISPLACEMENT_MODES,
    PAPER_POLICIES,
    RUNNING_KEYS,
    STALL_EVICTIONS,
    OracleAccessError,
    Policy,
    PolicyHooks,
    PolicyKey,
    SharedStartTags,
    UnknownPolicyError,
    available_policies,
    get_policy_class,
    make_policy,
    register_policy,
    set_displacement,
)
from headway.core._queue import PolicyQueue, check_key
from headway.core._registry import PLUGINS_ENV, PluginError
from headway.core._request import InvalidTransition, Request, RequestState, Tier

if TYPE_CHECKING:  # the routing names, for type checkers (at run time: __getattr__ below)
    from headway.routers import (
        DEFAULT_ROUTER,
        Estimator,
        LengthAwareRouter,
        LoadTracker,
        Router,
        Target,
        TargetLoad,
        UnknownRouterError,
        available_routers,
        default_estimate,
        get_router_class,
        make_router,
        policy_estimator,
        register_router,
    )

__all__ = [
    "DEFAULT_ROUTER",
    "DISPLACEMENT_MODES",
    "PAPER_POLICIES",
    "PLUGINS_ENV",
    "RUNNING_KEYS",
    "STALL_EVICTIONS",
    "Estimator",
    "InvalidTransition",
    "LengthAwareRouter",
    "LoadTracker",
    "OracleAccessError",
    "PluginError",
    "Policy",
    "PolicyHooks",
    "PolicyKey",
    "PolicyQueue",
    "Request",
    "RequestState",
    "Router",
    "SharedStartTags",
    "Target",
    "TargetLoad",
    "Tier",
    "UnknownPolicyError",
    "UnknownRouterError",
    "available_policies",
    "available_routers",
    "check_key",
    "default_estimate",
    "get_policy_class",
    "get_router_class",
    "make_policy",
    "make_router",
    "policy_estimator",
    "register_policy",
    "register_router",
    "set_displacement",
]

_ROUTING = frozenset(
    {
        "DEFAULT_ROUTER",
        "Estimator",
        "LengthAwareRouter",
        "LoadTracker",
        "Router",
        "Target",
        "TargetLoad",
        "UnknownRouterError",
        "available_routers",
        "default_estimate",
        "get_router_class",
        "make_router",
        "policy_estimator",
        "register_router",
    }
)


def __getattr__(name: str) -> Any:
    """The routing names, from :mod:`headway.routers` (imported on first use: routers build on core)."""
    if name in _ROUTING:
        import headway.routers

        return getattr(headway.routers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
