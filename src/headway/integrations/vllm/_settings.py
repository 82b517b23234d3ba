"""The plugin's settings: ``--additional-config``'s ``headway`` section, the control file, and
:func:`check_settings` (``headway plugin-check``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from headway.core import Policy, Request, check_key, make_policy
from headway.integrations.vllm._errors import PluginConfigError
from headway.integrations.vllm._scorers import load_online_learner, load_text_scorer
from headway.policies import ScoredPolicy
from headway.predict._resolve import predictor_spec

__all__ = [
    "ENV_CONFIG",
    "REQUEST_HINTS",
    "SCORING",
    "PluginConfig",
    "check_score_source",
    "check_settings",
    "control_settings",
    "make_plugin_policy",
    "plugin_displacement",
    "read_control_file",
]

_CONTROL_KEYS = ("missing_score", "oracle", "policy", "policy_args", "scorer")
"""Settings a ``control_file`` may switch while the engine runs."""

REQUEST_HINTS = ("score", "tenant", "tier", "category")
"""What a request may say of itself in ``vllm_xargs`` (``headway_score``, ``headway_tenant``, ...),
all read by default (``request_hints``). Every client of the vLLM server can send them: an operator
whose clients reach vLLM directly lists only what they may choose (``[]``: none; a score then comes
from the ``scorer``, a tenant and tier are ``default``/``standard``), since a ``headway_score`` of
``-1e30`` runs first under ``pars`` and a ``headway_tier`` of ``premium`` first under DriftSched."""
SCORING = ("background", "inline")
"""Where the ``scorer`` runs: on a thread of its own (a request waits, unscheduled, until its score
is in; the engine's steps go on meanwhile), or on the engine's thread as each step starts (every
request arriving before a step is scored in it, and the step waits for the whole batch)."""
ENV_CONFIG = "HEADWAY_VLLM_CONFIG"
"""Environment variable read when ``--additional-config`` has no ``headway`` section."""


@dataclass(frozen=True)
class PluginConfig:
    """The plugin's settings (see the module docstring for each key)."""

    policy: str = "fcfs"
    policy_args: dict[str, Any] = field(default_factory=dict)
    oracle: str = "none"
    scorer: str | None = None
    scorer_backend: str = "torch"
    scorer_threads: int = 1
    scoring: str = "background"
    tokenizer: str | None = None
    missing_score: float | None = None
    step_log: str | None = None
    control_file: str | None = None
    check_version: bool = True
    online_learning: bool = False
    online_state: str | None = None
    request_hints: list[str] = field(default_factory=lambda: list(REQUEST_HINTS))

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
        if self.scoring not in SCORING:
            raise PluginConfigError(
                f"headway plugin: scoring must be one of {', '.join(SCORING)}, got {self.scoring!r:.80}"
            )
        threads = self.scorer_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise PluginConfigError(f"headway plugin: scorer_threads must be an integer >= 1, got {threads!r}")
        for name in ("scorer", "tokenizer", "step_log", "control_file", "online_state"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise PluginConfigError(f"headway plugin: {name} must be a non-empty string or null, got {value!r}")
        if not isinstance(self.check_version, bool):
            raise PluginConfigError(f"headway plugin: check_version must be true or false, got {self.check_version!r}")
        if not isinstance(self.online_learning, bool):
            raise PluginConfigError(
                f"headway plugin: online_learning must be true or false, got {self.online_learning!r}"
            )
        if self.online_learning and (self.scorer is None or predictor_spec(self.scorer) is None):
            raise PluginConfigError(
                "headway plugin: online_learning refits the scorer's predictor: it needs scorer 'default' "
                f"(or 'default:onnx-int8'), got {self.scorer!r}"
            )
        if self.online_state is not None and not self.online_learning:
            raise PluginConfigError(
                "headway plugin: online_state is the file online learning saves its state to: it needs "
                "online_learning true"
            )
        hints = self.request_hints
        if not isinstance(hints, list) or any(h not in REQUEST_HINTS for h in hints):
            raise PluginConfigError(
                f"headway plugin: request_hints must be a list of {', '.join(map(repr, REQUEST_HINTS))} (the "
                f"vllm_xargs headway_<name> a request may set), got {hints!r:.80}"
            )
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
        (JSON text, or the path of a JSON file: the settings, or ``{"headway": {...}}`` as given to
        ``--additional-config``), else the defaults (FCFS)."""
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
        data = _json_of(raw, f"${ENV_CONFIG}")
        if isinstance(data, Mapping) and set(data) == {"headway"}:  # --additional-config's shape, section and all
            data = data["headway"]
        return cls.from_mapping(data)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _json_of(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PluginConfigError(f"{where}: not valid JSON ({exc})") from None


def make_plugin_policy(name: str, args: Mapping[str, Any]) -> Policy:
    """The ``policy`` setting's policy with its ``policy_args``; a bad name or argument is a
    :class:`PluginConfigError` naming it."""
    try:
        return make_policy(name, **dict(args))
    except (ValueError, TypeError) as exc:
        raise PluginConfigError(f"headway plugin: {exc}") from None


def _declared(policy: Policy) -> str:
    return str(getattr(policy, "displacement", "none")) if policy.preemptive else "none"


def plugin_displacement(policy: Policy) -> str:
    """The mode in which ``policy`` displaces running requests inside vLLM: its declared
    ``displacement`` (``none``: vLLM's decisions; ``evict``: SGLang's retract). ``pause``
    (vllm-ltr's: the displaced request keeps its KV) cannot be held by vLLM's model runner, which
    keeps at most ``max_num_seqs`` requests: such a policy runs as ``none``."""
    mode = _declared(policy)
    return "none" if mode == "pause" else mode


def _check_oracle(policy: Policy, oracle: str) -> None:
    if policy.oracle and oracle != "max_tokens":
        raise PluginConfigError(
            f"policy {policy.name!r} is an oracle (it reads true output lengths); set "
            "oracle='max_tokens' to use each request's max_tokens as its true length "
            "(benchmark-only: true only when clients set ignore_eos)"
        )


def _try_policy(policy: Policy) -> None:
    """Run ``policy``'s ``on_arrival`` and ``key`` on one made-up request, as the scheduler will
    on the first one: a policy of the user's that raises, or whose key is no tuple of numbers,
    fails here and not in vLLM's engine core after the model loaded."""
    # scored, as the scheduler scores every request (its scorer, headway_score or missing_score)
    request = Request("plugin-check", 0.0, 16, 16, prompt="How are you?", score=0.0, seq=0)
    if policy.oracle:
        policy.bind_oracle(lambda r: r.max_tokens)  # oracle='max_tokens', as the scheduler binds it
    try:
        policy.on_arrival(request, 0.0)
        key = policy.key(request, 0.0)
    except Exception as exc:
        raise PluginConfigError(
            f"headway plugin: policy {policy.name!r} failed on a test request: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        check_key(policy, key)
    except ValueError as exc:
        raise PluginConfigError(f"headway plugin: {exc}") from None


def _check_chunked_prefill(policy: Policy, enabled: bool) -> None:
    if policy.requires_chunked_prefill and not enabled:
        raise PluginConfigError(f"headway plugin: policy {policy.name!r} needs chunked prefill, which is off")


def check_settings(cfg: PluginConfig, *, chunked_prefill: bool | None = None) -> list[str]:
    """Check ``cfg`` as the scheduler would at startup, without vLLM or a model: make the
    policy (name, arguments, the oracle setting, chunked prefill when ``chunked_prefill`` is
    known) and key one made-up request with it, load the scorer and score one prompt, and check
    that the step log can be written and that an existing control file is valid. Raises
    :class:`PluginConfigError` naming the first problem; returns what was checked, one line each
    (``headway plugin-check``).

    vLLM builds the scheduler only after loading the model, so a bad setting surfaces there
    minutes into a launch; this runs in a second beforehand."""
    done: list[str] = []
    policy = make_plugin_policy(cfg.policy, cfg.policy_args)
    _check_oracle(policy, cfg.oracle)
    _try_policy(make_plugin_policy(cfg.policy, cfg.policy_args))  # an instance of its own: it may learn
    args = json.dumps(cfg.policy_args) if cfg.policy_args else "default settings"
    done.append(f"policy {policy.name!r} ({args}); oracle={cfg.oracle}")
    if policy.preemptive:
        mode = plugin_displacement(policy)
        note = "" if mode == _declared(policy) else f" (declared {_declared(policy)!r}: not available inside vLLM)"
        done.append(f"displacement: {mode}{note}")
    if chunked_prefill is not None:
        _check_chunked_prefill(policy, chunked_prefill)
        done.append(f"chunked prefill {'on' if chunked_prefill else 'off'}: fits the policy")
    if cfg.scorer is not None:
        t0 = time.perf_counter()
        if cfg.online_learning:
            learner = load_online_learner(
                cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads, state=cfg.online_state
            )
            learner.close(save=False)  # a check writes nothing
            done.append(f"online_learning: scorer {cfg.scorer!r} has the features a learner refits on")
            if cfg.online_state is not None:
                held = ", ".join(f"{m}: {n}" for m, n in learner.observed_by_model().items())
                saved = "saved within a second of each finished request, and at shutdown"
                what = f"resumes {held} observations" if held else "starts empty"
                done.append(f"online_state {cfg.online_state}: {what}; {saved}")
        fn = load_text_scorer(cfg.scorer, backend=cfg.scorer_backend, threads=cfg.scorer_threads)
        try:
            scores = [float(x) for x in fn(["How do I check the settings before a launch?"])]
        except Exception as exc:  # a user's scorer may raise anything: report it as the settings' error
            raise PluginConfigError(f"headway plugin: scorer {cfg.scorer!r} failed on a test prompt: {exc}") from exc
        if len(scores) != 1 or not math.isfinite(scores[0]):
            raise PluginConfigError(
                f"headway plugin: scorer {cfg.scorer!r} returned {scores!r:.80} for one prompt (want one finite score)"
            )
        done.append(
            f"scorer {cfg.scorer!r}: loaded and scored a test prompt in {time.perf_counter() - t0:.1f} s; it will "
            + ("run on a thread of its own" if cfg.scoring == "background" else "run on the engine's thread")
        )
    elif isinstance(policy, ScoredPolicy) and policy.scorer is None:
        check_score_source(cfg, policy.name)
        done.append(
            f"note: policy {policy.name!r} ranks by scores and no scorer is set: requests need vllm_xargs "
            "headway_score; those without one get missing_score (default: the mean of the scores so far, 0 "
            "before any)"
        )
    if cfg.step_log is not None:
        _check_writable(Path(cfg.step_log).expanduser().absolute(), cfg.step_log)
        done.append(f"step_log {cfg.step_log!r}: writable")
    if cfg.control_file is not None:
        done.append(_check_control_file(cfg, cfg.control_file))
    return done


def check_score_source(cfg: PluginConfig, policy: str) -> None:
    """For a score-ranked ``policy`` without a scorer: :class:`PluginConfigError` when ``request_hints``
    leaves out ``score`` too (every request would get ``missing_score``)."""
    if "score" not in cfg.request_hints:
        raise PluginConfigError(
            f"headway plugin: policy {policy!r} ranks by scores, no scorer is set and request_hints leaves "
            "out 'score': every request would get missing_score (set a scorer, or let requests send headway_score)"
        )


def _check_writable(path: Path, given: str) -> None:
    """Open ``path`` for appending as the scheduler will (its missing folders made first), then take
    back what the check made: a permission bit says nothing on a file system that refuses anyway
    (``/proc``, a read-only mount, root's ``os.access``)."""
    made = [p for p in reversed(path.parents) if not p.exists()]  # the folders the check makes, top first
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise PluginConfigError(
            f"headway plugin: step_log {given!r}: cannot be written ({exc.strerror or exc})"
        ) from None
    finally:
        if not existed and path.is_file():
            path.unlink()
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def read_control_file(path: str) -> str:
    """The control file's text. Refused (``PermissionError``) when a user other than the engine's
    (or root) owns it, or its mode lets group or others write it: whoever writes it switches the
    engine's policy and its ``scorer``, which imports a module or loads a checkpoint in the engine's
    process (a file planted in a shared folder such as ``/tmp`` before the operator writes one,
    or through a symlink there, would do the same). ``~`` is expanded, as ``headway plugin-check``
    reads it."""
    with open(Path(path).expanduser(), "rb") as f:  # (the file read is the file checked)
        st = os.fstat(f.fileno())
        euid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
        if st.st_uid not in (euid, 0) or st.st_mode & 0o022:
            who = "another user" if st.st_uid not in (euid, 0) else "group or others"
            raise PermissionError(
                f"writable by {who} (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}): not read, since it "
                "switches the engine's policy and scorer (chmod go-w, owned by the engine's user or root)"
            )
        return f.read().decode()


def _check_control_file(cfg: PluginConfig, path: str) -> str:
    try:
        text = read_control_file(path)
    except FileNotFoundError:
        return f"control_file {path!r}: not there yet (read when it appears)"
    except OSError as exc:
        raise PluginConfigError(f"headway plugin: control_file {path!r}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise PluginConfigError(f"headway plugin: control_file {path!r}: not UTF-8 text ({exc.reason})") from None
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
