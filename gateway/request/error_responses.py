"""Every error the gateway makes becomes an OpenAI-shaped JSON body (Anthropic-shaped on
Anthropic's ``/v1/messages``)."""

from __future__ import annotations

import logging

from gateway.base.api import api_of
from gateway.base.errors import GatewayError, error_response
from kvgate.wire.http.messages import Request, Response, json_response
from kvgate.wire.messages_api import error_body

log = logging.getLogger("kvgate.gateway")


def response_for(request: Request, exc: Exception) -> Response:
    """The response for an exception raised by a handler."""
    if isinstance(exc, ConnectionResetError):
        return Response(status=499)  # the client is gone; nobody reads this
    if not isinstance(exc, GatewayError):
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
        exc = GatewayError("internal gateway error")
    return error_on(request.path, exc)


def error_on(path: str, exc: GatewayError) -> Response:
    """``exc`` as the API of ``path`` shapes its errors."""
    if api_of(path).anthropic_errors:
        body = error_body(exc.status, exc.message)
        return json_response(body, status=exc.status, headers=exc.headers)
    return exc.to_response()


def http_error(status: int, message: str) -> Response:
    """The body of an error found while reading HTTP itself (400, 408, 413, 431), before any
    handler."""
    code = "request_too_large" if status == 413 else None
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, message, error_type, code=code)
