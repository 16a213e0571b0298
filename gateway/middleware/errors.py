"""Outermost middleware: every error the gateway makes becomes an OpenAI-shaped JSON body."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import GatewayError, error_response

log = logging.getLogger("kvgate.gateway")

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error"}


def response_for(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The response for an exception raised by a handler (re-raises redirects)."""
    if isinstance(exc, GatewayError):
        return exc.to_response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = "request_too_large" if exc.status == 413 else None
        default = "invalid_request_error" if exc.status < 500 else "server_error"
        return error_response(
            exc.status, exc.reason, _HTTP_TYPES.get(exc.status, default), code=code
        )
    if isinstance(exc, ConnectionResetError):
        return web.Response(status=499)  # the client is gone; aiohttp drops this quietly
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal gateway error", "server_error")


@web.middleware  # aiohttp 3.x needs the marker for (request, handler) middlewares
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        return response_for(request, exc)
