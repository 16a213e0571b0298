"""Request id, server span, access log and request metrics, around everything but errors.

``x-request-id`` is taken from the client (if sane) or generated, returned on the response and
forwarded upstream by the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable

from opentelemetry import trace
from opentelemetry.propagate import extract

from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.http.messages import AnyResponse, Request
from gateway.keys import METRICS, RUNTIME, TRACER
from gateway.middleware.errors import response_for
from gateway.request_id import new_request_id

ContextHandler = Callable[[Request, RequestContext], Awaitable[AnyResponse]]

access_log = logging.getLogger("kvgate.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_QUIET_PATHS = frozenset({"/healthz", "/readyz"})


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id")
    if given is not None and _REQUEST_ID.match(given):
        return given
    return new_request_id()


async def request_context(request: Request, handler: ContextHandler) -> AnyResponse:
    """Run ``handler`` with a fresh context; record the outcome whatever it was."""
    ctx = RequestContext(_request_id(request))
    tracer = request.app[TRACER]
    if tracer is None:
        response = await _run(request, handler, ctx)
    else:
        name = f"{request.method} {request.path}"
        with tracer.start_as_current_span(
            name, context=extract(request.headers), kind=trace.SpanKind.SERVER
        ) as span:
            span.set_attribute("kvgate.request_id", ctx.request_id)
            response = await _run(request, handler, ctx)
            span.set_attribute("http.response.status_code", ctx.status)
            if ctx.model:
                span.set_attribute("kvgate.model", ctx.model)
                span.set_attribute("kvgate.tenant", ctx.tenant)
    return response


async def _run(request: Request, handler: ContextHandler, ctx: RequestContext) -> AnyResponse:
    try:
        response = await handler(request, ctx)
    except asyncio.CancelledError:
        ctx.status, ctx.error = 499, ctx.error or "client_disconnected"
        _record(request, ctx)
        raise
    except Exception as exc:
        response = response_for(request, exc)
        if isinstance(exc, GatewayError):
            ctx.error = ctx.error or exc.code or type(exc).__name__
    if not response.prepared:
        response.headers.append(("x-request-id", ctx.request_id))  # no handler sets it
    ctx.status = ctx.status or response.status
    _record(request, ctx)
    return response


def _record(request: Request, ctx: RequestContext) -> None:
    observability = request.app[RUNTIME].current.policy.observability
    if request.path in _QUIET_PATHS or request.path == observability.metrics_path:
        return
    elapsed = time.perf_counter() - ctx.start
    metrics = request.app[METRICS]
    route = request.path
    metrics.requests_batch.add((route, ctx.model, str(ctx.status)))
    metrics.latency_batch.observe((route,), elapsed)
    if ctx.ttft is not None:
        metrics.ttft_batch.observe((ctx.model,), ctx.ttft)
    if ctx.prompt_tokens or ctx.completion_tokens:
        metrics.tokens_batch.add((ctx.model, "prompt"), ctx.prompt_tokens)
        metrics.tokens_batch.add((ctx.model, "completion"), ctx.completion_tokens)
    if observability.access_log == "json" and access_log.isEnabledFor(logging.INFO):
        access_log.info(
            json.dumps(
                {
                    "ts": round(time.time(), 3),
                    "request_id": ctx.request_id,
                    "method": request.method,
                    "path": route,
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
                    "duration_ms": round(elapsed * 1000, 2),
                    "error": ctx.error or None,
                }
            )
        )
