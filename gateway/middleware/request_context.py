"""Request id, server span, access log and request metrics, around everything but errors.

``x-request-id`` is taken from the client (if sane) or generated, returned on the response and
forwarded upstream by the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time

from aiohttp import web
from aiohttp.typedefs import Handler
from opentelemetry import trace
from opentelemetry.propagate import extract

from gateway.context import CONTEXT, RequestContext
from gateway.errors import GatewayError
from gateway.keys import METRICS, RUNTIME, TRACER
from gateway.middleware.errors import response_for

access_log = logging.getLogger("kvgate.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_QUIET_PATHS = frozenset({"/healthz", "/readyz"})


def _request_id(request: web.Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.match(given) else os.urandom(16).hex()


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    ctx = RequestContext(_request_id(request))
    request[CONTEXT] = ctx
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


async def _run(request: web.Request, handler: Handler, ctx: RequestContext) -> web.StreamResponse:
    try:
        response = await handler(request)
    except asyncio.CancelledError:
        ctx.status, ctx.error = 499, ctx.error or "client_disconnected"
        _record(request, ctx)
        raise
    except Exception as exc:
        response = response_for(request, exc)
        if isinstance(exc, GatewayError):
            ctx.error = ctx.error or exc.code or type(exc).__name__
    if not response.prepared:
        response.headers["x-request-id"] = ctx.request_id
    ctx.status = ctx.status or response.status
    _record(request, ctx)
    return response


def _record(request: web.Request, ctx: RequestContext) -> None:
    if (
        request.path in _QUIET_PATHS
        or request.path == request.app[RUNTIME].current.policy.observability.metrics_path
    ):
        return
    elapsed = time.perf_counter() - ctx.start
    metrics = request.app[METRICS]
    route = request.path
    metrics.child(metrics.requests, route, ctx.model, str(ctx.status)).inc()
    metrics.child(metrics.latency, route).observe(elapsed)
    if ctx.ttft is not None:
        metrics.child(metrics.ttft, ctx.model).observe(ctx.ttft)
    if ctx.prompt_tokens or ctx.completion_tokens:
        metrics.child(metrics.tokens, ctx.model, "prompt").inc(ctx.prompt_tokens)
        metrics.child(metrics.tokens, ctx.model, "completion").inc(ctx.completion_tokens)
    if request.app[
        RUNTIME
    ].current.policy.observability.access_log == "json" and access_log.isEnabledFor(logging.INFO):
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
