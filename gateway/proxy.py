"""The OpenAI endpoints the gateway proxies: completions, chat completions, embeddings.

The body is forwarded unchanged except for the route's model rewrite and, on streams,
``stream_options.include_usage`` (so usage is always known; the extra chunk is dropped again
for clients that did not ask for it). Streams are relayed event by event; if the upstream dies
or stalls mid-stream the client gets an SSE error event and no ``[DONE]``. A client that goes
away cancels the handler, which closes the upstream connection at once.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web

from gateway.admission import Evicted, Rejected
from gateway.context import CONTEXT, RequestContext
from gateway.errors import (
    BadRequest,
    ModelNotFound,
    PayloadTooLarge,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.keys import (
    ADMISSION,
    ENDPOINTS,
    HTTP_SESSION,
    LIMITER,
    METRICS,
    PICKER,
    POLICY,
    RETRY_BUDGETS,
    TRACER,
)
from gateway.picker import PickRequest
from gateway.sse_relay import SSERelay
from gateway.upstream import UpstreamCall, open_upstream, response_headers, upstream_headers
from policies.schema import Pool

MID_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
BROKEN_RESPONSES = frozenset({"upstream_stream_broken", "upstream_body_error"})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "/v1/chat/completions")


async def completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "/v1/completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "/v1/embeddings", streams=False)


async def _read_json(request: web.Request) -> tuple[bytes, dict[str, object]]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        limit = request.app[POLICY].listen.max_body_bytes
        raise PayloadTooLarge(f"request body exceeds {limit} bytes") from exc
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return raw, body


async def proxy(request: web.Request, path: str, *, streams: bool = True) -> web.StreamResponse:
    app = request.app
    policy = app[POLICY]
    ctx = request[CONTEXT]
    raw, body = await _read_json(request)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required and must be a string", param="model")
    ctx.model = model
    route = policy.route_for(model)
    if route is None or (ctx.identity is not None and not ctx.identity.may_use(model)):
        raise ModelNotFound(
            f"The model `{model}` does not exist or you do not have access to it.", param="model"
        )
    pool = policy.pools[route.pool]
    ctx.pool = pool.name
    stream = streams and body.get("stream") is True
    ctx.stream = stream
    options = body.get("stream_options")
    client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    changed = False
    if pool.model and pool.model != model:
        body["model"] = pool.model
        changed = True
    if stream and not client_wants_usage:
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        changed = True
    payload = json.dumps(body, separators=(",", ":")).encode() if changed else raw
    limiter = app[LIMITER]
    reservation = None
    if limiter.active:
        reservation = await limiter.reserve(ctx.identity, model, request.path, body)
        if reservation is not None:
            ctx.extra_headers.update(reservation.headers)
    try:
        await _queue(request, ctx, pool.name)
        try:
            return await _forward(request, ctx, pool, path, payload, body, client_wants_usage)
        finally:
            app[ADMISSION].done(pool.name)
    finally:
        used = ctx.prompt_tokens + ctx.completion_tokens if ctx.usage_known else None
        limiter.settle(reservation, used)


async def _queue(request: web.Request, ctx: RequestContext, pool: str) -> None:
    """Wait for capacity in ``pool``, in the caller's priority class."""
    admission, metrics = request.app[ADMISSION], request.app[METRICS]
    cls = admission.class_of(ctx.identity.priority_class if ctx.identity else None).name
    try:
        waited = await admission.admit(pool, cls, ctx.tenant)
    except (Rejected, Evicted) as exc:
        reason = "full" if isinstance(exc, Rejected) else "expired"
        metrics.child(metrics.queue_rejections, cls, reason).inc()
        raise
    metrics.child(metrics.queue_wait, cls).observe(waited)


