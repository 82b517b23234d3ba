"""Routing: which replica (or gateway backend) a request goes to (see ``_base.py`` for the
contract: the load view, the estimates, the registry).

Each replica's policy decides *when* a request runs, a router decides *where*; the
simulator's fleets and the gateway's backends use the same routers.
"""

from headway.routers._base import (
    DEFAULT_ROUTER,
    LENGTH_CLASSES,
    Estimator,
    LoadTracker,
    Router,
    Target,
    TargetLoad,
    UnknownRouterError,
    available_routers,
    default_estimate,
    get_router_class,
    length_class,
    make_router,
    policy_estimator,
    register_router,
)
from headway.routers._builtin import (
    LeastOutstandingRouter,
    LeastTokensRouter,
    LengthAwareRouter,
    PowerOfTwoRouter,
    RandomRouter,
    RoundRobinRouter,
)
from headway.routers._prefix import CacheAwareRouter, PrefixAwareRouter

__all__ = [
    "DEFAULT_ROUTER",
    "LENGTH_CLASSES",
    "CacheAwareRouter",
    "Estimator",
    "LeastOutstandingRouter",
    "LeastTokensRouter",
    "LengthAwareRouter",
    "LoadTracker",
    "PowerOfTwoRouter",
    "PrefixAwareRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "Target",
    "TargetLoad",
    "UnknownRouterError",
    "available_routers",
    "default_estimate",
    "get_router_class",
    "length_class",
    "make_router",
    "policy_estimator",
    "register_router",
]
