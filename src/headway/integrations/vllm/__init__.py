"""headway policies inside vLLM: a drop-in scheduler class for vLLM 0.32's V1 engine.

Start vLLM with the scheduler class and a ``headway`` section in vLLM's own
``--additional-config`` engine argument (headway must be importable by the server, e.g.
``PYTHONPATH=/path/to/headway/src`` or ``pip install --no-deps -e /path/to/headway``)::

    python -m vllm.entrypoints.openai.api_server --model M \\
        --scheduler-cls headway.integrations.vllm.HeadwayScheduler \\
        --additional-config '{"headway": {"policy": "pars", "policy_args": {"starvation_threshold": 60}}}'

**What it replaces.** :class:`HeadwayScheduler` subclasses vLLM's ``Scheduler`` and keeps
its whole ``schedule()``: token budget, chunked prefill, KV allocation, prefix caching and
memory-pressure preemption are vLLM's, and so is every decision but two:

1. the waiting queues (``waiting`` and ``kv_holding_waiting``) are
   :class:`HeadwayRequestQueue` objects ordered by the policy's key (then arrival
   sequence), instead of FCFS/priority queues;
2. when a running request cannot get KV blocks, the request vLLM preempts is the policy's
   :meth:`~headway.core.Policy.choose_victim` (default: the largest key): before a step in
   which the KV cache could run out, each running request's vLLM ``priority`` is set to its
   eviction rank for the step, and vLLM's own priority-preemption path evicts the highest.
   The running list keeps vLLM's order (who gets the step's budget first).

With ``fcfs`` (and with ``priority``) the plugin makes vLLM's own decisions (FCFS / priority
scheduling), step for step: ``tests/integrations/test_step_diff.py`` compares every step
with vLLM's ``Scheduler`` and ``AsyncScheduler`` on generated request streams. A policy only
reorders: ``sjf-oracle`` decides as vLLM's priority scheduling with each request's output
length as its priority.

**Displacement** (a better-keyed waiting request taking a running one's place) happens only in
a preemptive policy's declared ``displacement`` mode. ``none`` (the default; vLLM's rule): never,
a full batch makes the head wait. ``evict`` (SGLang's retract): before a step, a waiting head
that has a sequence slot but not enough free KV blocks evicts the worst-keyed running request
that ``can_preempt`` allows and whose key is larger than the head's (preempted by recompute, its
blocks freed into vLLM's prefix cache). ``pause`` (vllm-ltr's: the displaced request keeps its
KV) cannot be held by vLLM's model runner, which keeps at most ``max_num_seqs`` requests: the
plugin runs such a policy without displacement and logs it. vLLM never preempts for a slot or
for the token budget, and neither does the plugin.

The policy is fed through the :class:`~headway.core.Policy` contract: ``on_arrival`` for
the requests added since the previous step as ``schedule()`` starts (scored in one batch first;
one aborted before then is never announced),
``key`` when a request enters a queue (arrival, preemption), when a ``rekey_at_time``
timer fires or ``key_epoch`` changes, and for running requests when a decision needs
it (eviction order, displacement); ``on_progress`` once per step per scheduled request
with the step's tokens, a request that finishes in the step included (before its
``on_finish``; only for policies that override it; for the others the
request's counters are synced lazily, before its key is read), ``on_finish`` with the
observed output length (aborted requests get no ``on_finish``).

Cost: O(log n) per queue operation; per step O(requests admitted) plus, for policies
with an ``on_progress`` hook, O(scheduled requests), and for preemptive ones a scan of
the running requests when the queue head, the running set or the key epoch changed, or a
running request may have reached its next rekey point (the scan records the fewest output
tokens any of them is from it; every step for policies whose ``can_preempt`` may change
between hints). Each running request's key (and ``can_preempt`` where it changes at hints
alone) is cached until its next rekey point, so a scan costs a dict lookup per running
request.
``benchmarks/bench_plugin_overhead.py`` measures it with 1,000 requests waiting.

**One class, sync or async.** vLLM builds a ``--scheduler-cls`` as named, whether or not its
engine core runs async scheduling (the default on GPUs). :class:`HeadwayScheduler` picks its
base when vLLM builds it: vLLM's ``AsyncScheduler`` when ``async_scheduling`` is on (the
instance is a ``HeadwayAsyncScheduler``), its ``Scheduler`` when off, so one name works on
every engine. ``HeadwayAsyncScheduler`` may be named directly; with async scheduling off it
refuses to start. Under async scheduling the step log's per-step times are approximate, since
a step's output is processed after the next step is scheduled. vLLM's CPU platform turns async
scheduling off, so on CPU the async class is tested in-process only, driven like the engine
core's batch queue (``tests/integrations/test_step_diff.py``, step for step against vLLM's
``AsyncScheduler``), not behind a live server.

**Supported versions**: vLLM :data:`SUPPORTED_VLLM_VERSIONS` (``0.32.x``), checked when the
scheduler is built (``check_version``), and the scheduler interface it hooks is checked too.

**Why** ``--additional-config``: it is vLLM's documented engine argument for plugin
settings, so the settings travel with the engine configuration to the engine-core
process (where the scheduler runs), appear in vLLM's logged config, and need no file or
environment on the server host. ``HEADWAY_VLLM_CONFIG`` (a JSON object or the path of a
JSON file) is read when ``--additional-config`` has no ``headway`` section, for launchers
that cannot pass engine arguments. Both are read when the scheduler is constructed, which vLLM
does after loading the model; ``headway plugin-check`` (:func:`check_settings`) checks them
without vLLM beforehand.

Settings (keys of the ``headway`` object):

``policy`` (``"fcfs"``), ``policy_args`` (``{}``)
    Any registered headway policy and its keyword settings (``headway policies``).
``oracle`` (``"none"``)
    ``"max_tokens"`` binds oracle policies (``sjf-oracle``, ``srpt-oracle``...) to the
    request's ``max_tokens`` (capped by ``max_model_len``) as its true output length.
    **Benchmark-only**: that is the true length only when the client sets
    ``ignore_eos``. Oracle policies refuse to start without it.
``scorer`` (``null``)
    Scores for score-ranked policies (``pars``, ``sjf-score``...). A request's
    ``vllm_xargs: {"headway_score": x}`` wins (where ``request_hints`` lets requests send
    one); requests without one are scored
    in-process at arrival, batched per engine step, by this scorer: ``"default"`` (the
    predictor ``headway predictor train`` wrote to the cache, else the one shipped in the
    package; never trained here), a predictor checkpoint directory,
    each optionally with ``":BACKEND"`` (as the gateway's ``--scorer``; it overrides
    ``scorer_backend``), or ``"module:attr"`` / ``"module:factory()"`` naming a callable
    ``list[str] -> scores`` or an object with ``score(prompts)``. Prompts are detokenized with the
    model's tokenizer (``tokenizer`` overrides its path); the scorer reads each prompt's first
    ``SCORED_CHARS`` (16,384) characters, and only a bounded window of a long prompt's token ids is
    decoded, so a huge prompt costs about what a short one does. Cost per request: the
    detokenization plus the predictor's forward pass, where ``scoring`` says
    (see ``benchmarks/bench_plugin_overhead.py``).
``scorer_backend`` (``"torch"``), ``scorer_threads`` (``1``)
    Backend (``torch``, ``onnx`` or ``onnx-int8``) and threads for a predictor checkpoint.
``scoring`` (``"background"``)
    Where the ``scorer`` runs: ``"background"``, on a thread of its own, one batch of up to 32
    prompts at a time; a new request waits outside the queue vLLM schedules from until its score
    is in (the queue's length counts it, so the engine keeps stepping) and the running requests'
    steps go on meanwhile. ``"inline"``: on the engine's thread as each step starts, every request
    that arrived before the step scored in it (the step waits for the whole batch; deterministic,
    as the differential tests need).
``missing_score`` (``null``)
    Score given to a request that has none when the policy needs one (no ``headway_score`` and
    no scorer, or a scorer that failed on its prompt: raised, or answered no number; a batch it
    failed on is retried one prompt at a time, so the prompts beside a bad one keep their scores); ``null``:
    the mean of the scores seen so far (0 before any), i.e. the middle of the queue. Logged once;
    an engine must not stop over one request's missing score.
``step_log`` (``null``)
    Path of a JSONL file: one header line with the engine's geometry, then one line per
    engine step with its composition (``num_tokens``, ``num_seqs``, ``num_kv_tokens``),
    its timestamps and the time spent in headway code. ``headway calibrate`` fits the
    simulator's cost model from it.
``control_file`` (``null``)
    Path of a JSON file with ``policy`` / ``policy_args`` / ``oracle`` / ``scorer`` /
    ``missing_score``; re-read when a request arrives at an empty engine and the file
    changed (so never in the middle of a run), so benchmarks can replay one workload
    under several policies on one warm server. Keys it omits keep their startup values
    (``policy_args``: none). A file that is not valid (other keys, bad values, a policy that
    cannot be made) is logged and ignored: the engine keeps its policy; so is one that group or
    others may write, or that a user other than the engine's (or root) owns (it switches the
    scorer, which imports a module or loads a checkpoint in the engine's process).
``request_hints`` (``["score", "tenant", "tier", "category"]``)
    The ``vllm_xargs`` a request's own word is taken for (``headway_score``, ...): every client
    of the vLLM server can send them, so where clients reach vLLM directly, list only what they may
    choose (``[]``: none).
``check_version`` (``true``)
    Refuse vLLM versions other than :data:`SUPPORTED_VLLM_VERSIONS`.
``online_learning`` (``false``)
    With ``scorer`` ``"default"`` (the shipped predictor): each finished request's prompt and
    output length are queued (never waited for) to a background thread that refits a ridge
    head on the predictor's features over the latest 500 (:class:`headway.predict.OnlineLearner`,
    keyed by the served model's name); the scorer ranks with that head once it has one (after
    25), with the predictor's scores until then. Off by default: not measured to rank better yet.
``online_state`` (``null``)
    With ``online_learning``: a file the learned windows are saved to within a second of each
    finished request (vLLM's default ``--shutdown-timeout 0`` ends the engine before the
    scheduler's shutdown) and resumed from at the next start, so a restarted engine keeps every
    model's head. A file of another predictor's features, or a folder that
    cannot be written, is refused at start (and by ``headway plugin-check``). With data
    parallelism each engine keeps its own: ``NAME.dpN.EXT`` for engine N > 0.

Per-request fields travel in ``vllm_xargs`` (vLLM's ``SamplingParams.extra_args``):
``headway_score``, ``headway_tenant``, ``headway_tier``, ``headway_category`` (and
``headway_request_id``, copied to the step log to match client records); vLLM's own
``priority`` field becomes :attr:`headway.core.Request.priority`. A ``headway_score`` that is
not a finite number is ignored and a ``headway_tier`` that is not a tier is ``standard`` (with
a warning, once): a request's own fields never stop the engine.

vLLM is imported only when :class:`HeadwayScheduler` is first accessed, so this package
(and :class:`PolicyAdapter`, which holds all the ordering logic and is tested without
vLLM) imports anywhere. Its modules: ``_settings`` (the settings, the control file,
``check_settings``), ``_scorers``, ``_adapter`` (:class:`PolicyAdapter`, engine-free),
``_queue`` (:class:`HeadwayRequestQueue`), ``_version`` (the supported versions and the
interface check), ``_steplog`` and ``_scheduler`` (the vLLM classes, the only module that
imports vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headway.integrations.vllm._adapter import EngineRequest, PolicyAdapter
from headway.integrations.vllm._errors import PluginConfigError, VllmVersionError
from headway.integrations.vllm._queue import HeadwayRequestQueue
from headway.integrations.vllm._scorers import load_text_scorer, word_count_scorer
from headway.integrations.vllm._settings import ENV_CONFIG, PluginConfig, check_settings
from headway.integrations.vllm._version import SUPPORTED_VLLM_VERSIONS, check_vllm_version

__all__ = [
    "ENV_CONFIG",
    "SUPPORTED_VLLM_VERSIONS",
    "EngineRequest",
    "HeadwayAsyncScheduler",
    "HeadwayRequestQueue",
    "HeadwayScheduler",
    "PluginConfig",
    "PluginConfigError",
    "PolicyAdapter",
    "VllmVersionError",
    "check_settings",
    "check_vllm_version",
    "load_text_scorer",
    "word_count_scorer",
]

if TYPE_CHECKING:  # built on first access by the module __getattr__ below (imports vLLM)
    HeadwayScheduler: type[Any]
    HeadwayAsyncScheduler: type[Any]

_CLASSES: dict[str, type[Any]] = {}


def __getattr__(name: str) -> Any:
    """``HeadwayScheduler`` / ``HeadwayAsyncScheduler`` are built (importing vLLM) on first access."""
    if name in ("HeadwayScheduler", "HeadwayAsyncScheduler"):
        if not _CLASSES:
            from headway.integrations.vllm._scheduler import build_scheduler_classes

            sync_cls, async_cls = build_scheduler_classes()
            _CLASSES.update(HeadwayScheduler=sync_cls, HeadwayAsyncScheduler=async_cls)
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
