"""Every error the gateway makes becomes an OpenAI-shaped JSON body."""

from __future__ import annotations

import logging

from gateway.errors import GatewayError, error_response
from kvgate.wire.http.messages import Request, Response

log = logging.getLogger("kvgate.gateway")


def response_for(request: Request, exc: Exception) -> Response:
    """The response for an exception raised by a handler."""
    if isinstance(exc, GatewayError):
        return exc.to_response()
    if isinstance(exc, ConnectionResetError):
        return Response(status=499)  # the client is gone; nobody reads this
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal gateway error", "server_error")


def http_error(status: int, message: str) -> Response:
    """The body of an error found while reading HTTP itself (400, 408, 413, 431), before any
    handler."""
    code = "request_too_large" if status == 413 else None
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, message, error_type, code=code)
