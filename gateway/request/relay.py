"""Relaying an upstream response to the client: a JSON body at once, SSE event by event, and
any other body as it arrives.

A stream's chunks are taken in the upstream connection's own callback as they arrive and their
complete events written to the client there (``UpstreamResponse.push``); the request's task
runs only at the stream's end, while the client's connection is backed up, and on errors.

An upstream that dies or stalls (``idle`` seconds between chunks) mid-stream is continued on another
endpoint where the request allows (``gateway.request.stream_resume``); otherwise, or when that fails
too, the client's stream ends with an SSE error event and no ``[DONE]``. A stream paused for a
heavier class's request stops at its next turn and goes on the same way once admitted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from gateway.base.context import RequestContext
from gateway.base.errors import UpstreamError, UpstreamTimeout
from gateway.base.finished_requests import STREAM_BROKEN
from gateway.guards.pauses import PausableStream
from gateway.request.attempt import Attempt
from gateway.request.stream_resume import PAUSED, StreamResume
from gateway.request.upstream import response_headers
from kvgate.wire.http.client import (
    MAX_UPSTREAM_BODY,
    UpstreamBodyTooLarge,
    UpstreamConnectionError,
    UpstreamResponse,
)
from kvgate.wire.http.messages import Request, Response, StreamResponse
from kvgate.wire.http.server import SHUTDOWN_CUT
from kvgate.wire.model_name import Restore
from kvgate.wire.sse import EventTooLarge, SSERelay, usage_of
from kvgate.wire.token_usage import token_counts

MID_STREAM_ERRORS = (UpstreamConnectionError, asyncio.TimeoutError)
AFTER_DONE = 1.0  # seconds the upstream has to end its body after [DONE] (else it is closed)
CUT_BY_SHUTDOWN = "cut_by_shutdown"  # the error of a stream still running when the grace ended


async def read_upstream_body(
    ctx: RequestContext, attempt: Attempt, upstream: UpstreamResponse, idle: float
) -> bytes:
    """The rest of a whole (non-stream) body, when it did not come with the headers."""
    try:
        return await upstream.read(idle, MAX_UPSTREAM_BODY)
    except MID_STREAM_ERRORS as exc:
        ctx.error = "upstream_body_error"
        attempt.break_off()
        raise _upstream_failed(ctx, exc) from exc


def body_response(
    ctx: RequestContext, upstream: UpstreamResponse, data: bytes, restore: Restore | None = None
) -> Response:
    """The client's response for a whole upstream body (its usage recorded; the public model
    name put back by ``restore``)."""
    ctx.ttft = time.perf_counter() - ctx.start
    ctx.status = upstream.status
    if upstream.status == 200 and upstream.content_type == "application/json":
        _record_usage(ctx, usage_of(data))
    if restore is not None:
        data = restore(data)
    block = response_headers(upstream.raw_headers, None, ctx.extra_headers)
    return Response(data, status=upstream.status, block=block)  # + x-request-id, by handle


async def relay_stream(
    request: Request,
    ctx: RequestContext,
    attempt: Attempt,
    upstream: UpstreamResponse,
    idle: float,
    relay: SSERelay,
    resume: StreamResume | None = None,
    restore: Restore | None = None,
    copy: list[bytes] | None = None,
    copy_limit: int = 0,
    pause: PausableStream | None = None,
) -> StreamResponse:
    """Relay the upstream's events as they complete (``relay``: how this API's stream is read
    and ended; ``restore`` puts the public model name back in them; ``copy`` gets what the
    client is sent, up to ``copy_limit`` bytes: past it, the copy is dropped and the
    response's ``copy`` is None); a stream that breaks off goes on from another endpoint
    where ``resume`` can (its attempts are closed here), else ends with an error event;
    ``pause``: the stream's way to be paused (registered while it runs)."""
    ctx.stream = True  # what the client gets, whatever it asked
    response = await _prepared(request, ctx, upstream, None)
    response.copy, response.copy_limit = copy, copy_limit
    current = attempt
    try:
        failure = await _relay_events(
            ctx, current, upstream, idle, relay, response, restore, pause, resume
        )
        while failure and resume is not None:
            if failure is not PAUSED:
                current.break_off()
            tail = resume.ending(relay)
            if tail is not None:  # the answer was whole: only its end was lost
                await response.write(tail if restore is None else restore(tail))
                failure = ""
                break
            following = await resume.go_on(relay, current, failure, pause)
            if following is None:
                break
            if current is not attempt:
                current.close()
            current, relay = following
            ctx.endpoint = current.endpoint.address
            assert current.response is not None
            upstream = current.response
            failure = await _relay_events(
                ctx, current, upstream, idle, relay, response, restore, pause, resume
            )
    finally:  # the client may have gone: what the engine sent is metered all the same
        _record_usage(ctx, relay.usage or _relayed_usage(upstream, relay, resume))
        if resume is not None:
            ctx.attempts += resume.tries
        if current is not attempt:
            current.close(ctx.prompt_tokens if ctx.usage_known else None)
    if failure:
        ctx.error = STREAM_BROKEN
        current.break_off()
        await response.write(relay.error_event(failure, STREAM_BROKEN))
    await response.write_eof()
    return response


