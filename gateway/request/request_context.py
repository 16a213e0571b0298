"""Request id, server span and access log: what ``gateway.request.routes.handle`` does around every
request.

``x-request-id`` is taken from the client (if sane) or generated, returned on the response and
forwarded upstream by the proxy. A finished request is counted by ``GatewayMetrics.finished``
and, when access logs are on, logged as one JSON line.
"""

from __future__ import annotations

import json
import logging
import re
import time
from contextvars import Token

from multidict import CIMultiDict
from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract
from opentelemetry.trace import Span, Tracer

from gateway.base.context import RequestContext
from gateway.base.forwarded import ClientAddress, forwarded_chain
from kvgate.wire.http.messages import Request
from kvgate.wire.request_id import new_request_id

access_log = logging.getLogger("kvgate.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}").fullmatch
QUIET_PATHS = frozenset({"/healthz", "/readyz"})  # not counted or logged


def request_id_of(headers: CIMultiDict[str]) -> str:
    """The client's ``x-request-id`` when it is sane, else a new one."""
    given = headers.get("x-request-id")
    if given is not None and _REQUEST_ID(given):
        return given
    return new_request_id()


ServerSpan = tuple[Span, Token[Context]]  # the span and the token that made it current


def start_server_span(tracer: Tracer, request: Request) -> ServerSpan:
    """Start the request's server span (continuing the client's ``traceparent``) and make it
    current; end it with ``end_server_span``."""
    span = tracer.start_span(
        f"{request.method} {request.path}",
        context=extract(request.headers),
        kind=trace.SpanKind.SERVER,
    )
    return span, context.attach(trace.set_span_in_context(span))


def end_server_span(started: ServerSpan, ctx: RequestContext) -> None:
    span, token = started
    span.set_attribute("kvgate.request_id", ctx.request_id)
    span.set_attribute("http.response.status_code", ctx.status)
    if ctx.model:
        span.set_attribute("kvgate.model", ctx.model)
        span.set_attribute("kvgate.tenant", ctx.tenant)
    span.end()
    context.detach(token)


def log_access(request: Request, ctx: RequestContext, clients: ClientAddress) -> None:
    """One JSON line per request, at INFO on ``kvgate.access``; ``client`` is the address
    ``clients`` resolves (the peer, or through trusted proxies ``X-Forwarded-For``'s)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    access_log.info(
        json.dumps(
            {
                "ts": round(time.time(), 3),
                "request_id": ctx.request_id,
                "client": clients.client(request.peer, forwarded_chain(request.headers)),
                "method": request.method,
                "path": ctx.route,
                "status": ctx.status,
                "tenant": ctx.tenant,
                "model": ctx.model,
                "pool": ctx.pool,
                "endpoint": ctx.endpoint,
                "attempts": ctx.attempts,
                "stream": ctx.stream,
                "prompt_tokens": ctx.prompt_tokens,
                "completion_tokens": ctx.completion_tokens,
                "ttft_ms": round(ctx.ttft * 1000, 2) if ctx.ttft is not None else None,
                "duration_ms": round(ctx.elapsed * 1000, 2),
                "error": ctx.error or None,
                "cache": ctx.cache or None,
                "explain": ctx.explanation,
            }
        )
    )
