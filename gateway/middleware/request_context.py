"""Request id, server span and access log: what ``gateway.routes.handle`` does around every
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
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import Span, Tracer

from gateway.context import RequestContext
from gateway.http.messages import Request
from policies.schema import Observability

access_log = logging.getLogger("kvgate.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$").match
QUIET_PATHS = frozenset({"/healthz", "/readyz"})  # not counted or logged
_NO_SPAN: AbstractContextManager[None] = nullcontext()


def request_id_of(request: Request) -> str | None:
    """The client's ``x-request-id`` when it is sane, else None (the caller makes one)."""
    given = request.headers.get("x-request-id")
    if given is not None and _REQUEST_ID(given):
        return given
    return None


def server_span(
    tracer: Tracer | None, request: Request
) -> AbstractContextManager[Span] | AbstractContextManager[None]:
    """The request's server span (continuing the client's ``traceparent``), or nothing."""
    if tracer is None:
        return _NO_SPAN
    return tracer.start_as_current_span(
        f"{request.method} {request.path}",
        context=extract(request.headers),
        kind=trace.SpanKind.SERVER,
    )


def end_span(span: Span, ctx: RequestContext) -> None:
    span.set_attribute("kvgate.request_id", ctx.request_id)
    span.set_attribute("http.response.status_code", ctx.status)
    if ctx.model:
        span.set_attribute("kvgate.model", ctx.model)
        span.set_attribute("kvgate.tenant", ctx.tenant)


def log_access(request: Request, ctx: RequestContext) -> None:
    """One JSON line per request, at INFO on ``kvgate.access``."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    access_log.info(
        json.dumps(
            {
                "ts": round(time.time(), 3),
                "request_id": ctx.request_id,
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
            }
        )
    )


def counted(request: Request, observability: Observability) -> bool:
    """Whether the request is counted in metrics and access logs (probes and scrapes are not)."""
    return request.path not in QUIET_PATHS and request.path != observability.metrics_path
