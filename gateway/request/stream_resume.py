"""Streams that survive their engine: when a stream's engine fails mid-answer (the connection
lost, an error event or an end without ``[DONE]``, a stall past ``timeouts.idle``), the answer goes
on from another endpoint of the pool, in the same response: the same id and choice index, one usage
at the end counting the whole answer (``gateway.request.continuation`` builds the request and
rewrites its stream). At most ``retries.resumes`` times per request (2 by default); a route opts out
with ``resume: false``. Each resume is counted (``kvgate_stream_resumes_total{pool, outcome}``) and
traced (a ``resume stream`` span around the continuation's attempts).

A stream that broke before any event reached the client is simply sent again, elsewhere.

A stream paused for a heavier class's request (``gateway.guards.pauses``) goes on the same way
once it is admitted again (``after_pause``), on any endpoint: a pause uses up none of its resumes.
"""

from __future__ import annotations

import orjson

from gateway.base.errors import GatewayError
from gateway.guards.pauses import PausableStream
from gateway.request.attempt import Attempt
from gateway.request.continuation import (
    ContinuationRelay,
    Progress,
    continuation,
    ending,
    resumable,
    whole_usage,
)
from gateway.request.forward import Forward
from gateway.request.upstream import UpstreamCall, open_upstream
from gateway.request.upstream_payload import pool_body
from gateway.routing.endpoint_picker import EndpointState
from kvgate.wire.sse import SSERelay
from policies.schema import Pool

EVENT_STREAM = "text/event-stream"
PAUSED = "paused for a request of a heavier class"  # why a stream stopped: it goes on later


