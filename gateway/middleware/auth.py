"""Authenticate ``/v1/*`` requests; the identity lands on the request context.

The routed path is aiohttp's own parsed path (never derived from the Host header), so no header
can steer a request around authentication.
"""

from __future__ import annotations

from contextlib import nullcontext

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.context import CONTEXT
from gateway.keys import RUNTIME, TRACER


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/v1/"):
        tracer = request.app[TRACER]
        with tracer.start_as_current_span("auth") if tracer else nullcontext():
            authenticator = request.app[RUNTIME].current.authenticator
            request[CONTEXT].identity = authenticator.authenticate(request.headers)
    return await handler(request)
