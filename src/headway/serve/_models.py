"""Which models each backend serves, read from its ``/v1/models``, to warn of a fleet that differs.

The gateway sends a request to any backend with room, whatever its ``model``: a fleet where one
backend serves another model (another ``--served-model-name``) answers that backend's share of the
requests with its 404. The gateway's ``/metrics`` poller reads each backend's model ids when it
first answers (and again when it comes back) and logs a warning naming every backend's models
while they differ (a backend not polled, ``max_concurrency`` alone, is not read).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from headway.serve._dispatch import Backend
from headway.serve._passthrough import backend_headers

__all__ = ["check_models", "models_differ", "read_models"]

log = logging.getLogger("headway.serve")


async def read_models(client: httpx.AsyncClient, backend: Backend) -> tuple[str, ...] | None:
    """The model ids ``backend`` lists (sorted), or None when it does not answer with a list."""
    try:
        r = await client.get(backend.url + "/v1/models", timeout=5.0, headers=backend_headers(backend.config.api_key))
        r.raise_for_status()
        data = r.json()["data"]
        return tuple(sorted(str(m["id"]) for m in data))
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def models_differ(backends: Sequence[Backend]) -> str | None:
    """A warning naming each backend's models when the backends that listed theirs differ."""
    known = [(b.url, b.models) for b in backends if b.models is not None]
    if len({models for _, models in known}) <= 1:
        return None
    served = "; ".join(f"{url}: {', '.join(models) or 'none'}" for url, models in known if models is not None)
    return (
        f"the backends serve different models ({served}); the gateway sends a request to any backend, "
        "so one sent where its model is not served gets that backend's 404: give every backend the same "
        "models (vLLM's --served-model-name), or run one gateway per model"
    )


async def check_models(client: httpx.AsyncClient, backend: Backend, backends: Sequence[Backend]) -> None:
    """Read ``backend``'s models; warn when the fleet's now differ (once per change)."""
    models = await read_models(client, backend)
    if models is None or backend.models == models:
        return
    backend.models = models
    warning = models_differ(backends)
    if warning is not None:
        log.warning("%s", warning)
