"""The gateway's OpenAPI 3.0 description (hand-written: the routes are plain Starlette)."""

from __future__ import annotations

from typing import Any

from headway.serve._config import GatewayConfig
from headway.serve._errors import ERRORS
from headway.serve._wire import MAX_N

__all__ = ["openapi_schema"]


def _error(description: str, status: int | None = None) -> dict[str, Any]:
    """An error response; with ``status``, the description lists its codes from the error table."""
    if status is not None:
        codes = ", ".join(f"`{c}`" for c, kind in ERRORS.items() if kind.status == status)
        description = f"{description} (code: {codes})"
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS: dict[str, Any] = {
    "400": _error("invalid request (the message and `param` name the field)", 400),
    "401": _error("missing or invalid API key", 401),
    "408": _error("waited longer than the queue TTL, or the body did not arrive within body_timeout_s", 408),
    "413": _error("request body over the size limit", 413),
    "429": _error("queue (or the tenant's share of it) full; see Retry-After", 429),
    "499": _error("cancelled through DELETE /v1/requests/{id}", 499),
    "502": _error("no backend could serve the request", 502),
    "503": _error(
        "gateway draining or past its drain timeout, no backend reachable, its queue store (Redis) "
        "unavailable, an API key kept in Redis not checkable now, or too many open connections; "
        "see Retry-After",
        503,
    ),
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {
            "nullable": True,
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "oneOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]
                    },
                },
            ],
        },
    },
}

_COMMON_FIELDS: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
    "stream_options": {
        "type": "object",
        "nullable": True,
        "properties": {"include_usage": {"type": "boolean"}},
    },
    "priority": {"type": "integer", "nullable": True},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N, "nullable": True},
}


def openapi_schema(config: GatewayConfig) -> dict[str, Any]:
    """The OpenAPI document served at ``/openapi.json``."""
    max_tokens = dict(_COMMON_FIELDS["max_tokens"])
    max_tokens["maximum"] = config.max_tokens_limit or 2**31 - 1
    fields = {**_COMMON_FIELDS, "max_tokens": max_tokens}
    completion = {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            **fields,
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                    },
                ]
            },
        },
    }
    chat = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            **fields,
            "messages": {"type": "array", "items": _MESSAGE},
            "max_completion_tokens": max_tokens,
        },
    }
    security: list[dict[str, list[str]]] = [{"bearer": []}] if config.auth_enabled else []
    ok_json = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    generation_responses = {
        "200": {
            "description": "the backend's response (JSON, or SSE when `stream` is true)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        },
        **_ERRORS,
    }
    request_id = [{"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "headway gateway", "version": "1"},
        "paths": {
            "/v1/completions": {
                "post": {
                    "operationId": "createCompletion",
                    "security": security,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": completion}}},
                    "responses": generation_responses,
                }
            },
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "security": security,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": chat}}},
                    "responses": generation_responses,
                }
            },
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "security": security,
                    "responses": {"200": ok_json, "401": _ERRORS["401"], "502": _ERRORS["502"]},
                }
            },
            "/v1/requests/{request_id}": {
                "get": {
                    "operationId": "getRequest",
                    "security": security,
                    "parameters": request_id,
                    "responses": {"200": ok_json, "401": _ERRORS["401"], "404": _error("no such request of yours")},
                },
                "delete": {
                    "operationId": "cancelRequest",
                    "security": security,
                    "parameters": request_id,
                    "responses": {
                        "200": ok_json,
                        "401": _ERRORS["401"],
                        "404": _error("no such request of yours"),
                        "409": _error("the request already ended"),
                    },
                },
            },
            "/health": {
                "get": {
                    "operationId": "health",
                    "responses": {
                        "200": ok_json,
                        "503": {"description": "draining, or degraded: no backend reachable"},
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "security": security,
                    "responses": {
                        "200": {
                            "description": "Prometheus text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        "401": _ERRORS["401"],
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": "string", "nullable": True},
                                "code": {"nullable": True},
                            },
                        }
                    },
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    return doc
