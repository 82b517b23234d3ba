"""Gateway configuration: frozen dataclasses with validation, loaded from TOML or JSON.

Config file (TOML shown; JSON with the same structure works too)::

    policy = "pars"                 # any registered headway policy
    policy_args = { }               # keyword settings for make_policy
    scorer = "default:onnx-int8"    # prompt scorer; score-ranked policies (pars, ...) need one
    scorer_fast_path = true         # dispatch a request nothing competes with before its score (scored meanwhile)
    tokenizer = ""                  # decodes token-id prompts for the scorer: a local directory ("" = none)
    online_learning = false         # refit the scorer per model on finished requests (GatewayConfig.online_learning)
    online_state = ""               # file online learning saves to and resumes from ("" = none; not with redis_url)
    max_queue_len = 10000           # 429 beyond this many queued requests
    max_queue_per_tenant = 0        # 0 = no per-tenant limit
    queue_ttl_s = 60.0              # 408 after waiting this long in the queue (503 when no backend is reachable)
    max_body_bytes = 1048576        # 413 beyond this
    body_timeout_s = 30.0           # 408 when a request's body has not arrived whole in this long
    default_max_tokens = 0          # added to a request that gives no max_tokens (0 = never: sent as it came)
    assumed_output_tokens = 256     # queue/router length of a request without max_tokens (never sent)
    add_stream_usage = false        # ask the backend for a stream's usage chunk (hidden from the client)
    max_tokens_limit = 0            # 400 above this many output tokens; sent as max_tokens if none given (0 = none)
    retry_after_s = 1               # Retry-After header of 429s and 503s
    max_attempts = 3                # backends tried per request before streaming starts
    drain_timeout_s = 30.0          # SIGTERM: finish in-flight + queued work up to this, then 503 the rest
    connect_timeout_s = 5.0         # opening a connection to a backend
    read_timeout_s = 300.0          # longest silence from a backend while waiting for / reading a response
    headers_timeout_s = 30.0        # streamed requests: headers, then the first event, within this, else retried
    backend_down_s = 2.0            # a backend that refused, dropped or stalled a request is skipped this long
    redis_url = ""                  # "" = in-memory queue state
    redis_lease_s = 5.0             # replica liveness lease (Redis mode), see _redis_queue
    router = "least-outstanding"    # which backend gets a dispatched request (headway routers)
    router_args = { }               # its settings (e.g. cache-aware's balance_abs_threshold)
    admin_api_key_sha256 = []       # keys that may read all of /metrics (when keys are required)
    client_header_timeout_s = 10.0  # a client's request head must arrive within this, else closed
    client_send_timeout_s = 60.0    # a client that takes none of its answer for this long is cut off
    keep_alive_timeout_s = 30.0     # an idle kept-alive client connection is closed after this
    max_connections = 0             # 503 to client connections beyond this (0 = a quarter of ulimit -n)
    forwarded_allow_ips = []        # proxies whose X-Forwarded-For/-Proto name the client ("*": any)
    passthrough = "all"             # other /v1 paths sent on unscheduled: "all", "none" or a list of paths
    # min_priority = 0              # most urgent 'priority' a request may ask for (unset: any)

    [[backends]]
    url = "http://127.0.0.1:8001"   # http:// or https:// (verified against the system CAs)
    api_key = ""                    # sent upstream as "Authorization: Bearer ..." (vLLM's --api-key)
    max_concurrency = 0             # in-flight requests sent to it (0 = no fixed limit: its /metrics decide)
    metrics_poll_s = 0.5            # read its /metrics (0 = never; default 0.5 s, 0 with a max_concurrency)
    max_waiting = 0                 # saturated when its waiting count (vllm:num_requests_waiting,
                                    # sglang:num_queue_reqs) > this
    max_kv_usage = 0.95             # saturated when its KV usage (vllm:kv_cache_usage_perc,
                                    # sglang:token_usage) >= this

    [[tenants]]
    name = "acme"
    tier = "premium"                # premium | standard | batch
    api_key_sha256 = ["<64 hex digits>"]
    # min_priority = 10             # this tenant's bound (unset: the gateway's min_priority)

Environment: every top-level setting can also come from ``HEADWAY_<SETTING>`` (upper case:
``HEADWAY_POLICY=pars``, ``HEADWAY_QUEUE_TTL_S=30``, tables as JSON), backends from
``HEADWAY_BACKENDS`` (comma-separated URLs or a JSON list of tables) with
``HEADWAY_BACKEND_API_KEY``, tenants from ``HEADWAY_TENANTS`` (a JSON list of tables); the file <
the environment < command-line flags
(:func:`~headway.serve._config_load.config_from_env`). ``examples/gateway.toml`` lists every setting.

API keys: ``api_keys = "auto"`` (default) requires a key when ``[[tenants]]`` lists any,
else every request belongs to tenant ``default``; ``"required"`` always requires one;
``"off"`` never. With ``redis_url``, keys not in the file are looked up in the Redis hash
``headway:apikeys``: field = SHA-256 hex of the key, value =
``{"tenant": "acme", "tier": "premium"}`` (optionally with ``"min_priority": 10``). Keys required
with none that could be valid (no tenant's ``api_key_sha256``, no ``redis_url``) is refused at startup.

Transparency: a request reaches its backend as the client sent it, byte for byte, unless an
option above says otherwise (``default_max_tokens`` > 0, or else ``max_tokens_limit`` > 0, adds
``max_tokens`` to a request that gives none; ``add_stream_usage``
adds ``stream_options.include_usage`` and hides the extra usage chunk from a client that did not
ask for it). Without them, a request that gives no ``max_tokens`` is queued as
``assumed_output_tokens`` long (a completions request that leaves the field out: 16, vLLM's default
there, if lower; a predictor's score, when there is one, ranks it) and generation stops where the
backend's own limit says, exactly as it would without the gateway.

Admission: by default each backend takes requests while its own ``/metrics`` say it has room
(nothing waiting beyond ``max_waiting``, KV usage below ``max_kv_usage``), so the gateway never
throttles an engine below what it keeps up with. A fixed in-flight cap is the option:
``max_concurrency = N`` alone switches a backend to it (no polling, for backends without
Prometheus metrics); with ``metrics_poll_s`` set as well, both apply.

A score-ranked policy (``pars``, ``sjf-score``, ``trail``, ``ltr``, ``rank-boost``) needs a
``scorer``, or a scorer of its own in ``policy_args`` (``scorer = "noisy-oracle"`` with
``tau``); without either it is refused at startup.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from headway.core import Tier, get_policy_class
from headway.policies import ScoredPolicy
from headway.predict._resolve import MIN_SCORING_LENGTH, not_a_spec_hint, predictor_spec
from headway.routers import DEFAULT_ROUTER, get_router_class, make_router
from headway.serve._wire import MAX_ABS_PRIORITY

__all__ = [
    "BackendConfig",
    "ConfigError",
    "GatewayConfig",
    "TenantConfig",
    "hash_api_key",
]


class ConfigError(ValueError):
    """A gateway setting is missing or out of range (the message names it and its value)."""


DEFAULT_METRICS_POLL_S = 0.5
"""How often a backend's ``/metrics`` are read when admission follows them (the default)."""


