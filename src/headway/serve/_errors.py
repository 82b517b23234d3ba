"""The gateway's errors: one table from error code to HTTP status, OpenAI ``type`` and message.

Every error the gateway itself answers is OpenAI-style JSON,
``{"error": {"message", "type", "param", "code"}}``, with ``code`` always a string: a key of
:data:`ERRORS`. A stream that already sent its 200 ends with the same body as a final SSE event
(:func:`sse_error`) and ``[DONE]``. A 4xx of a backend is passed through as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["ERRORS", "ErrorKind", "api_error", "error_response", "sse_error"]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """What an error code answers."""

    status: int
    """HTTP status."""
    type: str
    """OpenAI's ``error.type``."""
    message: str
    """Message template, filled by :func:`api_error` with ``str.format`` fields."""


ERRORS: dict[str, ErrorKind] = {
    "invalid_request": ErrorKind(400, "invalid_request_error", "{detail}"),
    "invalid_value": ErrorKind(400, "invalid_request_error", "{detail}"),
    "invalid_json": ErrorKind(400, "invalid_request_error", "{detail}"),
    "invalid_api_key": ErrorKind(401, "authentication_error", "Invalid or missing API key."),
    "not_found": ErrorKind(404, "not_found_error", "{detail}"),
    "request_not_found": ErrorKind(404, "not_found_error", "no request {request_id!r} of yours on this gateway"),
    "method_not_allowed": ErrorKind(405, "invalid_request_error", "{detail}"),
    "header_timeout": ErrorKind(408, "timeout", "the request head did not arrive within {seconds:g} s"),
    "body_timeout": ErrorKind(408, "timeout", "the request body did not arrive within {seconds:g} s"),
    "queue_timeout": ErrorKind(408, "timeout", "request waited longer than {seconds:g} s in the queue"),
    "request_ended": ErrorKind(409, "invalid_request_error", "request {request_id!r} already ended ({status})"),
    "request_too_large": ErrorKind(413, "invalid_request_error", "request body exceeds {limit} bytes"),
    "queue_full": ErrorKind(429, "rate_limit_exceeded", "the {where} is full; retry later"),
    "cancelled": ErrorKind(499, "cancelled", "the request was cancelled"),
    "policy_error": ErrorKind(500, "server_error", "scheduling policy error: {detail}"),
    "upstream_error": ErrorKind(502, "upstream_error", "{detail}"),
    "draining": ErrorKind(503, "service_unavailable", "gateway is shutting down; retry later"),
    "drain_timeout": ErrorKind(
        503,
        "service_unavailable",
        "the gateway shut down before the request was served (drain timeout {seconds:g} s); retry later",
    ),
    "no_backend": ErrorKind(503, "service_unavailable", "no backend is reachable (waited {seconds:g} s in the queue)"),
    "auth_unavailable": ErrorKind(
        503, "service_unavailable", "the API-key store cannot be reached to check this key; retry later"
    ),
    "too_many_connections": ErrorKind(
        503, "service_unavailable", "the gateway has too many open connections; retry later"
    ),
    "queue_error": ErrorKind(
        503, "service_unavailable", "queue unavailable (the gateway cannot reach its queue store); retry later"
    ),
}
"""Error code -> status, type and message template."""


def error_response(
    status: int,
    message: str,
    err_type: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def api_error(
    code: str,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> JSONResponse:
    """The answer for error ``code`` of :data:`ERRORS`, its message filled with ``fields``."""
    kind = ERRORS[code]
    return error_response(
        kind.status, kind.message.format(**fields), kind.type, param=param, code=code, headers=headers
    )


def sse_error(message: str, err_type: str = "upstream_error", code: str = "upstream_error") -> bytes:
    """A final SSE error event (same body as a JSON error) and ``[DONE]``."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"
