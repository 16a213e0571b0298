"""Authenticate ``/v1/*`` requests; the identity lands on the request context.

The routed path is the request target's own path (never derived from the Host header), so no
header can steer a request around authentication.
"""

from __future__ import annotations

from contextlib import nullcontext

from gateway.context import RequestContext
from gateway.http.messages import Request
from gateway.keys import RUNTIME, TRACER


def authenticate(request: Request, ctx: RequestContext) -> None:
    """Set ``ctx.identity``, or raise Unauthorized / Forbidden."""
    tracer = request.app[TRACER]
    with tracer.start_as_current_span("auth") if tracer else nullcontext():
        authenticator = request.app[RUNTIME].current.authenticator
        ctx.identity = authenticator.authenticate(request.headers)
