"""headway: schedule LLM inference requests so short work is not stuck behind long work."""

from headway.core import (
    OracleAccessError,
    Policy,
    PolicyQueue,
    Request,
    RequestState,
    Tier,
    UnknownPolicyError,
    available_policies,
    make_policy,
    register_policy,
)

__version__ = "0.1.0"

__all__ = [
    "OracleAccessError",
    "Policy",
    "PolicyQueue",
    "Request",
    "RequestState",
    "Tier",
    "UnknownPolicyError",
    "__version__",
    "available_policies",
    "make_policy",
    "register_policy",
]
