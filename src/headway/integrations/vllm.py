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

The policy is fed through the :class:`~headway.core.Policy` contract: ``on_arrival`` when
a request is added (arrivals since the previous step are scored in one batch first),
``key`` when a request enters a queue (arrival, preemption), when a ``rekey_at_time``
timer fires or ``key_epoch`` changes, and for running requests when a decision needs
it (eviction order, displacement); ``on_progress`` once per step per scheduled request
with the step's tokens (only for policies that override it; for the others the
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

``HeadwayAsyncScheduler`` is the same on top of vLLM's ``AsyncScheduler`` (GPU engines
with async scheduling); its step log's per-step times are approximate there, since a
step's output is processed after the next step is scheduled. vLLM's CPU platform turns
async scheduling off, so on CPU it is tested in-process only (driven like the engine core's
batch queue, ``tests/integrations/_async_harness.py``), not behind a live server.

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
    ``vllm_xargs: {"headway_score": x}`` always wins; requests without one are scored
    in-process at arrival, batched per engine step, by this scorer: ``"default"`` (the
    trained headway predictor, never trained here), a predictor checkpoint directory,
    each optionally with ``":BACKEND"`` (as the gateway's ``--scorer``; it overrides
    ``scorer_backend``), or ``"module:attr"`` / ``"module:factory()"`` naming a callable
    ``list[str] -> scores`` or an object with ``score(prompts)``. Prompts are detokenized with the
    model's tokenizer (``tokenizer`` overrides its path). Cost per request: the
    detokenization plus the predictor's forward pass, on the engine thread
    (see ``benchmarks/bench_plugin_overhead.py``).
``scorer_backend`` (``"torch"``), ``scorer_threads`` (``1``)
    Backend (``torch``, ``onnx`` or ``onnx-int8``) and threads for a predictor checkpoint.
``missing_score`` (``null``)
    Score given to a request that has none when the policy needs one; ``null``: the mean
    of the scores seen so far (0 before any), i.e. the middle of the queue. Logged once;
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
    cannot be made) is logged and ignored: the engine keeps its policy.
``check_version`` (``true``)
    Refuse vLLM versions other than :data:`SUPPORTED_VLLM_VERSIONS`.

