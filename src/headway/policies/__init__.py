"""Built-in policies. Each module registers its policy with ``@register_policy``."""

from headway.policies import (  # noqa: F401
    bands,
    driftsched,
    fcfs,
    ltr,
    pars,
    priority,
    rank_boost,
    sarathi,
    sjf_oracle,
    sjf_score,
    srpt_oracle,
    trail,
    uniboost,
)
from headway.policies._base import ScoredPolicy, noisy_oracle_defaults
from headway.policies._boost import GammaAda, b_gamma, b_gamma_from_log_mgf
from headway.policies._scoring import (
    NoisyOracleScorer,
    ScoreFn,
    batch_scorer,
    kendall_tau,
    noisy_oracle_scores,
)
from headway.policies.bands import BandsPolicy
from headway.policies.driftsched import (
    DEFAULT_BASE_TOKENS,
    DriftEstimator,
    TenantAgingPolicy,
    TenantFIFOPolicy,
    TenantPriorityPolicy,
    TenantSJFPolicy,
    TenantWeightedPolicy,
    classify_prompt,
)
from headway.policies.fcfs import FCFSPolicy
from headway.policies.ltr import LTRPolicy
from headway.policies.pars import PARSPolicy
from headway.policies.priority import PriorityPolicy
from headway.policies.rank_boost import RankBoostPolicy
from headway.policies.sarathi import SarathiPolicy
from headway.policies.sjf_oracle import SJFOraclePolicy
from headway.policies.sjf_score import SJFScorePolicy
from headway.policies.srpt_oracle import SRPTOraclePolicy
from headway.policies.trail import TrailOraclePolicy, TrailPolicy
from headway.policies.uniboost import (
    DistBoostPolicy,
    UniBoostBasePolicy,
    UniBoostMemGuardPolicy,
    UniBoostPolicy,
)

__all__ = [
    "DEFAULT_BASE_TOKENS",
    "BandsPolicy",
    "DistBoostPolicy",
    "DriftEstimator",
    "FCFSPolicy",
    "GammaAda",
    "LTRPolicy",
    "NoisyOracleScorer",
    "PARSPolicy",
    "PriorityPolicy",
    "RankBoostPolicy",
    "SJFOraclePolicy",
    "SJFScorePolicy",
    "SRPTOraclePolicy",
    "SarathiPolicy",
    "ScoreFn",
    "ScoredPolicy",
    "TenantAgingPolicy",
    "TenantFIFOPolicy",
    "TenantPriorityPolicy",
    "TenantSJFPolicy",
    "TenantWeightedPolicy",
    "TrailOraclePolicy",
    "TrailPolicy",
    "UniBoostBasePolicy",
    "UniBoostMemGuardPolicy",
    "UniBoostPolicy",
    "b_gamma",
    "b_gamma_from_log_mgf",
    "batch_scorer",
    "classify_prompt",
    "kendall_tau",
    "noisy_oracle_defaults",
    "noisy_oracle_scores",
]
