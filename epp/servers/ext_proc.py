"""Envoy ext_proc with the Gateway API Inference Extension's protocol (FULL_DUPLEX_STREAMED).

Request path: headers are stored and answered only once the body has ended; then the EPP
parses the body, picks an endpoint and replies, in order, with the header response
(``x-gateway-destination-endpoint``, ``Content-Length``, an ``x-request-id`` if the request had
none; ``envoy.lb`` dynamic metadata with the same endpoint) and the body — re-serialized with
the target model — in ``streamed_response`` chunks of at most 62,000 bytes. The request's other
headers are left as they are (GIE echoes them back; Envoy keeps them either way, and each echoed
header costs both sides). A request about a stored response goes where it lives. The response
path is ``ext_proc_response``'s. Errors are ``ImmediateResponse``s with the gateway's bodies:
400 bad body, 404 unknown model or stored response, 413 a body over ``listen.max_body`` (at its
``content-length`` already), 429 shed or no endpoint left after filtering, 503 no candidates
(including an empty subset hint).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson

from epp.servers.ext_proc_messages import (
    StreamState,
    body_chunks,
    header_option,
    immediate,
    lb_metadata,
    read_headers,
    subset_hint,
)
from epp.servers.ext_proc_response import ResponsePath
from epp.service import EppService
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from kvgate.wire.messages_api import MESSAGES_PATH, chat_messages
from kvgate.wire.model_name import model_restorer
from kvgate.wire.openai_errors import (
    MODEL_REQUIRED,
    NOT_AN_OBJECT,
    body_too_large,
    invalid_json,
    response_not_found,
    unknown_model,
)
from kvgate.wire.request_id import new_request_id
from kvgate.wire.responses_api import (
    RESPONSES_PATH,
    addressed_response,
    input_messages,
)
from kvgate.wire.routing_headers import (
    DESTINATION,
    INFERENCE_OBJECTIVE,
    PREFILLER_HEADERS,
    is_client_routing,
)
from kvgate.wire.sse import MessagesRelay, ResponsesRelay

log = logging.getLogger("kvgate.epp")

OBJECTIVE = INFERENCE_OBJECTIVE
FAIRNESS, REWRITE = ("x-gateway-inference-fairness-id", "x-gateway-model-name-rewrite")
REQUIRED_FIELD = {
    "/chat/completions": "messages",
    "/completions": "prompt",
    "/embeddings": "input",
    "/responses": "input",
    "/messages": "messages",
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


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):
    """Envoy's ext_proc service (FULL_DUPLEX_STREAMED), picking with an ``EppService``."""

    def __init__(self, service: EppService) -> None:
        self.service = service
        self.responses = ResponsePath(service)

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
            if kind == "request_headers":
                state.subset = subset_hint(request)
                state.headers = read_headers(request.request_headers.headers)
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
                yield self.responses.headers(state, request)
            elif kind == "response_body":
                for reply in self.responses.body(state, request.response_body):
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
        limit = self.service.policy.listen.max_body_bytes
        return self._refused(state, PickError(413, body_too_large(limit), "request_too_large"))

    def _refused(self, state: StreamState, error: PickError) -> ep.ProcessingResponse:
        """The picker's own answer to a request it refuses, counted by its reason."""
        self.service.metrics.rejections.labels(error.reason).inc()
        return immediate(
            error.status,
            error.message,
            error.code,
            param=error.param,
            request_id=state.headers.get("x-request-id", ""),
            path=state.headers.get(":path", "").partition("?")[0],
        )

    async def _route(
        self, state: StreamState, *, has_body: bool
    ) -> AsyncIterator[ep.ProcessingResponse]:
        state.routed = True
        try:
            body = self._parse(state) if has_body else {}
            endpoint = await self._pick(state, body, state.subset)
        except PickError as exc:
            yield self._refused(state, exc)
            return
        state.endpoint = endpoint
        new_body = b""
        if has_body and state.target_model == state.incoming_model:
            new_body = bytes(state.body)  # nothing to rewrite: no need to re-serialize
        elif has_body:
            body["model"] = state.target_model
            new_body = orjson.dumps(body)
        set_headers = [header_option(DESTINATION, endpoint)]
        if state.prefiller:  # llm-d's flow: the decode worker runs the prefill hop itself
            set_headers += [header_option(name, state.prefiller) for name in PREFILLER_HEADERS]
        if has_body:
            set_headers.append(header_option("Content-Length", str(len(new_body))))
        if state.new_request_id:  # the request's own headers stay as they are: not echoed
            set_headers.append(header_option("x-request-id", state.headers["x-request-id"]))
        kept = {DESTINATION, *(PREFILLER_HEADERS if state.prefiller else ())}  # set above
        removed = [k for k in state.headers if is_client_routing(k) and k not in kept]
        yield ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(
                response=ep.CommonResponse(
                    clear_route_cache=True,
                    header_mutation=ep.HeaderMutation(
                        set_headers=set_headers, remove_headers=removed
                    ),
                )
            ),
            dynamic_metadata=lb_metadata(endpoint),
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
        elif path.endswith(MESSAGES_PATH):
            state.relay = MessagesRelay()
        return body

    async def _pick(
        self, state: StreamState, body: dict[str, object], subset: set[str] | None
    ) -> str:
        request_id = state.headers.get("x-request-id", "")
        if not request_id:
            request_id = state.headers["x-request-id"] = new_request_id()
            state.new_request_id = True
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
        # routed on the chat messages a response's input or a message's content renders to
        if isinstance(state.relay, ResponsesRelay):
            body = {**body, "messages": input_messages(body)}
        elif isinstance(state.relay, MessagesRelay):
            body = {**body, "messages": chat_messages(body)}
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
