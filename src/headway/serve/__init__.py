"""The gateway: an OpenAI-compatible server that queues requests in policy order.

``create_app(config)`` builds the ASGI app; ``headway serve`` runs it and
``headway bench serve`` replays a workload against any OpenAI-compatible endpoint.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headway.serve._bench import BenchConfig, run_bench, run_bench_sync
    from headway.serve._config import (
        BackendConfig,
        ConfigError,
        GatewayConfig,
        TenantConfig,
        hash_api_key,
    )
    from headway.serve._config_load import load_config
    from headway.serve._gateway import Gateway, create_app
    from headway.serve._runner import free_port, run_app, serve_in_thread
    from headway.serve._stub import StubConfig, StubStats, create_stub_app

# Imported on first use, so `headway --help` and `headway simulate` work without the
# serve extra (starlette, uvicorn, httpx, aiohttp, redis) installed.
_LAZY: dict[str, str] = {
    "BackendConfig": "headway.serve._config",
    "BenchConfig": "headway.serve._bench",
    "ConfigError": "headway.serve._config",
    "Gateway": "headway.serve._gateway",
    "GatewayConfig": "headway.serve._config",
    "StubConfig": "headway.serve._stub",
    "StubStats": "headway.serve._stub",
    "TenantConfig": "headway.serve._config",
    "create_app": "headway.serve._gateway",
    "create_stub_app": "headway.serve._stub",
    "free_port": "headway.serve._runner",
    "hash_api_key": "headway.serve._config",
    "load_config": "headway.serve._config_load",
    "run_app": "headway.serve._runner",
    "run_bench": "headway.serve._bench",
    "run_bench_sync": "headway.serve._bench",
    "serve_in_thread": "headway.serve._runner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'headway.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BackendConfig",
    "BenchConfig",
    "ConfigError",
    "Gateway",
    "GatewayConfig",
    "StubConfig",
    "StubStats",
    "TenantConfig",
    "create_app",
    "create_stub_app",
    "free_port",
    "hash_api_key",
    "load_config",
    "run_app",
    "run_bench",
    "run_bench_sync",
    "serve_in_thread",
]