def hash_api_key(api_key: str) -> str:
    """SHA-256 hex digest of an API key: the only form in which keys are stored."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def _needs_scorer(policy_cls: type, policy_args: Mapping[str, Any]) -> bool:
    """A score-ranked policy without a scorer of its own in ``policy_args`` (or a composing policy,
    such as ``bands``, that says so of its inner policy through ``needs_scorer``)."""
    composed = getattr(policy_cls, "needs_scorer", None)
    if callable(composed):
        return bool(composed(policy_args))
    return issubclass(policy_cls, ScoredPolicy) and "scorer" not in policy_args


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def check_min_priority(value: object, name: str) -> None:
    """:class:`ConfigError` unless ``value`` (setting ``name``) is None or an integer ``priority`` could be."""
    _check(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_ABS_PRIORITY),
        f"{name} must be an integer between -{MAX_ABS_PRIORITY} and {MAX_ABS_PRIORITY}, got {value!r:.60}",
    )


def check_tenant_name(value: object, name: str) -> None:
    """:class:`ConfigError` unless ``value`` (setting ``name``) is a non-empty string of text: one
    holding a lone surrogate (JSON's ``"\\ud800"``, in ``HEADWAY_TENANTS`` or a Redis record) cannot
    be written as UTF-8, and as a ``tenant`` label it made every later ``/metrics`` a 500."""
    ok = False
    if isinstance(value, str) and value:
        with contextlib.suppress(UnicodeEncodeError):
            ok = bool(value.encode())
    _check(ok, f"{name} must be a non-empty string of UTF-8 text, got {value!r:.60}")


def split_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """A list setting given as a list, or as one string (``"a,b"``, as a flag or a variable gives it)."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(v.strip() for v in items if v.strip())


def redact_url(url: str) -> str:
    """``url`` with the password in it, if any, shown as ``***`` (for logs and metric labels)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def check_backend_url(url: str, name: str) -> None:
    """:class:`ConfigError` unless ``url`` is a backend's base URL; the message names ``name`` (the
    setting, ``backends.url``, or the flag, ``--backend``) and, for an address without a scheme
    (``127.0.0.1:8000``), suggests it with ``http://``."""
    parts = urlsplit(url)
    if not (parts.scheme in ("http", "https") and parts.hostname):
        hint = ""
        if url and "://" not in url and not url.startswith(("http:", "https:")):
            fixed = f"http://{url}"
            hint = f" (did you mean {name} {fixed}?)" if name.startswith("--") else f" (did you mean {fixed!r}?)"
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {url!r}{hint}")
    try:
        parts.port  # noqa: B018 - raises ValueError when out of range
    except ValueError:
        raise ConfigError(f"{name} has a port out of range 0-65535: {url!r}") from None


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """One OpenAI-compatible upstream server (vLLM, SGLang or the stub)."""

    url: str
    """Base URL without the ``/v1`` suffix, e.g. ``http://127.0.0.1:8001`` or ``https://llm.example``."""
    api_key: str = field(default="", repr=False)
    """Sent upstream as ``Authorization: Bearer <api_key>`` (a vLLM started with ``--api-key``);
    "" = no ``Authorization`` header. Never logged."""
    max_concurrency: int = 0
    """Most in-flight requests the gateway sends it at once (0 = no fixed limit: admission follows
    its ``/metrics``)."""
    metrics_poll_s: float = -1.0
    """Poll its Prometheus ``/metrics`` every this many seconds (0 = never). Default (-1): 0.5
    without a ``max_concurrency``, 0 with one (a fixed limit is the other admission mode; give
    both to have both)."""
    max_waiting: int = 0
    """Saturated while its waiting count (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``,
    plus our undelivered dispatches) > this."""
    max_kv_usage: float = 0.95
    """Saturated while its KV-cache usage (``vllm:kv_cache_usage_perc``, ``sglang:token_usage``)
    >= this (0..1]."""

    def __post_init__(self) -> None:
        check_backend_url(self.url, "backends.url")
        _check(
            isinstance(self.api_key, str) and "\r" not in self.api_key and "\n" not in self.api_key,
            "backends.api_key must be a string without line breaks",
        )
        object.__setattr__(self, "url", self.url.rstrip("/").removesuffix("/v1"))
        _check(self.max_concurrency >= 0, f"backends.max_concurrency must be >= 0, got {self.max_concurrency}")
        if self.metrics_poll_s == -1.0:
            object.__setattr__(self, "metrics_poll_s", 0.0 if self.max_concurrency else DEFAULT_METRICS_POLL_S)
        _check(
            self.metrics_poll_s >= 0 and math.isfinite(self.metrics_poll_s),
            f"backends.metrics_poll_s must be >= 0, got {self.metrics_poll_s}",
        )
        _check(
            self.max_concurrency > 0 or self.metrics_poll_s > 0,
            f"backend {self.url}: needs max_concurrency > 0 or metrics_poll_s > 0 "
            "(otherwise nothing ever queues in the gateway)",
        )
        _check(self.max_waiting >= 0, f"backends.max_waiting must be >= 0, got {self.max_waiting}")
        _check(0 < self.max_kv_usage <= 1, f"backends.max_kv_usage must be in (0, 1], got {self.max_kv_usage}")


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant, its QoS tier and the SHA-256 hashes of its API keys."""

    name: str
    tier: Tier = Tier.STANDARD
    api_key_sha256: tuple[str, ...] = ()
    min_priority: int | None = None
    """The most urgent ``priority`` its requests may ask for (lower runs first, as in vLLM): a request
    asking for less is a 400, one that gives none is queued at this when it is above 0. None: the
    gateway's ``min_priority``."""

    def __post_init__(self) -> None:
        check_tenant_name(self.name, "tenants.name")
        check_min_priority(self.min_priority, f"tenant {self.name!r}: min_priority")
        object.__setattr__(self, "tier", Tier.parse(self.tier))
        hashes = tuple(h.lower() for h in self.api_key_sha256)
        for h in hashes:
            _check(
                len(h) == 64 and all(c in "0123456789abcdef" for c in h),
                f"tenant {self.name!r}: api_key_sha256 entries must be 64 hex digits "
                f"(SHA-256 of the key), got one of length {len(h)}",
            )
        object.__setattr__(self, "api_key_sha256", hashes)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything ``create_app`` needs; see the module docstring for the file format."""

    backends: tuple[BackendConfig, ...]
    policy: str = "fcfs"
    policy_args: Mapping[str, Any] = field(default_factory=dict)
    tenants: tuple[TenantConfig, ...] = ()
    max_queue_len: int = 10_000
    max_queue_per_tenant: int = 0
    queue_ttl_s: float = 60.0
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 30.0
    """408 for a request whose body has not arrived whole within this long (a client that stalls
    while sending would otherwise hold its connection, and a drain, for good)."""
    default_max_tokens: int = 0
    """0 (default): a request that gives no ``max_tokens`` is sent as the client sent it (the
    backend's own limit applies), unless ``max_tokens_limit`` is set (then it gets the limit). > 0:
    such a request gets ``max_tokens`` = this added (with ``max_tokens_limit`` set, the smaller of
    the two) and is queued with it."""
    assumed_output_tokens: int = 256
    """The output length the queue and the router assume for a request that gives no
    ``max_tokens`` (and ``default_max_tokens`` is 0). Only a scheduling estimate, never sent:
    with a scorer the predicted length ranks the request instead."""
    add_stream_usage: bool = False
    """Add ``stream_options.include_usage`` to streamed requests that lack it, so that the
    policy learns each stream's exact ``usage.completion_tokens`` (the extra usage chunk is
    not passed to the client). Off: the gateway counts the stream's token events instead."""
    max_tokens_limit: int = 0
    """400 for a request asking for more than this many output tokens; a request asking for none is
    sent with ``max_tokens`` = this (or ``default_max_tokens``), so leaving it out does not get
    round the limit (vLLM then caps it at what its context leaves; 0 = no limit)."""
    retry_after_s: int = 1
    max_attempts: int = 3
    drain_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    """Longest silence from a backend while waiting for or reading a response (a non-streamed
    answer's headers come only with its end, so this also bounds a whole non-streamed answer)."""
    headers_timeout_s: float = 30.0
    """Streamed requests: the backend's response headers must come within this (vLLM sends them at
    once), and then its first event within this again (vLLM's comes with the first token), else the
    backend counts as stalled: it is skipped for ``backend_down_s`` and the request, of which
    nothing was streamed yet, is retried on another (``max_attempts``). 0 = only
    ``read_timeout_s``."""
    backend_down_s: float = 2.0
    """A backend that refused a connection, dropped one before answering or stalled is skipped
    for this long."""
    redis_url: str = ""
    """Keep queue state (and look up API keys) in Redis; replicas sharing it share one order."""
    redis_prefix: str = "headway:"
    """Prefix of every Redis key this gateway uses (one prefix = one shared queue)."""
    api_keys: str = "auto"
    """``"auto"``: require a key when ``tenants`` lists any; ``"required"``: always (keys
    from ``tenants`` and, with ``redis_url``, Redis); ``"off"``: everyone is tenant ``default``."""
    redis_lease_s: float = 5.0
    """Replica liveness lease in Redis mode: a replica that has not renewed it for this
    long is presumed dead and its queued entries and held backend slots are reclaimed."""
    redis_retry_s: float = 5.0
    """Keep retrying a Redis operation on connection errors for this long (Redis restart)."""
    router: str = DEFAULT_ROUTER
    """Which backend (among those with room) a dispatched request goes to: a registered
    ``headway.routers`` router (``headway.routers.available_routers()``). In-memory mode only;
    with ``redis_url`` the shared Lua dispatcher picks the least-loaded backend."""
    router_args: Mapping[str, Any] = field(default_factory=dict)
    admin_api_key_sha256: tuple[str, ...] = ()
    """SHA-256 of keys that see all of ``/metrics`` when API keys are required (a tenant
    key sees only its own tenant's series; no key: 401)."""
    scorer: str = ""
    """Prompt scorer run batched in a worker thread on arrival; sets ``Request.score`` (for
    ``pars`` and other score-ranked policies). A trained predictor: ``"default"`` (the
    ``headway.predict`` default predictor) or a checkpoint directory, each optionally with
    ``":BACKEND"`` (``torch``, ``onnx``, ``onnx-int8``); or ``"module:callable"`` (``list[str]
    -> scores``, or an object with ``score(prompts)``) or ``"module:factory()"``."""
    tokenizer: str = ""
    """With a scorer: the tokenizer that decodes a completions prompt of token ids into the text the
    scorer reads (vLLM's ``--tokenizer``; the vLLM plugin decodes with the model's): a local directory,
    or a name already in the local Hugging Face cache (nothing is downloaded), loaded with
    ``transformers.AutoTokenizer`` (the ``predict`` extra). Used for nothing else: the request goes
    upstream as sent. "" (the default): none, and such a prompt gets the fallback score."""
    scorer_threads: int | None = None
    """CPU threads of a trained predictor (default 2, or 1 when the gateway may run on only
    one CPU beside those a local vLLM gets: :func:`headway.serve._scorer.default_scorer_threads`).
    Measured: ``docs/results/gateway-vllm.md``."""
    scorer_max_length: int | None = None
    """Truncate prompts to this many tokens when scoring with a trained predictor
    (default: the length it was trained with, 128). Scoring time grows with the longest
    prompts. Measured: ``docs/results/predictor-speed.md`` and ``docs/results/gateway-vllm.md``."""
    scorer_batch_size: int = 32
    scorer_max_wait_s: float = 0.002
    scorer_process: bool = False
    """Score in a worker process instead of a thread of the gateway's process, so that the
    scorer no longer shares the GIL with the event loop (``headway.serve._scorer.ProcessScoreFn``)."""
    online_learning: bool = False
    """Learn each served model's output lengths from its finished requests
    (:class:`headway.predict.OnlineLearner`): a finished request's prompt and completion tokens are
    queued (never waited for) to a background thread that refits a ridge head per model (the
    request's ``model`` field) on the shipped predictor's features over the model's latest 500;
    that model's requests are scored with its head once it has one (after 25), with the shipped
    predictor's scores until then. Needs ``scorer`` to name the shipped predictor (``"default"``
    or ``"default:onnx-int8"`` with nothing trained) scored in this process (not
    ``scorer_process``). With ``redis_url`` replicas share the windows in Redis
    (``{redis_prefix}online:{model}``). Off by default: not measured to rank better yet."""
    online_state: str = ""
    """With ``online_learning`` and no ``redis_url``: a file the learned windows are saved to within
    a second of each finished request and at shutdown, and resumed from at start, so a restarted
    gateway keeps each model's head. "" (the default): none, learning starts afresh at every start.
    With ``redis_url`` the windows live in Redis, which keeps them."""
    scorer_hold_s: float = 0.0
    """With a scorer: while more requests are being scored than are queued, free backends wait
    for the scores, at most this long (0, the default: never). Without a hold, the first
    requests of a burst to be scored are dispatched before the rest are known; with one, the
    engine idles until they are; a slow scorer may gain from one. Measured:
    ``docs/results/gateway-vllm.md``. With
    ``redis_url`` the counts are global: requests being scored by every replica, and the
    shared queue."""
    scorer_fast_path: bool = True
    """With a scorer: a request that no order could put behind another (nothing queued, and more
    free backend slots than requests being scored or arriving with it) is dispatched at once and
    scored in the background; its score then reaches the policy (before any retry queues it
    again), the metrics and the fallback mean as usual. The others wait for their scores as
    before, so the policy's order is kept whenever requests compete
    (:meth:`headway.serve._dispatch.Dispatcher.dispatch_unscored`). In-memory mode only: with
    ``redis_url`` every request is scored first. Measured: ``docs/results/gateway-overhead.md``."""
    client_header_timeout_s: float = 10.0
    """A client's request line and headers must arrive within this, from the connection opening
    (or a kept-alive request's first byte), else the connection is closed (after a 408 if part
    of them came): no slowloris."""
    client_send_timeout_s: float = 60.0
    """A client that takes none of its answer for this long, once the gateway holds 64 KiB of it
    unsent (a stream it does not read), is cut off: its connection is closed and its stream ends
    there (``client_send_timeout``), freeing its backend slot (nginx's ``send_timeout``)."""
    keep_alive_timeout_s: float = 30.0
    """An idle kept-alive client connection is closed after this."""
    max_connections: int = 0
    """Open client connections beyond this get a fast 503 ``too_many_connections``; 0: a quarter
    of the open-file limit (``ulimit -n``), between 64 and 8192."""
    forwarded_allow_ips: tuple[str, ...] = ()
    """Proxies in front of the gateway trusted to name the client (uvicorn's setting: addresses,
    networks such as ``10.0.0.0/8``, or ``*``): from one of them, the client's address and scheme are
    read from its ``X-Forwarded-For`` and ``X-Forwarded-Proto``, else they are the connection's.
    Either way the backend is sent the gateway's own ``X-Forwarded-For`` and ``X-Forwarded-Proto``
    (the client's address and scheme), never a client's. () (the default): no proxy is trusted."""
    passthrough: tuple[str, ...] = ("all",)
    """Which other ``/v1`` endpoints are passed through to a backend unscheduled: ``("all",)`` (the
    default), ``("none",)``, or paths under ``/v1``, each with every path under it (``/v1/files``:
    also ``/v1/files/f1``); any other is a 404."""
    min_priority: int | None = None
    """The most urgent ``priority`` a request may ask for (lower runs first, as in vLLM's field; what
    ``priority`` and ``bands`` order by): a request asking for less is a 400 naming ``priority``, and
    one that gives none is queued at this when it is above 0 (vLLM's default). A tenant's own
    ``min_priority`` takes its place for that tenant's keys. None (the default): no bound."""

    def __post_init__(self) -> None:
        _check(len(self.backends) > 0, "at least one backend is required (--backend URL)")
        urls = [b.url for b in self.backends]
        _check(len(set(urls)) == len(urls), f"backends must be distinct, got {urls}")
        policy_cls = get_policy_class(self.policy)  # UnknownPolicyError (a ValueError) names valid ones
        _check(
            not _needs_scorer(policy_cls, self.policy_args) or bool(self.scorer),
            f"policy {self.policy!r} ranks requests by a predicted length score, and no scorer is set: give "
            "--scorer (e.g. --scorer default:onnx-int8; scorer = ... in a config file), or a scorer of the "
            "policy's own (--policy-arg scorer=noisy-oracle --policy-arg tau=0.8)",
        )
        _check(self.max_queue_len >= 1, f"max_queue_len must be >= 1, got {self.max_queue_len}")
        _check(
            self.max_queue_per_tenant >= 0,
            f"max_queue_per_tenant must be >= 0, got {self.max_queue_per_tenant}",
        )
        _check(
            self.queue_ttl_s > 0 and not math.isnan(self.queue_ttl_s),
            f"queue_ttl_s must be > 0, got {self.queue_ttl_s}",
        )
        _check(self.max_body_bytes >= 64, f"max_body_bytes must be >= 64, got {self.max_body_bytes}")
        _check(self.default_max_tokens >= 0, f"default_max_tokens must be >= 0, got {self.default_max_tokens}")
        _check(
            self.assumed_output_tokens >= 1,
            f"assumed_output_tokens must be >= 1, got {self.assumed_output_tokens}",
        )
        _check(self.max_tokens_limit >= 0, f"max_tokens_limit must be >= 0, got {self.max_tokens_limit}")
        _check(self.retry_after_s >= 0, f"retry_after_s must be >= 0, got {self.retry_after_s}")
        _check(self.max_attempts >= 1, f"max_attempts must be >= 1, got {self.max_attempts}")
        _check(
            self.drain_timeout_s >= 0 and math.isfinite(self.drain_timeout_s),
            f"drain_timeout_s must be >= 0 and finite, got {self.drain_timeout_s}",
        )
        for name in ("connect_timeout_s", "read_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            _check(value > 0 and math.isfinite(value), f"{name} must be > 0 and finite, got {value}")
        _check(
            self.headers_timeout_s >= 0 and math.isfinite(self.headers_timeout_s),
            f"headers_timeout_s must be >= 0, got {self.headers_timeout_s}",
        )
        _check(
            self.redis_lease_s > 0 and math.isfinite(self.redis_lease_s),
            f"redis_lease_s must be > 0, got {self.redis_lease_s}",
        )
        _check(
            self.redis_retry_s >= 0 and math.isfinite(self.redis_retry_s),
            f"redis_retry_s must be >= 0, got {self.redis_retry_s}",
        )
        for name in ("client_header_timeout_s", "client_send_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            _check(value > 0 and math.isfinite(value), f"{name} must be > 0 and finite, got {value}")
        _check(self.max_connections >= 0, f"max_connections must be >= 0, got {self.max_connections}")
        object.__setattr__(self, "forwarded_allow_ips", split_list(self.forwarded_allow_ips))
        for ip in self.forwarded_allow_ips:
            try:
                if ip != "*":
                    ipaddress.ip_network(ip, strict=False)
            except ValueError:
                raise ConfigError(
                    f"forwarded_allow_ips must list IP addresses, networks (10.0.0.0/8) or '*', got {ip!r}"
                ) from None
        allowed = split_list(self.passthrough) or ("none",)
        if allowed not in (("all",), ("none",)):
            for path in allowed:
                _check(
                    path.startswith("/v1/") and all(s not in ("", ".", "..") for s in path.rstrip("/").split("/")[1:]),
                    f"passthrough must be 'all', 'none' or paths under /v1 (/v1/embeddings, /v1/audio), got {path!r}",
                )
            allowed = tuple(path.rstrip("/") for path in allowed)
        object.__setattr__(self, "passthrough", allowed)
        check_min_priority(self.min_priority, "min_priority")
        get_router_class(self.router)  # UnknownRouterError (a ValueError) names valid ones
        _check(isinstance(self.router_args, Mapping), "router_args must be a table")
        try:  # its settings, checked by the router itself
            make_router(self.router, **dict(self.router_args))
        except ValueError as exc:
            raise ConfigError(f"router_args: {exc}") from None
        _check(
            not self.redis_url or (self.router == DEFAULT_ROUTER and not self.router_args),
            f"router {self.router!r} (and router_args) applies without redis_url only: with Redis the replicas' "
            "shared dispatcher picks the least-loaded backend with room",
        )
        admin = self.admin_api_key_sha256
        if isinstance(admin, str):
            admin = (admin,)
        _check(
            isinstance(admin, tuple | list) and all(isinstance(h, str) for h in admin),
            "admin_api_key_sha256 must be a list of hex strings",
        )
        admin = tuple(h.lower() for h in admin)
        for h in admin:
            _check(
                len(h) == 64 and all(c in "0123456789abcdef" for c in h),
                f"admin_api_key_sha256 entries must be 64 hex digits, got one of length {len(h)}",
            )
        object.__setattr__(self, "admin_api_key_sha256", admin)
        _check(self.backend_down_s >= 0, f"backend_down_s must be >= 0, got {self.backend_down_s}")
        _check(
            not self.redis_url or self.redis_url.startswith(("redis://", "rediss://", "unix://")),
            f"redis_url must start with redis://, rediss:// or unix://, got {self.redis_url!r}",
        )
        predictor = predictor_spec(self.scorer) if self.scorer else None
        if self.scorer and predictor is None and ":" not in self.scorer:
            raise ConfigError(
                "scorer must be 'default', a predictor checkpoint directory or 'module:callable', "
                f"got {self.scorer!r}{not_a_spec_hint(self.scorer)}"
            )
        _check(
            not self.tokenizer or bool(self.scorer),
            f"tokenizer decodes prompts of token ids for the scorer, and no scorer is set (tokenizer "
            f"{self.tokenizer!r}): give scorer too, or no tokenizer",
        )
        _check(
            self.scorer_threads is None or self.scorer_threads >= 1,
            f"scorer_threads must be >= 1, got {self.scorer_threads}",
        )
        _check(
            self.scorer_max_length is None or self.scorer_max_length >= MIN_SCORING_LENGTH,
            f"scorer_max_length must be >= {MIN_SCORING_LENGTH} tokens, got {self.scorer_max_length}",
        )
        tuned = self.scorer_threads is not None or self.scorer_max_length is not None
        _check(
            not tuned or predictor is not None,
            f"scorer_threads and scorer_max_length apply only to a trained predictor ('default' or a checkpoint "
            f"directory), got scorer {self.scorer!r}",
        )
        _check(
            not self.online_learning or (predictor is not None and not self.scorer_process),
            "online_learning refits on the features of the scorer's predictor, in this process: it needs scorer "
            f"'default' (or 'default:onnx-int8') and scorer_process off, got scorer {self.scorer!r}"
            f"{' with scorer_process' if self.scorer_process else ''}",
        )
        _check(
            not self.online_state or (self.online_learning and not self.redis_url),
            "online_state is the file online learning saves its windows to: it needs online_learning on and no "
            "redis_url (Redis keeps them)",
        )
        _check(self.scorer_batch_size >= 1, f"scorer_batch_size must be >= 1, got {self.scorer_batch_size}")
        _check(self.scorer_hold_s >= 0, f"scorer_hold_s must be >= 0, got {self.scorer_hold_s}")
        _check(
            self.api_keys in ("auto", "required", "off"),
            f"api_keys must be auto, required or off, got {self.api_keys!r}",
        )
        _check(
            not self.auth_enabled or bool(self.redis_url) or any(t.api_key_sha256 for t in self.tenants),
            f"api_keys = {self.api_keys!r} requires a key, but no tenant has an api_key_sha256 and there is no "
            "redis_url to look keys up in: every request would get 401 (add [[tenants]] with api_key_sha256, "
            "set redis_url, or api_keys = 'off')",
        )
        names = [t.name for t in self.tenants]
        _check(len(set(names)) == len(names), f"tenant names must be unique, got {names}")
        seen: set[str] = set()
        for t in self.tenants:
            for h in t.api_key_sha256:
                _check(h not in seen, f"an API key hash is listed twice (tenant {t.name!r})")
                seen.add(h)

    @property
    def auth_enabled(self) -> bool:
        if self.api_keys == "auto":
            return bool(self.tenants)
        return self.api_keys == "required"
