"""Core types: the request model, the policy interface and the policy-ordered queue."""

from headway.core._policy import (
    OracleAccessError,
    Policy,
    PolicyKey,
    UnknownPolicyError,
    available_policies,
    get_policy_class,
    make_policy,
    register_policy,
)
from headway.core._queue import PolicyQueue
from headway.core._registry import PLUGINS_ENV, PluginError
from headway.core._request import InvalidTransition, Request, RequestState, Tier
from headway.core._router import (
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
    "PLUGINS_ENV",
    "Estimator",
    "InvalidTransition",
    "LengthAwareRouter",
    "LoadTracker",
    "OracleAccessError",
    "PluginError",
    "Policy",
    "PolicyKey",
    "PolicyQueue",
    "Request",
    "RequestState",
    "Router",
    "Target",
    "TargetLoad",
    "Tier",
    "UnknownPolicyError",
    "UnknownRouterError",
    "available_policies",
    "available_routers",
    "default_estimate",
    "get_policy_class",
    "get_router_class",
    "make_policy",
    "make_router",
    "policy_estimator",
    "register_policy",
    "register_router",
]
