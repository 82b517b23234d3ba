"""Which models each backend serves, read from its ``/v1/models``: requests go where their model is.

The gateway's ``/metrics`` poller reads each backend's model ids when it first answers (and again
when it comes back); a backend not polled (``max_concurrency`` alone) has its models read the same
way by :func:`watch_models`, and until a backend's models are read any request may go there. A
request naming a model that some backend lists goes only to backends that list it or whose models
are not known (:meth:`~headway.serve._dispatch.Dispatcher.not_serving`); one naming a model no
backend lists goes to any backend, which answers it (vLLM: its 404).
The gateway's ``/v1/models`` is every backend's models, each once. When the fleet's models differ,
the poller logs which backend serves which.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from headway.serve._dispatch import Backend
from headway.serve._passthrough import backend_headers

__all__ = ["check_models", "merged_model_list", "model_entries", "models_differ", "read_models", "watch_models"]

log = logging.getLogger("headway.serve")

MODELS_RETRY_S = (1.0, 10.0)
"""Seconds between reads of an unpolled backend's ``/v1/models`` until it lists them
(:func:`watch_models`): the first pause, doubled after each failed read up to the second."""


async def model_entries(client: httpx.AsyncClient, backend: Backend) -> list[dict[str, Any]] | str:
    """The entries of ``backend``'s ``/v1/models`` (each with a string ``id``), or why there are none."""
    try:
        r = await client.get(backend.url + "/v1/models", timeout=5.0, headers=backend_headers(backend.config.api_key))
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if r.status_code != 200:
        return f"HTTP {r.status_code}"
    try:
        data = r.json()["data"]
        if not all(isinstance(m["id"], str) for m in data):
            raise TypeError
        return list(data)
    except (ValueError, KeyError, TypeError):
        return "not a model list"


async def read_models(client: httpx.AsyncClient, backend: Backend) -> tuple[str, ...] | None:
    """The model ids ``backend`` lists (sorted), or None when it does not answer with a list."""
    entries = await model_entries(client, backend)
    return None if isinstance(entries, str) else tuple(sorted(m["id"] for m in entries))


async def merged_model_list(client: httpx.AsyncClient, backends: Sequence[Backend]) -> bytes | str:
    """The gateway's ``/v1/models``: every backend's models, each once (as the first backend listing it
    gave it), in backend order; or why no backend listed any (the last backend's reason)."""
    answers = await asyncio.gather(*(model_entries(client, b) for b in backends))
    entries: dict[str, dict[str, Any]] = {}
    for answer in answers:
        if not isinstance(answer, str):
            for m in answer:
                entries.setdefault(m["id"], m)
    if not entries and not any(isinstance(a, list) for a in answers):
        return next((a for a in reversed(answers) if isinstance(a, str)), "no backend")
    return json.dumps({"object": "list", "data": list(entries.values())}).encode()


def models_differ(backends: Sequence[Backend]) -> str | None:
    """A line naming each backend's models when the backends that listed theirs differ."""
    known = [(b.label, b.models) for b in backends if b.models is not None]
    if len({models for _, models in known}) <= 1:
        return None
    served = "; ".join(f"{url}: {', '.join(models) or 'none'}" for url, models in known if models is not None)
    unread = [b.label for b in backends if b.models is None]
    also = f"; not read (any request may go there): {', '.join(unread)}" if unread else ""
    return f"the backends serve different models ({served}{also}): each request goes to one that lists its model"


async def check_models(client: httpx.AsyncClient, backend: Backend, backends: Sequence[Backend]) -> bool:
    """Read ``backend``'s models; log the fleet's models when they now differ (once per change).
    Whether it listed them."""
    models = await read_models(client, backend)
    if models is None:
        return False
    if backend.models == models:
        return True
    backend.models = models
    line = models_differ(backends)
    if line is not None:
        log.info("%s", line)
    return True


async def watch_models(client: httpx.AsyncClient, backend: Backend, backends: Sequence[Backend]) -> None:
    """For a backend not polled for its ``/metrics`` (``max_concurrency`` alone): read its models
    all the same, at the start (retried, :data:`MODELS_RETRY_S`, until it lists them) and again while
    a request could not connect there (:attr:`Backend.reachable`: it may come back serving others)."""
    first, longest = MODELS_RETRY_S
    due, pause = True, first
    while True:
        if due or not backend.reachable:
            due = not await check_models(client, backend, backends)
            if not due:
                backend.reachable = True  # it answered (a request's failed connection had marked it)
            pause = min(2 * pause, longest) if due else first
        await asyncio.sleep(pause)
