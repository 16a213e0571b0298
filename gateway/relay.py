"""Relaying an upstream response to the client: a JSON body at once, SSE event by event, and
any other body as it arrives.

A stream's chunks are taken in the upstream connection's own callback as they arrive and their
complete events written to the client there (``UpstreamResponse.push``); the request's task
runs only at the stream's end, while the client's connection is backed up, and on errors.

An upstream that dies or stalls (``idle`` seconds between chunks) mid-stream ends the client's
stream with an SSE error event and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from gateway.attempt import Attempt
from gateway.context import RequestContext
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.upstream import response_headers
from kvgate.wire.http.client import (
    MAX_UPSTREAM_BODY,
    UpstreamBodyTooLarge,
    UpstreamConnectionError,
    UpstreamResponse,
)
from kvgate.wire.http.messages import Request, Response, StreamResponse
from kvgate.wire.http.server import SHUTDOWN_CUT
from kvgate.wire.responses_api import chat_usage
from kvgate.wire.sse import EventTooLarge, SSERelay, usage_of

MID_STREAM_ERRORS = (UpstreamConnectionError, asyncio.TimeoutError)
AFTER_DONE = 1.0  # seconds to wait for the upstream body's end after [DONE]
CUT_BY_SHUTDOWN = "cut_by_shutdown"  # the error of a stream still running when the grace ended


async def read_body(
    ctx: RequestContext, attempt: Attempt, upstream: UpstreamResponse, idle: float
) -> bytes:
    """The rest of a whole (non-stream) body, when it did not come with the headers."""
    try:
        return await upstream.read(idle, MAX_UPSTREAM_BODY)
    except MID_STREAM_ERRORS as exc:
        ctx.error = "upstream_body_error"
        attempt.break_off()
        raise _upstream_failed(ctx, exc) from exc


def body_response(ctx: RequestContext, upstream: UpstreamResponse, data: bytes) -> Response:
    """The client's response for a whole upstream body (its usage recorded)."""
    ctx.ttft = time.perf_counter() - ctx.start
    ctx.status = upstream.status
    if upstream.status == 200 and upstream.content_type == "application/json":
        _record_usage(ctx, usage_of(data))
    block = response_headers(upstream.raw_headers, None, ctx.extra_headers)
    return Response(data, status=upstream.status, block=block)  # + x-request-id, by handle


async def relay_stream(
    request: Request,
    ctx: RequestContext,
    attempt: Attempt,
    upstream: UpstreamResponse,
    idle: float,
    relay: SSERelay,
) -> StreamResponse:
    """Relay the upstream's events as they complete (``relay``: how this API's stream is read
    and ended); a stream that breaks off ends with an error event."""
    response = await _prepared(request, ctx, upstream, None)
    failure = ""
    forward = _Forward(ctx, attempt, relay, response)
    try:
        while not await upstream.push(forward.take, idle):
            if forward.last is not None:  # the last event: the body's end goes with it
                await response.finish(forward.last)
                await _rest_after_done(upstream, idle)
                break
            await response.drain()  # the client reads slower than the upstream writes
    except asyncio.CancelledError as cancel:
        if cancel.args and cancel.args[0] == SHUTDOWN_CUT:
            ctx.error = CUT_BY_SHUTDOWN
            attempt.break_off()
            message = "the gateway is shutting down; the stream was cut after its grace period"
            response.write_last(relay.error_event(message, "shutdown"))
        raise
    except MID_STREAM_ERRORS as exc:
        failure = (
            "upstream stalled mid-stream"
            if isinstance(exc, asyncio.TimeoutError)
            else ("upstream connection lost mid-stream")
        )
    except EventTooLarge as exc:
        failure = str(exc)
    if not failure and not relay.saw_done:
        failure = (
            "upstream ended the stream in the middle of an event"
            if relay.pending
            else "upstream ended the stream without [DONE]"
        )
    if relay.usage:
        _record_usage(ctx, relay.usage)
    if failure:
        ctx.error = "upstream_stream_broken"
        attempt.break_off()
        await response.write(relay.error_event(failure, "upstream_stream_broken"))
    await response.write_eof()
    return response


async def relay_body(
    request: Request,
    ctx: RequestContext,
    attempt: Attempt,
    upstream: UpstreamResponse,
    idle: float,
) -> StreamResponse:
    """Pass on a body the gateway reads nothing from (audio, a file, text) as it arrives,
    rather than holding it whole; one that breaks off is cut short at the client too."""
    response = await _prepared(request, ctx, upstream, upstream.length)
    ctx.ttft = time.perf_counter() - ctx.start
    try:
        while chunk := await upstream.readany(idle):
            await response.write(chunk)
    except MID_STREAM_ERRORS:
        ctx.error = "upstream_body_error"
        attempt.break_off()
        response.cut(request)
        return response
    await response.write_eof()
    return response


class _Forward:
    """Takes each upstream chunk as it arrives, from the connection's callback, and writes the
    complete events it holds to the client; gives the task back (returns False) at the last
    event (``last``) and while the client's connection needs draining."""

    __slots__ = ("attempt", "ctx", "last", "relay", "response")

    def __init__(
        self, ctx: RequestContext, attempt: Attempt, relay: SSERelay, response: StreamResponse
    ) -> None:
        self.ctx = ctx
        self.attempt = attempt
        self.relay = relay
        self.response = response
        self.last: bytes | None = None

    def take(self, chunk: bytes) -> bool:
        out = self.relay.feed(chunk)
        if not out:
            return True
        ctx = self.ctx
        if ctx.ttft is None:
            ctx.ttft = time.perf_counter() - ctx.start
            self.attempt.first_token()
        if self.relay.saw_done:
            self.last = out
            return False
        return self.response.write_now(out)


async def _rest_after_done(upstream: UpstreamResponse, idle: float) -> None:
    """Read and drop what the upstream sends after ``[DONE]`` (its body's end, as a rule at
    once), so its connection can be reused; one that does not end its body within
    ``AFTER_DONE`` seconds loses its connection, and the request is not held for it."""
    with contextlib.suppress(*MID_STREAM_ERRORS):
        async with asyncio.timeout(AFTER_DONE):
            while await upstream.readany(idle):
                pass


async def _prepared(
    request: Request, ctx: RequestContext, upstream: UpstreamResponse, length: int | None
) -> StreamResponse:
    """The client's response to relay ``upstream`` into, its head sent (the request id and
    CORS lines in it: a prepared response takes no more headers)."""
    response = StreamResponse(
        status=upstream.status,
        block=response_headers(upstream.raw_headers, ctx.request_id, ctx.extra_headers) + ctx.cors,
        length=length,
    )
    await response.prepare(request)
    ctx.status = upstream.status
    return response


def _upstream_failed(ctx: RequestContext, exc: BaseException) -> Exception:
    if isinstance(exc, UpstreamBodyTooLarge):
        return UpstreamError(
            f"upstream {ctx.endpoint} sent a response body over {MAX_UPSTREAM_BODY >> 20} MiB"
        )
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {ctx.endpoint} stalled while sending its response")
    return UpstreamError(f"upstream {ctx.endpoint} failed while sending its response")


def _record_usage(ctx: RequestContext, usage: dict[str, object] | None) -> None:
    if usage is None:
        return
    prompt, completion = chat_usage(usage)
    ctx.prompt_tokens = prompt if isinstance(prompt, int) else 0
    ctx.completion_tokens = completion if isinstance(completion, int) else 0
    ctx.usage_known = isinstance(prompt, int) and isinstance(completion, int)