async def _forward(
    request: web.Request,
    ctx: RequestContext,
    pool: Pool,
    path: str,
    payload: bytes,
    body: dict[str, object],
    client_wants_usage: bool,
) -> web.StreamResponse:
    app = request.app
    policy = app[POLICY]
    call = UpstreamCall(
        app[HTTP_SESSION],
        app[PICKER],
        app[METRICS],
        policy.timeouts,
        policy.retries,
        app[TRACER],
        app[ENDPOINTS][pool.name],
        app[RETRY_BUDGETS][pool.name],
    )
    headers = upstream_headers(request.headers, ctx.request_id, pool)
    pick = PickRequest(ctx.model, body, request.headers, ctx.identity, ctx.request_id)
    metrics = app[METRICS]
    gauge = metrics.child(metrics.in_flight, pool.name)
    gauge.inc()
    try:
        endpoint, upstream = await open_upstream(call, ctx, pool, path, payload, headers, pick)
        ctx.endpoint = endpoint.address
        try:
            if upstream.content_type == "text/event-stream":
                return await _relay_stream(
                    request, ctx, upstream, policy.timeouts.idle, strip_usage=not client_wants_usage
                )
            return await _relay_body(ctx, upstream, policy.timeouts.idle)
        finally:
            endpoint.in_flight -= 1
            upstream.close()
            if ctx.error in BROKEN_RESPONSES:
                endpoint.breaker.record(ok=False)
    finally:
        gauge.dec()


async def _relay_body(
    ctx: RequestContext, upstream: aiohttp.ClientResponse, idle: float
) -> web.Response:
    try:
        async with asyncio.timeout(idle):  # a whole JSON body comes at once after generation
            data = await upstream.read()
    except MID_STREAM_ERRORS as exc:
        ctx.error = "upstream_body_error"
        raise _upstream_failed(ctx, exc) from exc
    ctx.ttft = time.perf_counter() - ctx.start
    ctx.status = upstream.status
    if upstream.status == 200 and upstream.content_type == "application/json":
        _count_usage(ctx, data)
    return web.Response(
        body=data,
        status=upstream.status,
        headers=response_headers(upstream.headers, ctx.request_id, ctx.extra_headers),
    )


async def _relay_stream(
    request: web.Request,
    ctx: RequestContext,
    upstream: aiohttp.ClientResponse,
    idle: float,
    *,
    strip_usage: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=upstream.status,
        headers=response_headers(upstream.headers, ctx.request_id, ctx.extra_headers),
    )
    await response.prepare(request)
    ctx.status = upstream.status
    relay = SSERelay(strip_usage=strip_usage)
    failure = ""
    try:
        while chunk := await _next_chunk(upstream, idle):
            out = relay.feed(chunk)
            if out:
                if ctx.ttft is None:
                    ctx.ttft = time.perf_counter() - ctx.start
                await response.write(out)
    except MID_STREAM_ERRORS as exc:
        failure = (
            "upstream stalled mid-stream"
            if isinstance(exc, asyncio.TimeoutError)
            else ("upstream connection lost mid-stream")
        )
    if not failure and not relay.saw_done:
        failure = "upstream ended the stream without [DONE]"
    if relay.usage:
        _record_usage(ctx, relay.usage)
    if failure:
        ctx.error = "upstream_stream_broken"
        error = {
            "error": {
                "message": failure,
                "type": "server_error",
                "param": None,
                "code": "upstream_stream_broken",
            }
        }
        await response.write(f"data: {json.dumps(error)}\n\n".encode())
    await response.write_eof()
    return response


async def _next_chunk(upstream: aiohttp.ClientResponse, idle: float) -> bytes:
    async with asyncio.timeout(idle):
        return await upstream.content.readany()


def _upstream_failed(ctx: RequestContext, exc: BaseException) -> Exception:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {ctx.endpoint} stalled while sending its response")
    return UpstreamError(f"upstream {ctx.endpoint} failed while sending its response")


_DECODER = json.JSONDecoder()


def _count_usage(ctx: RequestContext, data: bytes) -> None:
    """Read ``usage`` without parsing the whole body (choices can be large)."""
    at = data.rfind(b'"usage"')
    if at < 0:
        return
    text = data[at:].decode(errors="replace")
    start = text.find("{")
    try:
        usage, _ = _DECODER.raw_decode(text, start) if start > 0 else (None, 0)
    except ValueError:
        return
    if isinstance(usage, dict):
        _record_usage(ctx, usage)


def _record_usage(ctx: RequestContext, usage: dict[str, object]) -> None:
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    ctx.prompt_tokens = prompt if isinstance(prompt, int) else 0
    ctx.completion_tokens = completion if isinstance(completion, int) else 0
    ctx.usage_known = isinstance(prompt, int) and isinstance(completion, int)