Per-request fields travel in ``vllm_xargs`` (vLLM's ``SamplingParams.extra_args``):
``headway_score``, ``headway_tenant``, ``headway_tier``, ``headway_category`` (and
``headway_request_id``, copied to the step log to match client records); vLLM's own
``priority`` field becomes :attr:`headway.core.Request.priority`. A ``headway_score`` that is
not a finite number is ignored and a ``headway_tier`` that is not a tier is ``standard`` (with
a warning, once): a request's own fields never stop the engine.

vLLM is imported only when :class:`HeadwayScheduler` is first accessed, so this module
(and :class:`PolicyAdapter`, which holds all the ordering logic and is tested without
vLLM) imports anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from headway.core import Policy, PolicyKey, PolicyQueue, Request, RequestState, Tier, make_policy
from headway.policies import ScoredPolicy
from headway.predict._resolve import predictor_spec, resolve_score_fn

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

logger = logging.getLogger("headway.integrations.vllm")

SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32",)
"""``major.minor`` releases of vLLM whose V1 scheduler this plugin was written against."""


class _ToVllmLog(logging.Handler):
    """Hands records to vLLM's ``vllm`` logger, whose handlers (configured by vLLM, possibly later
    than this is attached) print them as vLLM's own lines."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("vllm").handle(record)


def _log_like_vllm() -> None:
    """Send this module's log lines (INFO and up) through vLLM's logging, as its own loggers' are:
    without a handler of its own, Python printed only warnings and errors, so the log never said
    which policy runs or that a control file switched it."""
    if any(isinstance(h, _ToVllmLog) for h in logger.handlers):
        return
    logger.addHandler(_ToVllmLog())
    logger.setLevel(logging.INFO)
    logger.propagate = False


_CONTROL_KEYS = ("missing_score", "oracle", "policy", "policy_args", "scorer")
"""Settings a ``control_file`` may switch while the engine runs."""
ENV_CONFIG = "HEADWAY_VLLM_CONFIG"
"""Environment variable read when ``--additional-config`` has no ``headway`` section."""

_SCHEDULER_HOOKS = ("schedule", "update_from_output", "add_request", "_preempt_request", "_free_request")
_QUEUE_METHODS = (
    "add_request", "pop_request", "peek_request", "prepend_request", "prepend_requests",
    "remove_request", "remove_requests",
)  # fmt: skip
_ABORT_STATUSES = frozenset({"FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_IGNORED"})


class PluginConfigError(ValueError):
    """The plugin's settings are invalid."""


class VllmVersionError(RuntimeError):
    """The installed vLLM is not one whose scheduler interface this plugin supports."""


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class PluginConfig:
    """The plugin's settings (see the module docstring for each key)."""

    policy: str = "fcfs"
    policy_args: dict[str, Any] = field(default_factory=dict)
    oracle: str = "none"
    scorer: str | None = None
    scorer_backend: str = "torch"
    scorer_threads: int = 1
    tokenizer: str | None = None
    missing_score: float | None = None
    step_log: str | None = None
    control_file: str | None = None
    check_version: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or not self.policy:
            raise PluginConfigError(f"headway plugin: policy must be a policy name, got {self.policy!r}")
        if not isinstance(self.policy_args, dict):
            raise PluginConfigError(f"headway plugin: policy_args must be a JSON object, got {self.policy_args!r}")
        if self.oracle not in ("none", "max_tokens"):
            raise PluginConfigError(f"headway plugin: oracle must be 'none' or 'max_tokens', got {self.oracle!r}")
        from headway.predict.score import BACKENDS

        if self.scorer_backend not in BACKENDS:
            raise PluginConfigError(
                f"headway plugin: scorer_backend must be one of {', '.join(BACKENDS)}, got {self.scorer_backend!r}"
            )
        threads = self.scorer_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise PluginConfigError(f"headway plugin: scorer_threads must be an integer >= 1, got {threads!r}")
        for name in ("scorer", "tokenizer", "step_log", "control_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise PluginConfigError(f"headway plugin: {name} must be a non-empty string or null, got {value!r}")
        if not isinstance(self.check_version, bool):
            raise PluginConfigError(f"headway plugin: check_version must be true or false, got {self.check_version!r}")
        if self.missing_score is not None and not (
            isinstance(self.missing_score, (int, float))
            and not isinstance(self.missing_score, bool)
            and math.isfinite(self.missing_score)
        ):
            raise PluginConfigError(
                f"headway plugin: missing_score must be a finite number or null, got {self.missing_score!r}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PluginConfig:
        """Build from a JSON object; unknown keys are an error naming the valid ones."""
        if not isinstance(data, Mapping):
            raise PluginConfigError(f"headway plugin settings must be a JSON object, got {data!r}")
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise PluginConfigError(
                f"headway plugin: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}"
            )
        try:
            return cls(**dict(data))
        except TypeError as exc:  # pragma: no cover - guarded by the key check
            raise PluginConfigError(f"headway plugin: {exc}") from None

    @classmethod
    def resolve(cls, additional_config: Any = None, environ: Mapping[str, str] | None = None) -> PluginConfig:
        """Settings from vLLM's ``additional_config["headway"]``, else ``$HEADWAY_VLLM_CONFIG``
        (JSON text, or the path of a JSON file), else the defaults (FCFS)."""
        if isinstance(additional_config, Mapping) and "headway" in additional_config:
            return cls.from_mapping(additional_config["headway"])
        env = os.environ if environ is None else environ
        raw = env.get(ENV_CONFIG, "").strip()
        if not raw:
            return cls()
        if not raw.startswith("{"):
            try:
                raw = Path(raw).expanduser().read_text()
            except OSError as exc:
                raise PluginConfigError(f"${ENV_CONFIG}: cannot read {raw!r} ({exc})") from None
        return cls.from_mapping(_json_of(raw, f"${ENV_CONFIG}"))

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _json_of(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PluginConfigError(f"{where}: not valid JSON ({exc})") from None


# ------------------------------------------------------------------ scorers
TextScoreFn = Callable[[list[str]], Any]
"""Scores a batch of prompt texts: one float per prompt (a sequence or an array)."""


def word_count_scorer(prompts: Sequence[str]) -> list[float]:
    """A toy text scorer: ``log(1 + words)``. For tests and demos, not a predictor."""
    return [math.log1p(len(p.split())) for p in prompts]


def load_text_scorer(spec: str, *, backend: str = "torch", threads: int = 1) -> TextScoreFn:
    """Resolve the ``scorer`` setting to a batch function ``list[str] -> scores``; a
    predictor spec's own backend (``"DIR:onnx-int8"``) wins over ``backend``."""
    predictor = predictor_spec(spec)
    if predictor is not None:
        from headway.predict.score import Scorer, ensure_predictor, scoring_backend

        checkpoint, given = predictor
        try:
            kind = scoring_backend(given or backend)
        except ValueError as exc:
            raise PluginConfigError(f"headway plugin: scorer {spec!r}: {exc}") from None
        path = ensure_predictor(checkpoint, train_if_missing=False, log=None)
        scorer = Scorer.from_checkpoint(path, kind, threads=threads)
        return scorer.score
    try:
        return resolve_score_fn(spec)
    except ValueError as exc:
        raise PluginConfigError(
            f"headway plugin: {exc} (the scorer setting is 'default', a predictor directory, "
            "'module:attr' or 'module:factory()')"
        ) from None


# ------------------------------------------------------------ checks
def make_plugin_policy(name: str, args: Mapping[str, Any]) -> Policy:
    """The ``policy`` setting's policy with its ``policy_args``; a bad name or argument is a
    :class:`PluginConfigError` naming it."""
    try:
        return make_policy(name, **dict(args))
    except (ValueError, TypeError) as exc:
        raise PluginConfigError(f"headway plugin: {exc}") from None


def _check_oracle(policy: Policy, oracle: str) -> None:
    if policy.oracle and oracle != "max_tokens":
        raise PluginConfigError(
            f"policy {policy.name!r} is an oracle (it reads true output lengths); set "
            "oracle='max_tokens' to use each request's max_tokens as its true length "
            "(benchmark-only: true only when clients set ignore_eos)"
        )


def _check_chunked_prefill(policy: Policy, enabled: bool) -> None:
    if policy.requires_chunked_prefill and not enabled:
        raise PluginConfigError(f"headway plugin: policy {policy.name!r} needs chunked prefill, which is off")


def check_settings(cfg: PluginConfig, *, chunked_prefill: bool | None = None) -> list[str]:
    """Check ``cfg`` as the scheduler would at startup, without vLLM or a model: make the
    policy (name, arguments, the oracle setting, chunked prefill when ``chunked_prefill`` is
    known), load the scorer and score one prompt, and check that the step log can be written
    and that an existing control file is valid. Raises :class:`PluginConfigError` naming the
    first problem; returns what was checked, one line each (``headway plugin-check``).

    vLLM builds the scheduler only after loading the model, so a bad setting surfaces there
    minutes into a launch; this runs in a second beforehand."""
    done: list[str] = []
    policy = make_plugin_policy(cfg.policy, cfg.policy_args)
    _check_oracle(policy, cfg.oracle)
    args = json.dumps(cfg.policy_args) if cfg.policy_args else "default settings"
    done.append(f"policy {policy.name!r} ({args}); oracle={cfg.oracle}")
    if chunked_prefill is not None:
        _check_chunked_prefill(policy, chunked_prefill)
        done.append(f"chunked prefill {'on' if chunked_prefill else 'off'}: fits the policy")
    if cfg.scorer is not None:
        t0 = time.perf_counter()
        fn = load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
        try:
            scores = [float(x) for x in fn(["How do I check the settings before a launch?"])]
        except Exception as exc:  # a user's scorer may raise anything: report it as the settings' error
            raise PluginConfigError(f"headway plugin: scorer {cfg.scorer!r} failed on a test prompt: {exc}") from exc
        if len(scores) != 1 or not math.isfinite(scores[0]):
            raise PluginConfigError(
                f"headway plugin: scorer {cfg.scorer!r} returned {scores!r:.80} for one prompt (want one finite score)"
            )
        done.append(f"scorer {cfg.scorer!r}: loaded and scored a test prompt in {time.perf_counter() - t0:.1f} s")
    elif isinstance(policy, ScoredPolicy) and policy.scorer is None:
        done.append(
            f"note: policy {policy.name!r} ranks by scores and no scorer is set: requests need vllm_xargs "
            "headway_score; those without one get missing_score (default: the mean of the scores so far, 0 "
            "before any)"
        )
    if cfg.step_log is not None:
        path = Path(cfg.step_log).expanduser().absolute()
        existing = next(p for p in path.parents if p.exists())  # the scheduler creates the missing ones
        if path.is_dir() or not existing.is_dir() or not os.access(existing, os.W_OK):
            raise PluginConfigError(f"headway plugin: step_log {cfg.step_log!r}: cannot be written")
        done.append(f"step_log {cfg.step_log!r}: writable")
    if cfg.control_file is not None:
        done.append(_check_control_file(cfg, cfg.control_file))
    return done


def _check_control_file(cfg: PluginConfig, path: str) -> str:
    try:
        text = Path(path).expanduser().read_text()
    except FileNotFoundError:
        return f"control_file {path!r}: not there yet (read when it appears)"
    except OSError as exc:
        raise PluginConfigError(f"headway plugin: control_file {path!r}: {exc}") from None
    switched = control_settings(cfg, _json_of(text, f"headway plugin: control_file {path!r}"))
    policy = make_plugin_policy(switched.policy, switched.policy_args)
    _check_oracle(policy, switched.oracle)
    return f"control_file {path!r}: valid (policy {policy.name!r})"


def control_settings(cfg: PluginConfig, data: Any, current: Mapping[str, Any] | None = None) -> PluginConfig:
    """``cfg`` with a control file's settings applied (keys it omits keep ``current``'s values,
    else ``cfg``'s; ``policy_args``: none); checked like the startup settings."""
    if not isinstance(data, dict):
        raise PluginConfigError(f"expected a JSON object, got {data!r:.80}")
    unknown = sorted(set(data) - set(_CONTROL_KEYS))
    if unknown:
        raise PluginConfigError(f"unknown key(s) {', '.join(unknown)}; valid: {', '.join(_CONTROL_KEYS)}")
    base = {"policy": cfg.policy, "oracle": cfg.oracle, **(current or {}), "policy_args": {}}
    return dataclasses.replace(cfg, **{**base, **data})


# ------------------------------------------------------------ the adapter
class EngineRequest(Protocol):
    """What the adapter reads from an engine's request (vLLM's ``vllm.v1.request.Request``)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    priority: int
    num_computed_tokens: int

    @property
    def num_output_tokens(self) -> int: ...


def _xargs(engine_req: Any) -> Mapping[str, Any]:
    params = getattr(engine_req, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    return extra if isinstance(extra, Mapping) else {}


class PolicyAdapter:
    """Drives a headway :class:`~headway.core.Policy` for an engine's request objects.

    Engine-agnostic (no vLLM import): it keeps a headway :class:`~headway.core.Request`
    per engine request, makes :class:`HeadwayRequestQueue` objects, and turns engine
    events (enqueue, admit, progress, preempt, finish) into policy calls. Times given to
    the policy are seconds since the adapter was made (``clock() - epoch``); engine
    arrival times on the same clock (vLLM: ``time.time()``) are shifted alike.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        oracle: str = "none",
        max_model_len: int | None = None,
        score_batch: TextScoreFn | None = None,
        decode: Callable[[list[Any]], list[str]] | None = None,
        missing_score: float | None = None,
        clock: Callable[[], float] = time.time,
        epoch: float | None = None,
    ) -> None:
        self._clock = clock
        self.epoch = clock() if epoch is None else epoch
        self.max_model_len = max_model_len
        self.score_batch = score_batch
        self.decode = decode
        self.missing_score = missing_score
        self.oracle_mode = oracle
        self.reqs: dict[str, Request] = {}
        self.engine: dict[Request, Any] = {}
        self.queues: list[HeadwayRequestQueue] = []
        self._pending: dict[Request, HeadwayRequestQueue] = {}
        self._popped: list[Request] = []
        self._timers: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        self._warned: set[str] = set()
        # statistics
        self.policy_time = 0.0
        """Seconds spent in headway code (policy calls, queue operations), cumulative."""
        self.score_time = 0.0
        self.num_scored = 0
        self.num_arrivals = 0
        self.num_displaced = 0
        self.num_missing_scores = 0
        self._awaiting_first: dict[Request, None] = {}
        self._running_version = 0
        self._no_victim: tuple[Any, ...] | None = None
        self._score_sum = 0.0
        self._score_n = 0
        self.policy = policy
        self.set_policy(policy, oracle)

    # ----------------------------------------------------------- policy
    def set_policy(self, policy: Policy, oracle: str | None = None) -> None:
        """Use ``policy`` from now on (only while no request is queued or running)."""
        if self.reqs:
            raise RuntimeError("the policy can only be replaced while the engine holds no requests")
        if oracle is not None:
            self.oracle_mode = oracle
        _check_oracle(policy, self.oracle_mode)
        if policy.oracle:
            policy.bind_oracle(self._true_length)
        self.policy = policy
        kind = type(policy)
        self._arrival_hook = kind.overrides("on_arrival")
        self._progress_hook = kind.overrides("on_progress")
        self._finish_hook = kind.overrides("on_finish")
        self._timer_hook = kind.overrides("rekey_at_time")
        self.custom_victim = kind.overrides("choose_victim")
        self.preemptive = bool(policy.preemptive)
        self.displacement = _displacement_mode(policy)
        # a failed displacement check stays failed until the queue head, the running set, the key
        # epoch or a running request's rekey point changes (stable_displacement); the rekey points
        # are tracked in output tokens: the check records how many tokens the nearest one is away
        # (its slack) and progress() counts the most tokens one request may have gained since
        self._skip_failed = kind.stable_displacement()
        self._hinted = kind.overrides("rekey_after_tokens")
        self._no_victim = None
        self._no_victim_slack = 0.0
        self._gained = 0
        # per running request id: (valid below this output count, preemptions, key epoch,
        # can_preempt, (key, seq), next rekey point or inf, request); keys hold between rekey
        # hints (the Policy contract) unless the policy watches progress itself; can_preempt is
        # cached only where it changes at hints alone
        self._victim_cache: dict[str, tuple[int, int, int, bool, tuple[PolicyKey, int], float, Request]] = {}
        self._cache_victims = not self._progress_hook
        self._fresh_can_preempt = kind.overrides("can_preempt") and not kind.preempt_changes_at_hints
        for q in self.queues:
            q._pq = PolicyQueue(policy)
        self._timers.clear()

    def _true_length(self, req: Request) -> int:
        n = req.max_tokens
        if self.max_model_len is not None:
            n = min(n, max(self.max_model_len - req.num_prompt_tokens, 1))
        e = self.engine.get(req)
        params = getattr(e, "sampling_params", None)
        if params is not None and not getattr(params, "ignore_eos", True) and "ignore_eos" not in self._warned:
            self._warned.add("ignore_eos")
            logger.warning(
                "headway: oracle policy %r reads max_tokens as the true length, but request %s does "
                "not set ignore_eos (benchmark-only mode; its true length may be shorter)",
                self.policy.name,
                req.request_id,
            )
        return n

    # ------------------------------------------------------------ clock
    def now(self) -> float:
        return self._clock() - self.epoch

    # ------------------------------------------------------------ queues
    def make_queue(self) -> HeadwayRequestQueue:
        q = HeadwayRequestQueue(self)
        self.queues.append(q)
        return q

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message + " (warned once)", *args)

    def _request_score(self, e: Any, value: Any) -> float | None:
        """A client's ``headway_score``: a finite number, else ignored (the request is scored as one
        without): a request's own fields must never stop the engine."""
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        self._warn_once(
            "bad_score", "headway: request %s: headway_score %r is not a finite number; ignored", e.request_id, value
        )
        return None

    def _request_tier(self, e: Any, value: Any) -> Tier:
        """A client's ``headway_tier`` (premium, standard, batch), else standard."""
        if value is None:
            return Tier.STANDARD
        try:
            return Tier.parse(value)
        except (ValueError, TypeError, AttributeError):
            self._warn_once(
                "bad_tier", "headway: request %s: headway_tier %r is not a tier; standard used", e.request_id, value
            )
            return Tier.STANDARD

    def _new_request(self, e: Any) -> Request:
        xa = _xargs(e)
        arrival = max(0.0, float(getattr(e, "arrival_time", self._clock())) - self.epoch)
        h = Request(
            request_id=str(e.request_id),
            arrival_time=arrival,
            num_prompt_tokens=max(int(e.num_prompt_tokens), 1),
            max_tokens=max(int(e.max_tokens or 1), 1),
            tenant_id=str(xa.get("headway_tenant", "default")),
            tier=self._request_tier(e, xa.get("headway_tier")),
            priority=int(getattr(e, "priority", 0) or 0),
            category=str(xa["headway_category"]) if "headway_category" in xa else None,
            score=self._request_score(e, xa.get("headway_score")),
            seq=next(self._seq),
        )
        h.queued_time = self.now()
        if "headway_request_id" in xa:
            h.extra["headway.client_id"] = str(xa["headway_request_id"])
        self.reqs[h.request_id] = h
        self.engine[h] = e
        self.num_arrivals += 1
        return h

    def enqueue(self, e: Any, queue: HeadwayRequestQueue) -> None:
        """An engine request entered ``queue`` (new, preempted, or skipped and put back)."""
        t0 = time.perf_counter()
        h = self.reqs.get(e.request_id)
        if h is None:
            h = self._new_request(e)
            self._pending[h] = queue
            queue._npending += 1
        else:
            now = self.now()
            self._sync(h, e, now)
            if h.state is RequestState.RUNNING:  # preempted without our hook (e.g. a resumed session)
                self._mark_preempted(h)
            queue._pq.add(h, now)
            self._arm_timer(h, now)
        self.policy_time += time.perf_counter() - t0

    def flush(self) -> None:
        """Score and announce the requests that arrived since the last call (one batch)."""
        if not self._pending:
            return
        t0 = time.perf_counter()
        pending, self._pending = self._pending, {}
        if self.score_batch is not None:
            todo = [h for h in pending if h.score is None]
            if todo:
                s0 = time.perf_counter()
                texts = self._prompt_texts(todo)
                scores = self.score_batch(texts)
                if len(scores) != len(todo):
                    raise RuntimeError(f"headway scorer returned {len(scores)} scores for {len(todo)} prompts")
                for h, s in zip(todo, scores, strict=True):
                    h.score = float(s) if math.isfinite(float(s)) else None  # none: the missing-score path
                self.score_time += time.perf_counter() - s0
                self.num_scored += len(todo)
        now = self.now()
        policy = self.policy
        for h, q in pending.items():
            q._npending -= 1
            if self._arrival_hook:
                try:
                    policy.on_arrival(h, now)
                except ValueError:
                    if h.score is not None:
                        raise
                    fallback = self.missing_score
                    if fallback is None:
                        fallback = self._score_sum / self._score_n if self._score_n else 0.0
                    h.score = fallback
                    self.num_missing_scores += 1
                    self._warn_once(
                        "missing_score",
                        "headway: request %s has no score for policy %r; using %s (send vllm_xargs "
                        "headway_score or set the scorer setting)",
                        h.request_id,
                        policy.name,
                        fallback,
                    )
                    policy.on_arrival(h, now)
            if h.score is not None:
                self._score_sum += h.score
                self._score_n += 1
            q._pq.add(h, now)
            self._arm_timer(h, now)
        self.policy_time += time.perf_counter() - t0

    def _prompt_texts(self, hs: Sequence[Request]) -> list[str]:
        """Prompt texts for the scorer: the engine's text if it kept it, else its token ids
        detokenized (one batch call)."""
        engine = self.engine
        need = []
        for h in hs:
            if h.prompt is None:
                e = engine[h]
                text = getattr(e, "prompt", None)
                if isinstance(text, str):
                    h.prompt = text
                elif getattr(e, "prompt_token_ids", None) is not None and self.decode is not None:
                    need.append(h)
                else:
                    h.prompt = ""
        if need:
            assert self.decode is not None
            for h, text in zip(need, self.decode([engine[h].prompt_token_ids for h in need]), strict=True):
                h.prompt = text
        return [h.prompt or " " for h in hs]

    def _arm_timer(self, h: Request, now: float) -> None:
        """Remember a queued request's next rekey time (only one still ahead of ``now``)."""
        if self._timer_hook:
            at = self.policy.rekey_at_time(h)
            if at is not None and at > now:
                heapq.heappush(self._timers, (at, h.seq, h))

    def step_start(self) -> None:
        """Before an engine step: arrivals, due rekey timers, key-epoch changes."""
        if self._pending:
            self.flush()
        t0 = time.perf_counter()
        now = self.now()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, h = heapq.heappop(timers)
            if h.is_finished or h.state is RequestState.RUNNING:
                continue
            for q in self.queues:
                if h in q._pq:
                    q._pq.rekey(h, now)
            self._arm_timer(h, now)
        for q in self.queues:
            q._pq.refresh(now)
        self.policy_time += time.perf_counter() - t0

    # --------------------------------------------------------- lifecycle
    def take_popped(self) -> list[Request]:
        popped, self._popped = self._popped, []
        return popped

    def mark_running(self, h: Request) -> None:
        if h.state is not RequestState.RUNNING and not h.is_finished:
            h.transition(RequestState.RUNNING)
            self._running_version += 1
            if h.first_scheduled_time is None:
                h.first_scheduled_time = self.now()
            if h.first_token_time is None and not self._progress_hook:
                self._awaiting_first[h] = None

    def _mark_preempted(self, h: Request) -> None:
        h.num_recomputed_tokens += h.num_computed_tokens
        h.num_computed_tokens = 0
        h.num_preemptions += 1
        h.transition(RequestState.PREEMPTED)

    def preempt(self, e: Any) -> None:
        """The engine is about to evict running request ``e`` (it then re-enters a queue)."""
        t0 = time.perf_counter()
        h = self.reqs.get(e.request_id)
        if h is not None and h.state is RequestState.RUNNING:
            self._sync(h, e, self.now())
            self._mark_preempted(h)
            self._running_version += 1
        self.policy_time += time.perf_counter() - t0

    def _sync(self, h: Request, e: Any, now: float) -> None:
        out = int(e.num_output_tokens)
        if out != h.num_output_tokens:
            if h.first_token_time is None and out > 0:
                h.first_token_time = now
            h.last_token_time = now
            h.num_output_tokens = out
        if h.state is RequestState.RUNNING:
            h.num_computed_tokens = int(e.num_computed_tokens)

    def progress(self, num_scheduled: Mapping[str, int], max_new_tokens: int | None = None) -> None:
        """After a step: the tokens each request computed.

        Policies that override ``on_progress`` get one call per scheduled request per step
        (with the step's tokens). For the others nothing is done per request: counters are
        synced lazily, before the policy reads a key, at preemption and at finish; only
        requests still waiting for their first token are checked (for its timestamp).

        ``max_new_tokens``: the most output tokens one request can have gained in the step
        (vLLM: 1 plus its speculative tokens); default the largest ``num_scheduled`` count,
        an upper bound since a request gains at most one output token per computed token.
        """
        t0 = time.perf_counter()
        if max_new_tokens is None:
            max_new_tokens = max(num_scheduled.values(), default=0)
        self._gained += max_new_tokens
        now = self.now()
        reqs, engine = self.reqs, self.engine
        if self._progress_hook:
            hook = self.policy.on_progress
            for rid, n in num_scheduled.items():
                h = reqs.get(rid)
                if h is None or h.state is not RequestState.RUNNING:
                    continue
                self._sync(h, engine[h], now)
                if n > 0:
                    hook(h, now, n)
            self._awaiting_first.clear()
        elif self._awaiting_first:
            for h in list(self._awaiting_first):
                e = engine.get(h)
                if e is None or e.num_output_tokens > 0:
                    del self._awaiting_first[h]
                    if e is not None:
                        self._sync(h, e, now)
        self.policy_time += time.perf_counter() - t0

    def finish(self, e: Any, aborted: bool) -> Request | None:
        """``e`` left the engine: finished (``on_finish``) or aborted. Returns its headway request."""
        t0 = time.perf_counter()
        h = self.reqs.pop(e.request_id, None)
        if h is None:
            return None
        self.engine.pop(h, None)
        self._awaiting_first.pop(h, None)
        self._victim_cache.pop(h.request_id, None)
        self._running_version += 1
        q = self._pending.pop(h, None)
        if q is not None:
            q._npending -= 1
        for queue in self.queues:
            queue._pq.remove(h)
        now = self.now()
        if h.state is RequestState.RUNNING:
            self._sync(h, e, now)
        else:
            h.num_output_tokens = int(e.num_output_tokens)
        if aborted:
            if not h.is_finished:
                h.transition(RequestState.ABORTED)
            h.finish_time = now
        else:
            if h.state is not RequestState.RUNNING:  # stopped while preempted (stale async output)
                h.state = RequestState.RUNNING
            h.transition(RequestState.FINISHED)
            h.finish_time = now
            if self._finish_hook:
                self.policy.on_finish(h, now)
        self.policy_time += time.perf_counter() - t0
        return h

    # ------------------------------------------------------- decisions
    def _key(self, e: Any, now: float) -> tuple[PolicyKey, int] | None:
        h = self.reqs.get(e.request_id)
        if h is None:
            return None
        self._sync(h, e, now)
        return (self.policy.key(h, now), h.seq)

    def eviction_order(self, running: Sequence[Any], max_custom: int = 16) -> list[Any]:
        """``running`` reordered so that the policy's victims come last.

        Sorted by key (best first); when the policy overrides ``choose_victim``, its first
        ``max_custom`` choices are moved to the end in reverse order of choice (the
        first victim last), so popping from the end follows ``choose_victim``.
        """
        t0 = time.perf_counter()
        now = self.now()
        known: list[tuple[tuple[PolicyKey, int], Any]] = []
        unknown: list[Any] = []
        for e in running:
            k = self._key(e, now)
            if k is None:
                unknown.append(e)
            else:
                known.append((k, e))
        known.sort(key=lambda t: t[0])
        order = [e for _, e in known]
        if self.custom_victim and len(order) > 1:
            hmap = {id(e): self.reqs[e.request_id] for e in order}
            rest = [hmap[id(e)] for e in order]
            tail: list[Request] = []
            for _ in range(min(max_custom, len(rest) - 1)):
                v = self.policy.choose_victim(rest, now)
                rest.remove(v)
                tail.append(v)
            order = [self.engine[h] for h in rest] + [self.engine[h] for h in reversed(tail)]
        self.policy_time += time.perf_counter() - t0
        return unknown + order

    def _cached_victim(self, bound: tuple[PolicyKey, int], running: Sequence[Any], now: float) -> Any:
        """:meth:`displacement_victim` from cached keys: each running request's key and
        ``can_preempt`` are recomputed only once it reaches its next rekey point (or is
        preempted, or the key epoch moves). Between those points a key may only improve, so a
        cached key is never better than the true one: no cached candidate means no victim, and
        a candidate whose fresh key equals its cached one is the true worst. Anything else:
        ``_RESCAN`` (the caller scans with fresh keys). With no victim it records the slack:
        the fewest output tokens any running request is from its next rekey point.
        ``can_preempt`` is cached only when the policy says it changes at hints alone."""
        policy, reqs, cache = self.policy, self.reqs, self._victim_cache
        epoch, fresh, running_state = policy.key_epoch, self._fresh_can_preempt, RequestState.RUNNING
        cand: Any = None
        cand_h: Request | None = None
        cand_key: tuple[PolicyKey, int] | None = None
        slack = math.inf
        for e in running:
            rid = e.request_id
            out = e.num_output_tokens
            c = cache.get(rid)
            if c is None or out >= c[0] or c[2] != epoch or c[1] != c[6].num_preemptions:
                h = reqs.get(rid)
                if h is None or h.state is not running_state:
                    continue
                self._sync(h, e, now)
                hint = policy.rekey_after_tokens(h)
                # without a hint the key only improves: refresh it each token, but it never
                # turns a failed check into a success (no limit on the slack)
                until = out + max(int(hint), 1) if hint is not None else out + 1
                limit = until if hint is not None else math.inf
                key = (policy.key(h, now), h.seq)
                c = (until, h.num_preemptions, epoch, policy.can_preempt(h, now), key, limit, h)
                cache[rid] = c
            elif c[6].state is not running_state:
                continue
            if c[5] - out < slack:
                slack = c[5] - out
            if (
                c[4] > bound
                and (c[3] or (fresh and policy.can_preempt(c[6], now)))
                and (cand_key is None or c[4] > cand_key)
            ):
                cand, cand_h, cand_key = e, c[6], c[4]
        if cand is None or cand_h is None:
            self._no_victim_slack = slack
            return None
        self._sync(cand_h, cand, now)
        if policy.can_preempt(cand_h, now) and (policy.key(cand_h, now), cand_h.seq) == cand_key:
            return cand
        return _RESCAN

    def displacement_victim(self, queue: HeadwayRequestQueue, running: Sequence[Any]) -> Any | None:
        """For preemptive policies: the running request that ``queue``'s head should displace.

        The worst-keyed running request that ``can_preempt`` allows, if its key is larger
        than the head's; None otherwise.
        """
        t0 = time.perf_counter()
        try:
            head = queue._pq.peek()
            head_key = queue._pq.peek_key()
            if head is None or head_key is None:
                return None
            sig = (head.seq, head_key, self._running_version, self.policy.key_epoch, len(running))
            if sig == self._no_victim and self._gained < self._no_victim_slack:
                return None
            bound = (head_key, head.seq)
            now = self.now()
            self._gained = 0
            if self._cache_victims:
                found = self._cached_victim(bound, running, now)
                if found is not _RESCAN:
                    self._no_victim = sig if found is None and self._skip_failed else None
                    return found
            worst: Any = None
            worst_key: tuple[PolicyKey, int] | None = None
            policy = self.policy
            for e in running:
                h = self.reqs.get(e.request_id)
                if h is None or h.state is not RequestState.RUNNING:
                    continue
                self._sync(h, e, now)
                if not policy.can_preempt(h, now):
                    continue
                k = (policy.key(h, now), h.seq)
                if k > bound and (worst_key is None or k > worst_key):
                    worst, worst_key = e, k
            # a fresh scan records no rekey points: only a hintless policy may skip the next check
            self._no_victim_slack = 0.0 if self._hinted else math.inf
            self._no_victim = sig if worst is None and self._skip_failed else None
            return worst
        finally:
            self.policy_time += time.perf_counter() - t0


def _displacement_mode(policy: Policy) -> str:
    """The mode in which ``policy`` displaces running requests in vLLM: its declared
    ``displacement`` (``none`` if it declares none: vLLM's decisions). ``pause`` (vllm-ltr) is not
    available inside vLLM, whose model runner holds at most ``max_num_seqs`` requests: the plugin
    runs it as ``none`` and says so once."""
    mode = str(getattr(policy, "displacement", "none")) if policy.preemptive else "none"
    if mode == "pause":
        logger.warning(
            "headway: policy %r displaces in 'pause' mode, which vLLM's model runner cannot hold; "
            "the plugin runs it without displacement (vLLM's decisions). Set policy_args "
            "displacement='evict' for SGLang-style displacement",
            policy.name,
        )
        return "none"
    return mode


_RESCAN: Any = object()
"""Returned by ``PolicyAdapter._cached_victim`` when the cache cannot decide."""


class HeadwayRequestQueue:
    """A waiting queue in policy order, shaped like vLLM's ``RequestQueue``.

    Holds engine requests; orders them by the policy's key then arrival sequence (a
    :class:`~headway.core.PolicyQueue` underneath: O(log n) add and pop). ``prepend_*``
    re-insert by key: a preempted or skipped request goes where the policy puts it, not
    to the front. Requests added since the last step stay unordered until
    :meth:`PolicyAdapter.flush` scores them (peek/pop/iteration flush first).
    """

    __slots__ = ("_a", "_npending", "_pq")

    def __init__(self, adapter: PolicyAdapter) -> None:
        self._a = adapter
        self._pq = PolicyQueue(adapter.policy)
        self._npending = 0

    def add_request(self, request: Any) -> None:
        self._a.enqueue(request, self)

    def prepend_request(self, request: Any) -> None:
        self._a.enqueue(request, self)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for r in requests:
            self._a.enqueue(r, self)

    def _head(self) -> Request | None:
        a = self._a
        if a._pending:
            a.flush()
        return self._pq.peek()

    def peek_request(self) -> Any:
        t0 = time.perf_counter()
        h = self._head()
        self._a.policy_time += time.perf_counter() - t0
        if h is None:
            raise IndexError("peek from an empty queue")
        return self._a.engine[h]

    def pop_request(self) -> Any:
        t0 = time.perf_counter()
        a = self._a
        if a._pending:
            a.flush()
        if not self._pq:
            raise IndexError("pop from an empty queue")
        h = self._pq.pop()
        a._popped.append(h)
        a.policy_time += time.perf_counter() - t0
        return a.engine[h]

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        a = self._a
        for r in requests:
            h = a.reqs.get(r.request_id)
            if h is None:
                continue
            if a._pending.get(h) is self:
                del a._pending[h]
                self._npending -= 1
            self._pq.remove(h)

    def __len__(self) -> int:
        return len(self._pq) + self._npending

    def __bool__(self) -> bool:
        return self._npending > 0 or bool(self._pq)

    def __iter__(self) -> Iterator[Any]:
        if self._a._pending:
            self._a.flush()
        engine = self._a.engine
        return iter([engine[h] for h in self._pq])

    def __contains__(self, request: object) -> bool:
        h = self._a.reqs.get(getattr(request, "request_id", ""))
        return h is not None and (h in self._pq or self._a._pending.get(h) is self)


# ------------------------------------------------------------- version guard
def check_vllm_version(version: str) -> None:
    """Raise :class:`VllmVersionError` unless ``version`` is a supported vLLM release."""
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM_VERSIONS):
        raise VllmVersionError(
            f"headway's vLLM plugin supports vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)} "
            f"(the V1 scheduler interface it subclasses); found vLLM {version}. Install a supported "
            "version, or set check_version=false in the headway settings to try anyway."
        )


def _check_interface(scheduler_cls: Any, queue_cls: Any, version: str) -> None:
    missing = [f"Scheduler.{m}" for m in _SCHEDULER_HOOKS if not callable(getattr(scheduler_cls, m, None))]
    missing += [f"RequestQueue.{m}" for m in _QUEUE_METHODS if not hasattr(queue_cls, m)]
    if missing:
        raise VllmVersionError(
            f"vLLM {version}'s scheduler interface differs from the one headway's plugin supports "
            f"(vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)}): missing {', '.join(missing)}"
        )


def _max_new_tokens(scheduler_output: Any) -> int | None:
    """The most output tokens one request can gain from a vLLM step: 1 plus its speculative
    draft tokens; 0 when the step schedules nothing; None when the output lacks the field
    (the adapter then bounds it by the scheduled token counts)."""
    if not scheduler_output.num_scheduled_tokens:
        return 0
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None)
    if not isinstance(spec, Mapping):
        return None
    return 1 + max(map(len, spec.values()), default=0)


