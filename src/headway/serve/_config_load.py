"""Reading a gateway configuration: a TOML or JSON file (the format is in :mod:`headway.serve._config`),
``HEADWAY_*`` environment variables and keyword overrides, each later one winning; and the effective
configuration described for the startup line, secrets hidden."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from headway.core import Tier
from headway.serve._config import (
    BackendConfig,
    ConfigError,
    GatewayConfig,
    TenantConfig,
    _check,
    redact_url,
    split_list,
)

__all__ = ["ENV_PREFIX", "config_from_dict", "config_from_env", "describe_config", "load_config"]

_GATEWAY_FIELDS = set(GatewayConfig.__dataclass_fields__)
_BACKEND_FIELDS = set(BackendConfig.__dataclass_fields__)
_TENANT_FIELDS = set(TenantConfig.__dataclass_fields__)


def _only(kind: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    _check(not unknown, f"unknown {kind} setting(s) {unknown}; valid: {sorted(allowed)}")


def _types(kind: str, cls: type, data: Mapping[str, Any]) -> None:
    """Each value has its field's type (a file can hold anything): ConfigError naming it."""
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    for name, value in data.items():
        ann = str(fields[name].type)
        if ann.endswith(" | None"):  # optional: None means the default
            if value is None:
                continue
            ann = ann.removesuffix(" | None")
        if ann == "bool":
            ok, want = isinstance(value, bool), "true or false"
        elif ann == "int":
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif ann == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            want = "a finite number"
        elif ann in ("str", "Tier"):
            ok, want = isinstance(value, str) or (ann == "Tier" and isinstance(value, Tier)), "a string"
        elif ann.startswith("Mapping"):
            ok, want = isinstance(value, Mapping) and all(isinstance(k, str) for k in value), "a table"
        elif ann.startswith("tuple[str"):
            ok = isinstance(value, str) or (isinstance(value, list | tuple) and all(isinstance(v, str) for v in value))
            want = "a list of strings"
        elif ann.startswith("tuple"):
            ok, want = isinstance(value, list | tuple), "a list"
        else:
            continue
        _check(ok, f"{kind} setting {name!r} must be {want}, got {type(value).__name__} {value!r:.60}")


def config_from_dict(data: Mapping[str, Any], **overrides: Any) -> GatewayConfig:
    """Build a :class:`GatewayConfig` from parsed TOML/JSON plus keyword overrides."""
    merged: dict[str, Any] = dict(data)
    merged.update({k: v for k, v in overrides.items() if v is not None})
    _only("gateway", merged, _GATEWAY_FIELDS)
    raw_backends = merged.pop("backends", ())
    raw_tenants = merged.pop("tenants", ())
    _check(isinstance(raw_backends, list | tuple), f"backends must be a list, got {raw_backends!r:.60}")
    _check(isinstance(raw_tenants, list | tuple), f"tenants must be a list, got {raw_tenants!r:.60}")
    _types("gateway", GatewayConfig, merged)
    if isinstance(merged.get("admin_api_key_sha256"), str | list):
        admin = merged["admin_api_key_sha256"]
        merged["admin_api_key_sha256"] = (admin,) if isinstance(admin, str) else tuple(admin)
    backends: list[BackendConfig] = []
    for b in raw_backends:
        if isinstance(b, BackendConfig):
            backends.append(b)
            continue
        if isinstance(b, str):
            b = {"url": b}
        _check(isinstance(b, Mapping), f"backends entries must be tables or URLs, got {b!r:.60}")
        _only("backend", b, _BACKEND_FIELDS)
        _types("backend", BackendConfig, b)
        _check("url" in b, "backends entries need a 'url'")
        backends.append(BackendConfig(**b))
    tenants: list[TenantConfig] = []
    for t in raw_tenants:
        if isinstance(t, TenantConfig):
            tenants.append(t)
            continue
        _check(isinstance(t, Mapping), f"tenants entries must be tables, got {t!r:.60}")
        _only("tenant", t, _TENANT_FIELDS)
        _types("tenant", TenantConfig, t)
        _check("name" in t, "tenants entries need a 'name'")
        t = dict(t)
        keys = t.get("api_key_sha256", ())
        t["api_key_sha256"] = (keys,) if isinstance(keys, str) else tuple(keys)
        tenants.append(TenantConfig(**t))
    try:
        return GatewayConfig(backends=tuple(backends), tenants=tuple(tenants), **merged)
    except TypeError as exc:
        raise ConfigError(f"bad gateway config: {exc}") from None


