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
from headway.core._request import InvalidTransition, Request, RequestState, Tier

__all__ = [
    "InvalidTransition",
    "OracleAccessError",
    "Policy",
    "PolicyKey",
    "PolicyQueue",
    "Request",
    "RequestState",
    "Tier",
    "UnknownPolicyError",
    "available_policies",
    "get_policy_class",
    "make_policy",
    "register_policy",
]
