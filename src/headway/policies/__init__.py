"""Built-in policies. Each module registers its policy with ``@register_policy``."""

from headway.policies import fcfs, priority, sjf_oracle, srpt_oracle  # noqa: F401
from headway.policies.fcfs import FCFSPolicy
from headway.policies.priority import PriorityPolicy
from headway.policies.sjf_oracle import SJFOraclePolicy
from headway.policies.srpt_oracle import SRPTOraclePolicy

__all__ = ["FCFSPolicy", "PriorityPolicy", "SJFOraclePolicy", "SRPTOraclePolicy"]