ENV_PREFIX = "HEADWAY_"
"""Environment variables ``HEADWAY_<SETTING>`` (upper case) set any top-level setting."""


def _env_value(name: str, raw: str) -> Any:
    """An environment variable's text as the value of setting ``name`` (by the field's type)."""
    ann = str(GatewayConfig.__dataclass_fields__[name].type).removesuffix(" | None")
    try:
        if ann == "int":
            return int(raw)
        if ann == "float":
            return float(raw)
        if ann == "bool":
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return low in ("1", "true", "yes", "on")
        if ann.startswith("tuple[str") and not raw.lstrip().startswith("["):
            return list(split_list(raw))  # a list of strings: also "a,b"
        if ann.startswith(("Mapping", "tuple")):
            return json.loads(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {ann} for setting {name!r}") from None
    return raw


def config_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as environment variables: ``HEADWAY_<SETTING>`` for each top-level
    setting (``HEADWAY_POLICY=pars``, ``HEADWAY_MAX_QUEUE_LEN=500``; tables and lists as JSON,
    ``HEADWAY_POLICY_ARGS='{"tau": 0.8}'``; a list of strings also as ``a,b``), ``HEADWAY_BACKENDS``
    (URLs separated by commas, or a JSON list of backend tables), ``HEADWAY_TENANTS`` (a JSON list of
    tenant tables) and ``HEADWAY_BACKEND_API_KEY`` (the ``api_key`` of backends given as bare URLs,
    here or with ``--backend``). Other ``HEADWAY_*`` variables are not settings and are ignored."""
    out: dict[str, Any] = {}
    for name in sorted(_GATEWAY_FIELDS - {"backends", "tenants"}):
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            out[name] = _env_value(name, raw)
    raw = env.get(ENV_PREFIX + "TENANTS")
    if raw is not None:  # never ignored: tenants turn API keys on (api_keys = "auto")
        try:
            out["tenants"] = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{ENV_PREFIX}TENANTS is not a valid JSON list of tenant tables: {exc}") from None
    raw = env.get(ENV_PREFIX + "BACKENDS")
    if raw:
        if raw.lstrip().startswith("["):
            try:
                out["backends"] = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PREFIX}BACKENDS is not a valid JSON list: {exc}") from None
        else:
            out["backends"] = list(split_list(raw))
    return out


def describe_config(config: GatewayConfig) -> dict[str, Any]:
    """The effective configuration as a JSON-safe dict, for the startup line: every setting, with
    secrets shown only as whether they are set (API keys, a password in ``redis_url``)."""
    out: dict[str, Any] = {}
    for name in GatewayConfig.__dataclass_fields__:
        value = getattr(config, name)
        if name == "backends":
            value = [
                {
                    "url": redact_url(b.url),
                    "api_key": "set" if b.api_key else "",
                    "admission": (f"max_concurrency={b.max_concurrency} " if b.max_concurrency else "")
                    + (f"metrics every {b.metrics_poll_s:g}s" if b.metrics_poll_s else "")
                    or "none",
                    "max_waiting": b.max_waiting,
                    "max_kv_usage": b.max_kv_usage,
                }
                for b in value
            ]
        elif name == "tenants":
            value = [
                {"name": t.name, "tier": t.tier.name.lower(), "api_keys": len(t.api_key_sha256)}
                | ({} if t.min_priority is None else {"min_priority": t.min_priority})
                for t in value
            ]
        elif name == "admin_api_key_sha256":
            value = len(value)
        elif name == "redis_url" and value:
            value = redact_url(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        out[name] = value
    return out


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None, **overrides: Any) -> GatewayConfig:
    """Read a ``.toml`` or ``.json`` config file (or none), then ``HEADWAY_*`` settings from
    ``env`` (when given, e.g. ``os.environ``), then CLI overrides: each later one wins."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
        try:
            data = json.loads(raw) if p.suffix == ".json" else tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"config file {p} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {exc}"
            ) from None
        _check(isinstance(data, dict), f"config file {p} must hold a table/object at the top level")
    if env is not None:
        data.update(config_from_env(env))
    extra_backends: Sequence[Any] = overrides.pop("backends", None) or ()
    if extra_backends:
        data["backends"] = list(extra_backends)
    backend_key = env.get(ENV_PREFIX + "BACKEND_API_KEY") if env is not None else None
    if backend_key:
        data["backends"] = [
            {"url": b, "api_key": backend_key} if isinstance(b, str) else b for b in data.get("backends", ())
        ]
    return config_from_dict(data, **overrides)
