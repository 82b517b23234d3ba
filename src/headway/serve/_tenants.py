"""API keys -> (tenant, tier). Keys are only ever held as SHA-256 hex digests."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from headway.core import Tier
from headway.serve._config import GatewayConfig, check_min_priority, check_tenant_name, hash_api_key

__all__ = ["REDIS_APIKEYS_HASH", "DirectoryUnavailable", "Identity", "TenantDirectory"]

log = logging.getLogger("headway.serve")

REDIS_APIKEYS_HASH = "headway:apikeys"
"""Redis hash: field = SHA-256 hex of an API key, value = ``{"tenant": ..., "tier": ...}``, optionally
with ``"min_priority"`` (as a tenant's in the config)."""


class DirectoryUnavailable(Exception):
    """A key not in the config could not be looked up: Redis did not answer."""


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    tier: Tier
    min_priority: int | None = None
    """The most urgent ``priority`` the caller may ask for (None: any): its tenant's, else the gateway's."""


ANONYMOUS = Identity("default", Tier.STANDARD)
"""The caller with API keys off (and no gateway ``min_priority``)."""


class TenantDirectory:
    """Resolve a bearer token to an :class:`Identity` (config first, then Redis)."""

    def __init__(
        self, config: GatewayConfig, redis: Any = None, cache_ttl_s: float = 10.0, lookup_timeout_s: float = 2.0
    ) -> None:
        self.enabled = config.auth_enabled
        self._min_priority = config.min_priority
        self._anonymous = Identity(ANONYMOUS.tenant, ANONYMOUS.tier, config.min_priority)
        self._static: dict[str, Identity] = {
            h: Identity(t.name, t.tier, config.min_priority if t.min_priority is None else t.min_priority)
            for t in config.tenants
            for h in t.api_key_sha256
        }
        self._redis = redis
        self._cache: dict[str, tuple[float, Identity | None]] = {}
        self._cache_ttl_s = cache_ttl_s
        self._lookup_timeout_s = lookup_timeout_s

    @staticmethod
    def bearer(authorization: str | None) -> str | None:
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def _parse_record(self, raw: Any, digest: str) -> Identity | None:
        """The identity in a Redis API-key record, or None (a 401) for a malformed one: the
        warning names the record by the first 12 hex digits of its key's hash, never the key."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError(f"expected an object, got {type(data).__name__}")
            tenant = data.get("tenant")
            check_tenant_name(tenant, "'tenant'")  # a ConfigError: a ValueError
            assert isinstance(tenant, str)
            floor = data.get("min_priority")
            check_min_priority(floor, "'min_priority'")  # a ConfigError: a ValueError
            return Identity(tenant, Tier.parse(data.get("tier", "standard")),
                            self._min_priority if floor is None else floor)  # fmt: skip
        except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError and UnicodeError are ValueErrors
            log.warning("malformed API-key record %s in Redis hash %s (%s): answered 401",
                        digest[:12], REDIS_APIKEYS_HASH, exc)  # fmt: skip
            return None

    async def resolve(self, authorization: str | None) -> Identity | None:
        """The caller's identity, tenant ``default`` with auth off, None if not valid.

        A key not in the config is looked up in Redis (answers cached ``cache_ttl_s``); while
        Redis does not answer within ``lookup_timeout_s``, the last answer for that key holds,
        and a key never seen raises :class:`DirectoryUnavailable`."""
        if not self.enabled:
            return self._anonymous
        token = self.bearer(authorization)
        if token is None:
            return None
        digest = hash_api_key(token)
        ident = self._static.get(digest)
        if ident is not None or self._redis is None:
            return ident
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            async with asyncio.timeout(self._lookup_timeout_s):
                raw = await self._redis.hget(REDIS_APIKEYS_HASH, digest)
        except Exception as exc:  # Redis down or stalled: what it said last still holds
            if hit is not None:
                return hit[1]
            raise DirectoryUnavailable(f"API-key lookup failed: {type(exc).__name__}: {exc}") from None
        ident = None if raw is None else self._parse_record(raw, digest)
        if len(self._cache) > 10_000:  # refused keys go first: anyone may send those, and a known key's
            # last answer is what serves it while Redis is down
            self._cache = {d: hit for d, hit in self._cache.items() if hit[1] is not None}
            if len(self._cache) > 10_000:
                self._cache.clear()
        self._cache[digest] = (now + self._cache_ttl_s, ident)
        return ident