class StreamResume:
    """One stream's way on when its engine fails (a plain slots class: one per stream)."""

    __slots__ = (
        "api",
        "body",
        "call",
        "client_counts",
        "client_ids",
        "client_wants_usage",
        "failed",
        "headers",
        "left",
        "payload",
        "pick",
        "pool",
        "token_ids",
        "tries",
    )

    def __init__(self, forward: Forward, pool: Pool, payload: bytes, headers: bytes) -> None:
        """The way on of ``forward``'s stream from ``pool``; ``payload`` and ``headers``: what
        was first sent (with what the gateway added)."""
        self.call = forward.runtime.calls[pool.name]
        self.pool = pool
        self.api = forward.api
        body = self.body = pool_body(forward.body, pool, forward.ctx.model)
        self.payload = payload
        self.headers = headers
        self.pick = forward.pick
        self.client_wants_usage = forward.client_wants_usage
        self.client_ids = body.get("return_token_ids") is True
        options = body.get("stream_options")
        self.client_counts = (
            isinstance(options, dict) and options.get("continuous_usage_stats") is True
        )
        self.token_ids = pool.returns_token_ids
        self.left = self.call.retries.resumes
        self.failed: set[str] = set()
        self.tries = 0  # endpoints tried to go on with the stream

    def relay(self) -> SSERelay:
        """The relay of a stream that may be resumed: it keeps what it forwards, and drops the
        token ids the gateway asked for."""
        return SSERelay(
            strip_usage=not self.client_wants_usage,
            record=True,
            strip_token_ids=self.token_ids and not self.client_ids,
            strip_counts=not self.token_ids and not self.client_counts,
        )

    def ending(self, relay: SSERelay) -> bytes | None:
        """The missing end of a stream that broke after its answer was complete (its usage,
        where known, and ``[DONE]``); None if there was more to come."""
        progress = self._progress(relay)
        tail = ending(progress, self.client_wants_usage)
        if tail is not None:
            relay.usage = whole_usage(progress, None)
            self._count("finished")
        return tail

    def usage_so_far(self, relay: SSERelay) -> dict[str, object] | None:
        """The usage of what the engines sent so far, where their token ids tell it."""
        return whole_usage(self._progress(relay), None)

    async def reopen(
        self, relay: SSERelay, broken: EndpointState, failure: str
    ) -> tuple[Attempt, SSERelay] | None:
        """The attempt (and the relay) that goes on from where ``relay``'s stream broke, on an
        endpoint that has not failed it; None when there is none, or no more resumes."""
        self.failed.add(broken.address)
        progress = self._progress(relay)
        if self.left <= 0 or not progress.resumable:
            self._count("gave_up")
            return None
        self.left -= 1
        path, payload, following = self._following(progress)
        tracer = self.call.tracer
        if tracer is None:
            attempt = await self._open(path, payload)
        else:
            attributes: dict[str, str | int] = {
                "kvgate.resume.broken_endpoint": broken.address,
                "kvgate.resume.reason": failure,
                "kvgate.resume.generated_tokens": progress.generated,
            }
            with tracer.start_as_current_span("resume stream", attributes=attributes):
                attempt = await self._open(path, payload)
        if attempt is None:
            self._count("failed")
            return None
        self._count("resumed")
        return attempt, following

    def can_go_on(self, relay: SSERelay) -> bool:
        """Whether the stream ``relay`` forwards could go on elsewhere from what it sent."""
        return self._progress(relay).resumable

    async def go_on(
        self, relay: SSERelay, current: Attempt, failure: str, pause: PausableStream | None
    ) -> tuple[Attempt, SSERelay] | None:
        """The attempt and relay that go on from where ``relay``'s stream on ``current``
        stopped: after a pause (``failure`` is ``PAUSED``), or on another endpoint."""
        if failure is PAUSED and pause is not None:
            current.close()  # the engine frees the request's slot and blocks
            return await self.after_pause(relay, pause)
        return await self.reopen(relay, current.endpoint, failure)

    async def after_pause(
        self, relay: SSERelay, stream: PausableStream
    ) -> tuple[Attempt, SSERelay] | None:
        """Pause ``relay``'s stream (its upstream closed already): wait for a slot again
        (``PausableStream.take_turn``), then the attempt and relay that go on from where it
        stopped; None when no endpoint can."""
        progress = self._progress(relay)
        path, payload, following = self._following(progress)
        metrics, cls = self.call.metrics, stream.spec.name
        tracer = self.call.tracer
        if tracer is None:
            waited = await stream.take_turn()
            attempt = await self._open(path, payload)
        else:
            attributes: dict[str, str | int] = {
                "kvgate.pause.class": cls,
                "kvgate.pause.generated_tokens": progress.generated,
            }
            with tracer.start_as_current_span("pause stream", attributes=attributes):
                waited = await stream.take_turn()
                attempt = await self._open(path, payload)
        metrics.child(metrics.paused_seconds, self.pool.name, cls).inc(waited)
        outcome = "failed" if attempt is None else "resumed"
        metrics.child(metrics.stream_pauses, self.pool.name, cls, outcome).inc()
        return None if attempt is None else (attempt, following)

    def _following(self, progress: Progress) -> tuple[str, bytes, SSERelay]:
        """The path, payload and relay of the request that goes on from ``progress``."""
        if not progress.started:  # nothing reached the client: the same request, elsewhere
            return self.api.path, self.payload, self.relay()
        path, body = continuation(self.body, progress, self.token_ids)
        following = ContinuationRelay(
            progress, client_wants_usage=self.client_wants_usage, client_ids=self.client_ids
        )
        return path, orjson.dumps(body), following

    async def _open(self, path: str, payload: bytes) -> Attempt | None:
        tried = set(self.failed)
        try:
            ranking = self.call.picker.rank(self.pool.name, self.pick)
            attempt = await open_upstream(
                self.call, self.pool, path, payload, self.headers, self.pick, ranking, tried
            )
        except GatewayError:
            return None
        finally:
            self.tries += len(tried) - len(self.failed)
        response = attempt.response
        if response is None or response.status != 200 or response.content_type != EVENT_STREAM:
            attempt.close()
            return None
        return attempt

    def _progress(self, relay: SSERelay) -> Progress:
        if isinstance(relay, ContinuationRelay):
            return relay.progress
        return Progress.of(self.api.chat, relay.recorded or [])

    def _count(self, outcome: str) -> None:
        metrics = self.call.metrics
        metrics.child(metrics.stream_resumes, self.pool.name, outcome).inc()


def asks_token_ids(pool: Pool, body: dict[str, object]) -> bool:
    """Whether the gateway adds ``return_token_ids`` to a stream of ``body`` for ``pool``."""
    return pool.returns_token_ids and body.get("return_token_ids") is not True


def may_resume(forward: Forward, call: UpstreamCall) -> bool:
    """Whether ``forward``'s stream is to be resumable: a stream the route lets go on, the
    policy has resumes, and the request is one that can be continued (not a form)."""
    return (
        forward.route.resume
        and forward.ctx.stream
        and forward.form is None
        and call.retries.resumes > 0
        and resumable(forward.api, forward.body)
    )
