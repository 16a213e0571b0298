"""Envoy ext_proc with the Gateway API Inference Extension's protocol (FULL_DUPLEX_STREAMED).

Request path: headers are stored and answered only once the body has ended; then the EPP
parses the body, picks an endpoint and replies, in order, with the header response
(``x-gateway-destination-endpoint``, ``Content-Length``, the echoed headers; ``envoy.lb``
dynamic metadata with the same endpoint) and the body — re-serialized with the target model —
in ``streamed_response`` chunks of at most 62,000 bytes. Response path: usage is read from the
body (SSE or JSON), the model name is restored, chunks are echoed. Errors are
``ImmediateResponse``s with OpenAI-shaped bodies: 400 bad body, 404 unknown model, 429 shed or
no endpoint left after filtering, 503 no candidates (including an empty subset hint).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import orjson
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from epp.service import Dispatch, EppService
from kvgate.wire.http.client import MAX_UPSTREAM_BODY
from kvgate.wire.model_name import Restore, model_restorer
from kvgate.wire.openai_errors import (
    MODEL_REQUIRED,
    NOT_AN_OBJECT,
    body_too_large,
    error_body,
    error_type_for,
    invalid_json,
    response_not_found,
    unknown_model,
)
from kvgate.wire.request_id import new_request_id
from kvgate.wire.responses_api import (
    RESPONSES_PATH,
    addressed_response,
    chat_usage,
    id_in_body,
    input_messages,
)
from kvgate.wire.routing_headers import (
    DESTINATION,
    INFERENCE_OBJECTIVE,
    PREFILLER_HEADERS,
    SERVED,
    SUBSET_KEY,
    is_client_routing,
)
from kvgate.wire.sse import EventTooLarge, ResponsesRelay, SSERelay, usage_of

log = logging.getLogger("kvgate.epp")

BODY_CHUNK = 62_000  # GIE's limit, a margin under Envoy's 64 KiB
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
OBJECTIVE = INFERENCE_OBJECTIVE
FAIRNESS, REWRITE = ("x-gateway-inference-fairness-id", "x-gateway-model-name-rewrite")
SYSTEM_OWNED = frozenset(
    {DESTINATION, SERVED, SUBSET_KEY, OBJECTIVE, FAIRNESS, REWRITE, "content-length", "host"}
)
REQUIRED_FIELD = {
    "/chat/completions": "messages",
    "/completions": "prompt",
    "/embeddings": "input",
    "/responses": "input",
}


class PickError(Exception):
    """A request answered by the picker itself: ``reason`` labels the rejection metric, the
    body's ``code`` is the gateway's for the same error (None where it has none)."""

    def __init__(
        self, status: int, message: str, reason: str, *, code: str | None = "", param: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason
        self.code = reason if code == "" else code
        self.param = param or None


@dataclass
class StreamState:
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    incoming_model: str = ""
    target_model: str = ""
    endpoint: str = ""
    served: str = ""
    routed: bool = False  # the request-headers reply has been sent
    stream_requested: bool = False  # the body says "stream": true
    streaming: bool = False
    subset: set[str] | None = None
    response_body: bytearray = field(default_factory=bytearray)
    relay: SSERelay = field(default_factory=lambda: SSERelay(strip_usage=False))
    usage_unreadable: bool = False  # the stream broke the SSE framing: no usage read from it
    passing_through: bool = False  # a whole body too large to hold: passed on as it comes
    dispatch: Dispatch | None = None  # the pick, finished when the stream ends
    prefiller: str = ""  # a prefill/decode pool's prefill endpoint (the decode worker calls it)
    prefill_dispatch: Dispatch | None = None
    prompt_tokens: int | None = None  # the usage the endpoint answered with
    pool: str = ""
    creates_response: bool = False  # a Responses API create: its id is remembered
    deletes_response: str = ""  # the stored response a DELETE is about
    status: int = 0  # the response's
    restore: Restore | None = None  # puts the public model name back in what is answered


def _header_option(key: str, value: str) -> core.HeaderValueOption:
    """A header set on the request, replacing any value the client sent (Envoy's default
    action would append to it)."""
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, raw_value=value.encode()),
        append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def immediate(
    status: int, message: str, code: str | None, *, param: str | None = None, request_id: str = ""
) -> ep.ProcessingResponse:
    """The picker's own answer, as the gateway would give it (the request's id included)."""
    body = json.dumps(error_body(message, error_type_for(status), param, code))
    headers = [_header_option("content-type", "application/json")]
    if request_id:
        headers.append(_header_option("x-request-id", request_id))
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            body=body.encode(),
            headers=ep.HeaderMutation(set_headers=headers),
            details=f"inference error: {code}",
        )
    )


def body_chunks(
    data: bytes, phase: str, end_of_stream: bool = True
) -> Iterator[ep.ProcessingResponse]:
    """``data`` as streamed body replies of at most BODY_CHUNK bytes; EoS on the last one."""
    pieces = [data[i : i + BODY_CHUNK] for i in range(0, len(data), BODY_CHUNK)] or [b""]
    for index, piece in enumerate(pieces):
        last = end_of_stream and index == len(pieces) - 1
        mutation = ep.BodyMutation(
            streamed_response=ep.StreamedBodyResponse(body=piece, end_of_stream=last)
        )
        yield ep.ProcessingResponse(
            **{phase: ep.BodyResponse(response=ep.CommonResponse(body_mutation=mutation))}
        )


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy's ext_proc service (FULL_DUPLEX_STREAMED), picking with an ``EppService``."""

    def __init__(self, service: EppService) -> None:
        self.service = service

    async def Process(
        self, requests: AsyncIterator[ep.ProcessingRequest], context: object
    ) -> AsyncIterator[ep.ProcessingResponse]:
        state = StreamState()
        try:
            async for reply in self._process(state, requests):
                yield reply
        finally:  # the response ended, or Envoy gave up on the stream: no longer in flight
            if state.dispatch is not None:
                self.service.finished(state.dispatch, state.prompt_tokens)
            if state.prefill_dispatch is not None:
                self.service.finished(state.prefill_dispatch)

    async def _process(
        self, state: StreamState, requests: AsyncIterator[ep.ProcessingRequest]
    ) -> AsyncIterator[ep.ProcessingResponse]:
        async for request in requests:
            kind = request.WhichOneof("request")
            subset = _subset(request)
            if subset is not None:
                state.subset = subset
            if kind == "request_headers":
                state.headers = _read_headers(request.request_headers.headers)
                if self._declared_too_large(state):
                    yield self._too_large(state)
                elif request.request_headers.end_of_stream:  # no body (e.g. GET)
                    async for reply in self._route(state, has_body=False):
                        yield reply
            elif kind == "request_body":
                if state.routed:
                    continue  # refused already (413): Envoy ends the request
                state.body += request.request_body.body
                if len(state.body) > self.service.policy.listen.max_body_bytes:
                    yield self._too_large(state)
                elif request.request_body.end_of_stream:
                    async for reply in self._route(state, has_body=True):
                        yield reply
            elif kind == "request_trailers":
                # trailers end the body (HTTP/2, gRPC): route first, reply in Envoy's order
                if not state.routed:
                    async for reply in self._route(state, has_body=bool(state.body)):
                        yield reply
                yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
            elif kind == "response_headers":
                yield self._response_headers(state, request)
            elif kind == "response_body":
                for reply in self._response_body(state, request.response_body):
                    yield reply
            elif kind == "response_trailers":
                yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())

    def _declared_too_large(self, state: StreamState) -> bool:
        """Whether the request's ``content-length`` is over ``listen.max_body``: refused before
        any of the body is sent."""
        declared = state.headers.get("content-length", "")
        return declared.isdigit() and int(declared) > self.service.policy.listen.max_body_bytes

    def _too_large(self, state: StreamState) -> ep.ProcessingResponse:
        state.routed = True
        state.body = bytearray()
        self.service.metrics.rejections.labels("request_too_large").inc()
        limit = self.service.policy.listen.max_body_bytes
        request_id = state.headers.get("x-request-id", "")
        return immediate(413, body_too_large(limit), "request_too_large", request_id=request_id)

    async def _route(
        self, state: StreamState, *, has_body: bool
    ) -> AsyncIterator[ep.ProcessingResponse]:
        state.routed = True
        try:
            body = self._parse(state) if has_body else {}
            endpoint = await self._pick(state, body, state.subset)
        except PickError as exc:
            self.service.metrics.rejections.labels(exc.reason).inc()
            request_id = state.headers.get("x-request-id", "")
            yield immediate(
                exc.status, exc.message, exc.code, param=exc.param, request_id=request_id
            )
            return
        state.endpoint = endpoint
        new_body = b""
        if has_body and state.target_model == state.incoming_model:
            new_body = bytes(state.body)  # nothing to rewrite: no need to re-serialize
        elif has_body:
            body["model"] = state.target_model
            new_body = orjson.dumps(body)
        set_headers = [_header_option(DESTINATION, endpoint)]
        if state.prefiller:  # llm-d's flow: the decode worker runs the prefill hop itself
            set_headers += [_header_option(name, state.prefiller) for name in PREFILLER_HEADERS]
        if has_body:
            set_headers.append(_header_option("Content-Length", str(len(new_body))))
        set_headers += [
            _header_option(k, v)
            for k, v in state.headers.items()
            if not k.startswith(":") and k not in SYSTEM_OWNED and not is_client_routing(k)
        ]
        kept = {DESTINATION, *(PREFILLER_HEADERS if state.prefiller else ())}  # set above
        removed = [k for k in state.headers if is_client_routing(k) and k not in kept]
        metadata = struct_pb2.Struct()
        metadata.update({"envoy.lb": {DESTINATION: endpoint}})
        yield ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(
                response=ep.CommonResponse(
                    clear_route_cache=True,
                    header_mutation=ep.HeaderMutation(
                        set_headers=set_headers, remove_headers=removed
                    ),
                )
            ),
            dynamic_metadata=metadata,
        )
        if has_body:
            for reply in body_chunks(new_body, "request_body"):
                yield reply

    def _parse(self, state: StreamState) -> dict[str, object]:
        try:
            body = orjson.loads(state.body)
        except ValueError as exc:
            raise PickError(400, invalid_json(exc), "bad_request", code=None) from exc
        if not isinstance(body, dict):
            raise PickError(400, NOT_AN_OBJECT, "bad_request", code=None)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise PickError(400, MODEL_REQUIRED, "bad_request", code=None, param="model")
        state.stream_requested = body.get("stream") is True
        path = state.headers.get(":path", "/v1/completions").split("?")[0]
        needed = next((f for suffix, f in REQUIRED_FIELD.items() if path.endswith(suffix)), None)
        if needed and not body.get(needed):
            raise PickError(
                400, f"'{needed}' is required for {path}", "bad_request", code=None, param=needed
            )
        if path.endswith(RESPONSES_PATH):
            state.relay = ResponsesRelay()
            state.creates_response = True
        return body

    async def _pick(
        self, state: StreamState, body: dict[str, object], subset: set[str] | None
    ) -> str:
        request_id = state.headers.get("x-request-id") or new_request_id()
        state.headers["x-request-id"] = request_id
        addressed = None if body else addressed_response(state.headers.get(":path", ""))
        if addressed is not None:
            return await self._pick_stored(state, addressed[0], subset)
        incoming = body.get("model") if body else None
        model = incoming if isinstance(incoming, str) else ""
        pool = (
            self.service.pool_for_model(model) if model else next(iter(self.service.policy.pools))
        )
        if pool is None:
            raise PickError(404, unknown_model(model), "model_not_found", param="model")
        rewrite = state.headers.get(REWRITE)
        state.pool, state.incoming_model = pool, model
        state.target_model = rewrite or self.service.target_model(pool, model)
        state.restore = model_restorer(state.target_model, model)
        candidates = self.service.candidates(pool, None, subset)
        if not candidates:
            raise PickError(
                503, "failed to find endpoint candidates for serving the request", "no_candidates"
            )
        # GIE's rule: an objective of negative priority is sheddable
        priority = self.service.policy.epp.priority_of(state.headers.get(OBJECTIVE, ""))
        if priority < 0 and self.service.saturation.all_saturated(candidates):
            raise PickError(429, "system saturated, sheddable request dropped", "shed")
        if isinstance(state.relay, ResponsesRelay):  # routed on the chat messages it renders to
            body = {**body, "messages": input_messages(body)}
        scheduling = self.service.scheduling_request(
            pool, request_id, state.target_model, body, state.headers
        )
        previous = body.get("previous_response_id") if state.creates_response else None
        if isinstance(previous, str) and previous:  # where the conversation it continues is
            home = await self.service.responses.home(previous, {pool: candidates})
            if home is not None:
                state.dispatch = self.service.dispatched(scheduling, home[1])
                return home[1].address
        decision = self.service.pick(pool, scheduling, subset=subset)
        target = decision.result.target
        if target is None:
            raise PickError(429, "failed to find target endpoint", "no_endpoint")
        # Envoy sends the request as soon as this reply arrives: it is dispatched now.
        state.dispatch = self.service.dispatched(scheduling, target)
        if decision.prefill is not None:
            state.prefiller = decision.prefill.address
            state.prefill_dispatch = self.service.dispatched(scheduling, decision.prefill)
        return target.address

    async def _pick_stored(
        self, state: StreamState, response_id: str, subset: set[str] | None
    ) -> str:
        """The endpoint holding the stored response a request is about (404 when none has
        it)."""
        pools = self.service.policy.pools
        candidates = {pool: self.service.candidates(pool, None, subset) for pool in pools}
        home = await self.service.responses.home(response_id, candidates)
        if home is None:
            message = response_not_found(response_id)
            raise PickError(404, message, "not_found", param="response_id")
        pool, endpoint, model = home
        state.pool, state.incoming_model = pool, model
        state.restore = model_restorer(self.service.target_model(pool, model), model)
        if state.headers.get(":method") == "DELETE":
            state.deletes_response = response_id
        scheduling = self.service.scheduling_request(
            pool, state.headers["x-request-id"], "", {}, state.headers
        )
        state.dispatch = self.service.dispatched(scheduling, endpoint)
        return endpoint.address

    def _response_headers(
        self, state: StreamState, request: ep.ProcessingRequest
    ) -> ep.ProcessingResponse:
        headers = _read_headers(request.response_headers.headers)
        status = headers.get(":status", "")
        state.status = int(status) if status.isdigit() else 0
        if state.deletes_response and state.status == 200:
            self.service.responses.deleted(state.deletes_response)
        # streamed as the response says, or as the request asked when the response does not
        # say it is whole JSON (GIE reads the request's "stream" too)
        content_type = headers.get("content-type", "")
        state.streaming = "text/event-stream" in content_type or (
            state.stream_requested and "json" not in content_type
        )
        served = request.metadata_context.filter_metadata.get("envoy.lb")
        if served is not None and SERVED in served.fields:
            state.served = served.fields[SERVED].string_value
        return ep.ProcessingResponse(
            response_headers=ep.HeadersResponse(response=ep.CommonResponse())
        )

    def _response_body(
        self, state: StreamState, body: ep.HttpBody
    ) -> Iterator[ep.ProcessingResponse]:
        if state.streaming:
            if body.body and state.dispatch is not None:  # the first token is on its way back
                self.service.prefilled(state.dispatch)
            if not state.usage_unreadable:
                try:
                    state.relay.feed(body.body)
                except EventTooLarge:  # not SSE: passed on as it is, its usage not counted
                    state.usage_unreadable = True
            if body.end_of_stream and state.relay.usage:
                self._count_usage(state, state.relay.usage)
            if body.end_of_stream and isinstance(state.relay, ResponsesRelay):
                self._created(state, state.relay.response_id)
            yield from body_chunks(
                self._restore_model(state, body.body), "response_body", body.end_of_stream
            )
            return
        if state.passing_through:
            yield from body_chunks(body.body, "response_body", body.end_of_stream)
            return
        state.response_body += body.body
        if len(state.response_body) > MAX_UPSTREAM_BODY and not body.end_of_stream:
            # too large to hold whole: passed on as it comes, its usage and model name as sent
            data, state.response_body = bytes(state.response_body), bytearray()
            state.passing_through = True
            yield from body_chunks(data, "response_body", end_of_stream=False)
            return
        if not body.end_of_stream:
            return
        data = bytes(state.response_body)
        usage = usage_of(data)
        if usage is not None:
            self._count_usage(state, usage)
        self._created(state, id_in_body(data) if state.creates_response else "")
        yield from body_chunks(self._restore_model(state, data), "response_body")

    def _created(self, state: StreamState, response_id: str) -> None:
        """A Responses API create answered: where the new response lives is remembered."""
        if state.creates_response and state.status == 200 and response_id:
            responses = self.service.responses
            responses.created(response_id, state.pool, state.endpoint, state.incoming_model)

    def _restore_model(self, state: StreamState, data: bytes) -> bytes:
        return data if state.restore is None else state.restore(data)

    def _count_usage(self, state: StreamState, usage: dict[str, object]) -> None:
        prompt, completion = chat_usage(usage)
        for value, direction in ((prompt, "prompt"), (completion, "completion")):
            if isinstance(value, int):
                self.service.metrics.tokens.labels(direction).inc(value)
        if isinstance(prompt, int):
            state.prompt_tokens = prompt


def _read_headers(header_map: core.HeaderMap) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode() if h.raw_value else h.value)
        for h in header_map.headers
    }


def _subset(request: ep.ProcessingRequest) -> set[str] | None:
    hint = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    return {v.string_value.rsplit(":", 1)[0] for v in hint.fields[SUBSET_KEY].list_value.values}