class _StepLog:
    """Buffered JSONL writer for the ``step_log`` setting."""

    def __init__(self, path: str) -> None:
        p = Path(path).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self._fh: IO[str] = p.open("a", encoding="utf-8")
        self._buf: list[str] = []

    def write(self, row: Mapping[str, Any], flush: bool = False) -> None:
        self._buf.append(json.dumps(row, separators=(",", ":")))
        if flush or len(self._buf) >= 256:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._fh.flush()
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        self._fh.close()


def _build_scheduler_classes() -> tuple[type[Any], type[Any]]:
    """Import vLLM, check its interface, and define the scheduler classes."""
    try:
        import vllm
        from vllm.v1.core.sched import request_queue as vllm_rq
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.request import RequestStatus
    except ImportError as exc:
        raise VllmVersionError(
            f"headway's vLLM plugin needs vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)} "
            f"with the V1 engine; importing it failed: {exc}"
        ) from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    _check_interface(Scheduler, vllm_rq.RequestQueue, version)
    fcfs = vllm_rq.SchedulingPolicy.FCFS
    priority_mode = vllm_rq.SchedulingPolicy.PRIORITY
    running_status = RequestStatus.RUNNING
    abort_statuses = frozenset(s for s in RequestStatus if s.name in _ABORT_STATUSES)

    def make(base: type[Any], name: str) -> type[Any]:
        class _Headway(base):  # type: ignore[misc]
            """vLLM's scheduler with a headway policy ordering its queues (see the module doc)."""

            policy: Any  # vLLM's SchedulingPolicy, set by the base class
            max_num_scheduled_tokens: int  # the step's token budget, set by the base class (capped by Sarathi's)

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                _log_like_vllm()
                vllm_config = kwargs.get("vllm_config", args[0] if args else None)
                cfg = PluginConfig.resolve(getattr(vllm_config, "additional_config", None))
                if cfg.check_version:
                    check_vllm_version(version)
                super().__init__(*args, **kwargs)
                self.headway_config = cfg
                if self.policy != fcfs:  # the user's --scheduling-policy, before headway's takes over
                    logger.warning(
                        "headway: --scheduling-policy %s is replaced by headway policy %r "
                        "(use policy 'priority' for vLLM-style priorities)",
                        self.policy.value,
                        cfg.policy,
                    )
                # vLLM's priority path picks the victim as max (priority, arrival) over the running
                # requests, wherever they are in the list (unscheduling one already scheduled this step);
                # _hw_rank_victims makes that max the policy's victim. No other decision reads it.
                self.policy = priority_mode
                score_batch = None
                if cfg.scorer is not None:
                    score_batch = load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
                self._hw_tokenizer_path = cfg.tokenizer or getattr(self.vllm_config.model_config, "tokenizer", None)
                self._hw_tokenizer: Any = None
                self._hw_budget0 = int(self.max_num_scheduled_tokens)
                first = make_plugin_policy(cfg.policy, cfg.policy_args)
                self.max_num_scheduled_tokens = self._hw_budget(first)
                self.headway = PolicyAdapter(
                    first,
                    oracle=cfg.oracle,
                    max_model_len=self.max_model_len,
                    score_batch=score_batch,
                    decode=self._hw_decode if score_batch is not None else None,
                    missing_score=cfg.missing_score,
                )
                self.waiting = self.headway.make_queue()
                self.kv_holding_waiting = self.headway.make_queue()
                self._hw_control = cfg.control_file
                self._hw_control_mtime: int | None = None
                if self._hw_control:
                    with contextlib.suppress(OSError):
                        self._hw_control_mtime = os.stat(self._hw_control).st_mtime_ns
                self._hw_log = _StepLog(cfg.step_log) if cfg.step_log else None
                self._hw_t0 = 0.0
                self._hw_t1 = 0.0
                self._hw_pt = 0.0
                self._hw_st = 0.0
                self._hw_na = 0
                self._hw_comp = (0, 0)
                self._hw_step = 0
                if self._hw_log is not None:
                    self._hw_header()
                logger.info(
                    "headway: scheduling with policy %r %s (oracle=%s, scorer=%s, vLLM %s)",
                    cfg.policy,
                    json.dumps(cfg.policy_args),
                    cfg.oracle,
                    cfg.scorer,
                    version,
                )

            # ------------------------------------------------------ helpers
            def _hw_budget(self, policy: Policy) -> int:
                """The step's token budget under ``policy``: the engine's, capped by the policy's
                own (Sarathi's); a policy that needs chunked prefill is refused without it."""
                _check_chunked_prefill(policy, bool(self.scheduler_config.enable_chunked_prefill))
                budget = self._hw_budget0
                if policy.token_budget is not None and policy.token_budget < budget:
                    logger.info(
                        "headway: policy %r caps the step's token budget at %d (the engine's: %d)",
                        policy.name,
                        policy.token_budget,
                        budget,
                    )
                    budget = policy.token_budget
                return budget

            def _hw_decode(self, batch: list[Any]) -> list[str]:
                if self._hw_tokenizer is None:
                    from transformers import AutoTokenizer

                    tok = AutoTokenizer.from_pretrained(self._hw_tokenizer_path)
                    # the Rust tokenizer's batch decode, without the Python wrapper's per-call work
                    self._hw_tokenizer = getattr(tok, "backend_tokenizer", None) or tok
                tok = self._hw_tokenizer
                ids = [list(x) for x in batch]
                if hasattr(tok, "decode_batch"):
                    return [str(t) for t in tok.decode_batch(ids, skip_special_tokens=True)]
                return [str(t) for t in tok.batch_decode(ids, skip_special_tokens=True)]

            def _hw_header(self) -> None:
                assert self._hw_log is not None
                sc = self.scheduler_config
                self._hw_log.write({
                    "type": "header", "vllm": version, "time": time.time(),
                    "policy": self.headway.policy.name, "policy_args": self.headway_config.policy_args,
                    "num_gpu_blocks": self.cache_config.num_gpu_blocks, "block_size": self.block_size,
                    "max_num_seqs": self.max_num_running_reqs,
                    "max_num_batched_tokens": self._hw_budget0,  # the engine's, before a policy's cap
                    "max_model_len": self.max_model_len,
                    "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
                    "enable_prefix_caching": bool(self.cache_config.enable_prefix_caching),
                    "long_prefill_token_threshold": int(sc.long_prefill_token_threshold or 0),
                }, flush=True)  # fmt: skip

            def _hw_maybe_reload(self) -> None:
                path = self._hw_control
                assert path is not None
                try:
                    mtime = os.stat(path).st_mtime_ns
                except OSError:
                    return
                if mtime == self._hw_control_mtime:
                    return
                self._hw_control_mtime = mtime
                try:
                    data = json.loads(Path(path).read_text())
                    current = {"policy": self.headway.policy.name, "oracle": self.headway.oracle_mode}
                    # the settings' own checks (types, oracle, missing_score) on the values it switches to
                    cfg = control_settings(self.headway_config, data, current)
                    name = cfg.policy
                    policy = make_plugin_policy(name, cfg.policy_args)
                    budget = self._hw_budget(policy)
                    score_batch = (
                        None
                        if cfg.scorer is None
                        else load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
                    )
                    self.headway.set_policy(policy, cfg.oracle)
                    self.max_num_scheduled_tokens = budget
                    self.headway.score_batch = score_batch
                    self.headway.decode = self._hw_decode
                    self.headway.missing_score = cfg.missing_score
                except Exception as exc:  # anything raised here would stop the engine
                    logger.error("headway: control file %s ignored: %s: %s", path, type(exc).__name__, exc)
                    return
                logger.info("headway: policy switched to %r %s", name, json.dumps(data.get("policy_args", {})))
                if self._hw_log is not None:
                    self._hw_log.write(
                        {
                            "type": "policy",
                            "time": time.time(),
                            "policy": name,
                            "policy_args": data.get("policy_args", {}),
                        },
                        flush=True,
                    )

            def _hw_pressure(self) -> bool:
                """Whether scheduling the running requests could run out of KV blocks."""
                running = self.running
                if len(running) < 2:
                    return False
                free = self.kv_cache_manager.block_pool.get_num_free_blocks()
                bound = 2 * len(running) + -(-self.max_num_scheduled_tokens // self.block_size)
                return bool(free <= bound)

            def _hw_displace(self) -> None:
                """``evict`` displacement (SGLang's retract): a better-keyed waiting head that has a
                sequence slot but no KV blocks evicts the worst-keyed running request ``can_preempt``
                allows. A full batch (no slot) displaces nobody: vLLM's decision."""
                a = self.headway
                if self.kv_holding_waiting or not self.waiting:
                    return
                waiting = self.waiting
                for _ in range(len(self.running)):
                    if len(self.running) >= self.max_num_active_reqs:
                        return
                    head = waiting.peek_request()
                    need = -(-max(head.num_tokens - head.num_computed_tokens, 1) // self.block_size)
                    free = self.kv_cache_manager.block_pool.get_num_free_blocks()
                    if free - len(self.running) >= need:
                        return
                    victim = a.displacement_victim(waiting, self.running)
                    if victim is None:
                        return
                    self.running.remove(victim)
                    self._preempt_request(victim, time.monotonic())
                    a.num_displaced += 1

            def _hw_rank_victims(self) -> list[tuple[Any, int]]:
                """Before a step that could run out of KV blocks: give each running request the
                policy's eviction rank as its vLLM ``priority`` (restored after the step), so
                vLLM's own priority-preemption code evicts the policy's victim. The running list
                keeps vLLM's order (who is scheduled first); only the victim is the policy's."""
                saved = [(r, r.priority) for r in self.running]
                for rank, r in enumerate(self.headway.eviction_order(self.running)):
                    r.priority = rank
                return saved

            # ---------------------------------------------------- overrides
            def add_request(self, request: Any) -> None:
                if self._hw_control is not None and not self.requests:
                    self._hw_maybe_reload()
                super().add_request(request)

            def schedule(self, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                a = self.headway
                a.step_start()
                if a.displacement == "evict" and self.running:
                    self._hw_displace()
                saved = self._hw_rank_victims() if self._hw_pressure() else None
                try:
                    out = super().schedule(*args, **kwargs)
                finally:
                    for r, priority in saved or ():
                        r.priority = priority
                t1 = time.perf_counter()
                for h in a.take_popped():
                    e = a.engine.get(h)
                    if e is not None and e.status == running_status:
                        a.mark_running(h)
                a.policy_time += time.perf_counter() - t1
                self._hw_t0, self._hw_t1 = t0, t1
                if self._hw_log is not None:  # the step's composition, while every request is still here
                    reqs = self.requests
                    kv = prefill = 0
                    for rid, n in out.num_scheduled_tokens.items():
                        r = reqs.get(rid)
                        if r is not None:
                            kv += int(r.num_computed_tokens)  # context after this step's tokens
                            if n > 1 or r.num_computed_tokens <= r.num_prompt_tokens:
                                prefill += n
                    self._hw_comp = (kv, prefill)
                return out

            def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
                t2 = time.perf_counter()
                result = super().update_from_output(scheduler_output, model_runner_output)
                a = self.headway
                a.progress(scheduler_output.num_scheduled_tokens, _max_new_tokens(scheduler_output))
                if self._hw_log is not None and scheduler_output.total_num_scheduled_tokens > 0:
                    self._hw_record(scheduler_output, t2)
                return result

            def _hw_record(self, so: Any, t2: float) -> None:
                assert self._hw_log is not None
                t3 = time.perf_counter()
                a = self.headway
                kv, prefill = self._hw_comp
                self._hw_step += 1
                busy = bool(self.running) or bool(self.waiting) or bool(self.kv_holding_waiting)
                self._hw_log.write({
                    "step": self._hw_step, "t0": self._hw_t0, "t1": self._hw_t1, "t2": t2, "t3": t3,
                    "num_tokens": int(so.total_num_scheduled_tokens),
                    "num_seqs": len(so.num_scheduled_tokens), "num_kv_tokens": kv,
                    "num_prefill_tokens": prefill, "num_new": len(so.scheduled_new_reqs),
                    "waiting": len(self.waiting), "running": len(self.running), "busy": busy,
                    "policy_s": a.policy_time - self._hw_pt, "score_s": a.score_time - self._hw_st,
                    "arrivals": a.num_arrivals - self._hw_na,
                    "preempted": len(so.preempted_req_ids or ()),
                }, flush=not busy)  # fmt: skip
                # between-step work (arrivals) counts toward the next step
                self._hw_pt, self._hw_st, self._hw_na = a.policy_time, a.score_time, a.num_arrivals

            def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
                self.headway.preempt(request)
                return super()._preempt_request(request, *args, **kwargs)

            def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
                h = self.headway.finish(request, aborted=request.status in abort_statuses)
                if h is not None and self._hw_log is not None:
                    self._hw_log.write({
                        "type": "request", "id": h.request_id, "client_id": h.extra.get("headway.client_id"),
                        "seq": h.seq, "state": h.state.value, "epoch": self.headway.epoch,
                        "arrival": h.arrival_time, "added": h.queued_time,
                        "scheduled": h.first_scheduled_time, "first_token": h.first_token_time,
                        "finish": h.finish_time, "prompt": h.num_prompt_tokens,
                        "output": h.num_output_tokens, "preemptions": h.num_preemptions,
                    })  # fmt: skip
                return super()._free_request(request, *args, **kwargs)

            def shutdown(self) -> None:
                if self._hw_log is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self._hw_log.close()
                super().shutdown()

        _Headway.__name__ = _Headway.__qualname__ = name
        _Headway.__module__ = __name__
        return _Headway

    return make(Scheduler, "HeadwayScheduler"), make(AsyncScheduler, "HeadwayAsyncScheduler")


_CLASSES: dict[str, type[Any]] = {}


def __getattr__(name: str) -> Any:
    """``HeadwayScheduler`` / ``HeadwayAsyncScheduler`` are built (importing vLLM) on first access."""
    if name in ("HeadwayScheduler", "HeadwayAsyncScheduler"):
        if not _CLASSES:
            sync_cls, async_cls = _build_scheduler_classes()
            _CLASSES.update(HeadwayScheduler=sync_cls, HeadwayAsyncScheduler=async_cls)
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
