"""OpenAI-shaped error bodies, and the middleware that guarantees every error has one."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from kvgate.wire.openai_errors import error_body

log = logging.getLogger(__name__)

ERROR_TYPES = {404: "invalid_request_error", 413: "invalid_request_error", 500: "server_error"}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> web.Response:
    error_type = ERROR_TYPES.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return web.json_response(error_body(message, error_type, param, code), status=status)


@web.middleware  # required by aiohttp 3.x for (request, handler) middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost layer: HTTP errors and crashes become JSON bodies; the server stays up."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except ConnectionResetError:
        log.debug("client of %s %s went away", request.method, request.path)
        return web.Response(status=499)  # nobody reads it; aiohttp drops it quietly
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error")
