"""The built-in default workload: synthetic, needs no data files, shaped like Azure conv.

All parameters below were computed once from the public Azure LLM inference trace
(Splitwise, 2023-11-16), ``AzureLLMInferenceTrace_conv.csv`` (19,366 requests, one hour),
and hard-coded; the trace itself is not needed at run time.

Output lengths
    A three-component lognormal mixture clipped to ``[1, 1000]`` (the trace's maximum is
    1000 tokens, a client cap; the workload records it as ``meta["output_length_cap"]``,
    so ``output_cv`` resampling stays within it too). The trace's outputs are bimodal: ~70% short answers
    around 100 tokens and a sharp mode at ~400-430 tokens with a tail to ~700, which a
    single lognormal cannot reproduce (it puts p90 at ~450 and p99 at ~540). Fitted by
    Nelder-Mead on log-quantiles p5..p99 plus the mean:

    ========  ======  ======  =======  ==============
    weight    mu      sigma   median   role
    ========  ======  ======  =======  ==============
    0.692     4.568   0.549   96       short answers
    0.243     6.012   0.037   408      the ~400 mode
    0.065     6.218   0.174   502      long tail
    ========  ======  ======  =======  ==============

    Trace: mean 211, p50 129, p90 424, p99 601 (CV 0.77). The mixture (analytic):
    mean 210, p50 133, p90 423, p99 601.

Prompt lengths
    The trace's prompts are multimodal too (peaks near 400, 1,050 and the 4,096-token
    context cap), so they are drawn by inverse-CDF from the trace's empirical quantiles
    (:data:`PROMPT_QUANTILES`, interpolated linearly in log tokens). Trace: mean 1,155,
    p10 207, p50 1,020, p90 2,734, p99 4,142 (CV 0.96). Prompt and output lengths are
    drawn independently (Spearman correlation in the trace: 0.07).

Arrivals
    Gamma renewal arrivals (``vllm bench serve --burstiness``) at :data:`DEFAULT_RATE`
    = 6 requests/s with :data:`DEFAULT_BURSTINESS` = 0.5 (inter-arrival CV 1.41; the
    trace's own inter-arrival CV is 1.09, i.e. burstiness 0.84). The first request
    arrives at t = 0 and the times are not rescaled (see :mod:`headway.workload._arrivals`),
    so the realised rate of 2,000 requests moves with the seed: 5.87-6.21 requests/s for
    seeds 0-4. A mean request is
    1,155 + 211 = 1,366 tokens; on the ``llama3-8b-a100`` preset (~0.103 ms of compute
    per token, 12.5 ms per step) the rate is chosen where scheduling matters: measured
    with the simulator on 2,000 requests, at 4-5 requests/s every request is admitted
    at once (``max_num_seqs`` and the KV cache never bind), so every policy gives the
    same latencies; at 6 requests/s bursts fill all 256 sequence slots and FCFS queues
    up to ~100 requests, so the order of the waiting queue decides who waits.

Tenants
    :data:`~headway.workload.DEFAULT_TENANT_MIX`: 20% premium, 50% standard, 30% batch,
    assigned independently of lengths.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from headway.workload._arrivals import ArrivalProcess, FloatArray, GammaArrivals, Seed, arrivals_meta, make_rng
from headway.workload._resample import OUTPUT_LENGTH_CAP_META
from headway.workload._spec import RequestSpec, Workload
from headway.workload._tenants import DEFAULT_TENANT_MIX, TenantMix, assign_tenants

__all__ = [
    "DEFAULT_BURSTINESS",
    "DEFAULT_NUM_REQUESTS",
    "DEFAULT_RATE",
    "OUTPUT_LENGTH_CAP",
    "OUTPUT_MIXTURE",
    "PROMPT_QUANTILES",
    "default_workload",
    "sample_output_lengths",
    "sample_prompt_lengths",
]

IntArray = npt.NDArray[np.int64]

DEFAULT_NUM_REQUESTS = 2000
DEFAULT_RATE = 6.0
"""Requests/s: a moderate load for Llama-3-8B on one A100 with Azure conv lengths."""
DEFAULT_BURSTINESS = 0.5
"""Gamma shape of the inter-arrival gaps (CV = 1/sqrt(0.5) = 1.41)."""

OUTPUT_LENGTH_CAP = 1000
"""Largest output length in Azure conv 2023 (a client-side cap); recorded as the workload's
``meta["output_length_cap"]``, which caps resampled lengths (``output_cv``)."""

OUTPUT_MIXTURE: tuple[tuple[float, float, float], ...] = (
    # (weight, mu, sigma) of log(tokens); fitted to Azure conv 2023 (see module doc)
    (0.692, 4.568, 0.549),
    (0.243, 6.012, 0.037),
    (0.065, 6.218, 0.174),
)

# Empirical quantiles of ContextTokens in AzureLLMInferenceTrace_conv.csv (19,366 rows),
# numpy.quantile (linear), rounded to whole tokens: (probability, tokens).
PROMPT_QUANTILES: tuple[tuple[float, int], ...] = (
    (0.0, 2), (0.01, 29), (0.02, 91), (0.05, 181), (0.1, 207), (0.15, 372), (0.2, 387),
    (0.25, 396), (0.3, 403), (0.35, 414), (0.4, 703), (0.45, 984), (0.5, 1020), (0.55, 1045),
    (0.6, 1071), (0.65, 1097), (0.7, 1130), (0.75, 1189), (0.8, 1315), (0.85, 1876),
    (0.9, 2734), (0.93, 4076), (0.95, 4083), (0.96, 4086), (0.97, 4090), (0.98, 4098),
    (0.99, 4142), (0.995, 4831), (0.999, 6179), (1.0, 14050),
)  # fmt: skip


def sample_output_lengths(n: int, seed: Seed = 0) -> IntArray:
    """``n`` output lengths from :data:`OUTPUT_MIXTURE`, rounded and clipped to ``[1, 1000]``."""
    rng = make_rng(seed)
    w = np.array([c[0] for c in OUTPUT_MIXTURE])
    mu = np.array([c[1] for c in OUTPUT_MIXTURE])
    sigma = np.array([c[2] for c in OUTPUT_MIXTURE])
    comp = rng.choice(len(OUTPUT_MIXTURE), size=n, p=w / w.sum())
    z = rng.standard_normal(n)
    x = np.rint(np.exp(mu[comp] + sigma[comp] * z))
    return np.clip(x, 1, OUTPUT_LENGTH_CAP).astype(np.int64)


def sample_prompt_lengths(n: int, seed: Seed = 0) -> IntArray:
    """``n`` prompt lengths by inverse CDF over :data:`PROMPT_QUANTILES` (log-linear)."""
    rng = make_rng(seed)
    probs = np.array([q[0] for q in PROMPT_QUANTILES])
    log_tokens = np.log(np.array([q[1] for q in PROMPT_QUANTILES], dtype=np.float64))
    x: FloatArray = np.exp(np.interp(rng.random(n), probs, log_tokens))
    return np.maximum(np.rint(x), 1).astype(np.int64)


def default_workload(
    num_requests: int = DEFAULT_NUM_REQUESTS,
    seed: int = 0,
    *,
    rate: float = DEFAULT_RATE,
    burstiness: float = DEFAULT_BURSTINESS,
    arrivals: ArrivalProcess | None = None,
    tenants: TenantMix | None = DEFAULT_TENANT_MIX,
    name: str = "default",
) -> Workload:
    """The built-in synthetic workload (Azure-conv-shaped lengths, bursty Gamma arrivals).

    ``arrivals`` replaces the Gamma(``rate``, ``burstiness``) process (for example
    :class:`~headway.workload.BurstArrivals`); ``tenants=None`` leaves every request on
    the ``"default"`` standard tenant. Arrivals, prompt lengths, output lengths and
    tenants draw from independent streams spawned from ``seed``, so changing the
    arrival process keeps the lengths. See the module documentation for the parameters
    and what they reproduce.
    """
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 0:
        raise ValueError(f"num_requests must be a non-negative integer, got {num_requests!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    process = arrivals if arrivals is not None else GammaArrivals(rate, burstiness)
    s_arrivals, s_prompt, s_output, s_tenants = np.random.SeedSequence(seed).spawn(4)
    times = process.sample(num_requests, s_arrivals)
    prompts = sample_prompt_lengths(num_requests, s_prompt)
    outputs = sample_output_lengths(num_requests, s_output)
    width = max(4, len(str(max(num_requests - 1, 0))))
    specs = [
        RequestSpec(
            request_id=f"{name}-{i:0{width}d}",
            arrival_time=float(t),
            num_prompt_tokens=int(p),
            num_output_tokens=int(o),
        )
        for i, (t, p, o) in enumerate(zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True))
    ]
    meta: dict[str, object] = {
        "source": "default",
        "seed": seed,
        **arrivals_meta(process),
        "lengths": "azure-conv-2023 (synthetic)",
        OUTPUT_LENGTH_CAP_META: OUTPUT_LENGTH_CAP,
    }
    workload = Workload.from_specs(name, specs, meta)
    if tenants is not None:
        workload = assign_tenants(workload, tenants, s_tenants)
    return workload
