"""The gateway: an OpenAI-compatible server that queues requests in policy order.

``create_app(config)`` builds the ASGI app; ``headway serve`` runs it and
``headway bench serve`` replays a workload against any OpenAI-compatible endpoint.
"""

from headway.serve._bench import BenchConfig, run_bench, run_bench_sync
from headway.serve._config import (
    BackendConfig,
    ConfigError,
    GatewayConfig,
    TenantConfig,
    hash_api_key,
    load_config,
)
from headway.serve._gateway import Gateway, create_app
from headway.serve._runner import free_port, run_app, serve_in_thread
from headway.serve._stub import StubConfig, StubStats, create_stub_app

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