async def _relay_events(
    ctx: RequestContext,
    attempt: Attempt,
    upstream: UpstreamResponse,
    idle: float,
    relay: SSERelay,
    response: StreamResponse,
    restore: Restore | None,
    pause: PausableStream | None = None,
    resume: StreamResume | None = None,
) -> str:
    """Relay one upstream's events until its last; why it broke off ("" when it did not;
    ``PAUSED`` when ``pause`` was asked for and ``resume`` can go on from here)."""
    forward = _Forward(ctx, attempt, relay, response, restore)
    if pause is not None:
        pause.interrupt = upstream.interrupt
        if _pauses_now(pause, resume, relay):  # asked before it could be woken
            return PAUSED
    try:
        while not await upstream.push(forward.take, idle):
            if relay.failed:
                return relay.failed
            if forward.last is not None:
                # the last event and the body's end in one write: the client's stream is whole,
                # whatever the upstream's last bytes do (they are dropped as they come)
                response.write_last(forward.last)
                upstream.discard_rest(AFTER_DONE)
                return ""
            if pause is not None and _pauses_now(pause, resume, relay):
                return PAUSED
            await response.drain()  # the client reads slower than the upstream writes
    except asyncio.CancelledError as cancel:
        if cancel.args and cancel.args[0] == SHUTDOWN_CUT:
            ctx.error = CUT_BY_SHUTDOWN
            attempt.break_off()
            message = "the gateway is shutting down; the stream was cut after its grace period"
            response.write_last(relay.error_event(message, "shutdown"))
        raise
    except MID_STREAM_ERRORS as exc:
        if isinstance(exc, asyncio.TimeoutError):
            return "upstream stalled mid-stream"
        return "upstream connection lost mid-stream"
    except EventTooLarge as exc:
        return str(exc)
    if relay.failed:
        return relay.failed
    if relay.saw_done:
        return ""
    if relay.pending:
        return "upstream ended the stream in the middle of an event"
    return "upstream ended the stream without [DONE]"


def _pauses_now(pause: PausableStream, resume: StreamResume | None, relay: SSERelay) -> bool:
    """Whether the stream stops for its pause now: one is asked for and the stream can go on
    from what it sent (else the pause is declined and the stream runs to its end)."""
    if not pause.wanted:
        return False
    if resume is not None and resume.can_go_on(relay):
        return True
    pause.decline()
    return False


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

    __slots__ = ("attempt", "ctx", "last", "relay", "response", "restore", "started")

    def __init__(
        self,
        ctx: RequestContext,
        attempt: Attempt,
        relay: SSERelay,
        response: StreamResponse,
        restore: Restore | None,
    ) -> None:
        self.ctx = ctx
        self.restore = restore
        self.attempt = attempt
        self.relay = relay
        self.response = response
        self.last: bytes | None = None
        self.started = False  # this upstream's first event went out

    def take(self, chunk: bytes) -> bool:
        relay = self.relay
        out = relay.feed(chunk)
        if not out:
            return not relay.failed
        if self.restore is not None:
            out = self.restore(out)
        if not self.started:
            self.started = True
            self.attempt.first_token()
            ctx = self.ctx
            if ctx.ttft is None:
                ctx.ttft = time.perf_counter() - ctx.start
        if relay.failed:  # an in-band error: what came before it goes out, the task decides
            self.response.write_now(out)
            return False
        if relay.saw_done:
            self.last = out
            return False
        return self.response.write_now(out)


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


def _relayed_usage(
    upstream: UpstreamResponse, relay: SSERelay, resume: StreamResume | None
) -> dict[str, object] | None:
    """The usage of a stream that ended without its usage (cut, or its client gone): from the
    token ids the engine sent (what arrived is read first, unsent), where it sent them; else
    None (the request keeps what its limits and budgets reserved)."""
    if resume is None:
        return None
    rest = upstream.buffered()
    if rest:
        with contextlib.suppress(EventTooLarge):
            relay.feed(rest)
    return resume.usage_so_far(relay)


def _record_usage(ctx: RequestContext, usage: dict[str, object] | None) -> None:
    if usage is None:
        return
    prompt, completion, cached = token_counts(usage)
    ctx.prompt_tokens = prompt or 0
    ctx.completion_tokens = completion or 0
    ctx.cached_tokens = cached  # vLLM says so with --enable-prompt-tokens-details
    ctx.usage_known = prompt is not None and completion is not None
