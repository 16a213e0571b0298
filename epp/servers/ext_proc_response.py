"""The response half of an ext_proc stream: what the endpoint answers is read as it passes
through (usage counted, a stored response's home remembered, the route's public model name put
back) and echoed to Envoy chunk by chunk (FULL_DUPLEX_STREAMED). A stream's events are echoed
as they come; a whole answer is held until its end (up to ``MAX_UPSTREAM_BODY``, then passed on
as it comes, its usage not read)."""

from __future__ import annotations

from epp.servers.ext_proc_messages import StreamState, body_chunks, read_headers
from epp.service import EppService
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.wire.http.client import MAX_UPSTREAM_BODY
from kvgate.wire.responses_api import id_in_body
from kvgate.wire.routing_headers import SERVED
from kvgate.wire.sse import EventTooLarge, ResponsesRelay, usage_of
from kvgate.wire.token_usage import token_counts

HEADERS_KEPT = ep.ProcessingResponse(
    response_headers=ep.HeadersResponse(response=ep.CommonResponse())
)


class ResponsePath:
    """Reads and echoes the responses of one picker's streams."""

    def __init__(self, service: EppService) -> None:
        self.service = service

    def headers(self, state: StreamState, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        headers = read_headers(request.response_headers.headers)
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
        return HEADERS_KEPT

    def body(self, state: StreamState, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        if state.streaming:
            return self._stream_chunk(state, body)
        return self._whole_body_chunk(state, body)

    def _stream_chunk(self, state: StreamState, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        """One chunk of a stream, echoed as it came; where the model name is restored, as the
        complete events it ends (a name Envoy's chunks cut in two is still found)."""
        chunk, end = body.body, body.end_of_stream
        if chunk and state.dispatch is not None:  # the first token is on its way back
            self.service.prefilled(state.dispatch)
        out = chunk
        if not state.usage_unreadable:
            relay = state.relay
            try:
                events = relay.feed(chunk)
                if state.restore is not None:
                    out = events + relay.pending if end else events
            except EventTooLarge:  # not SSE: passed on as it is, its usage not counted
                state.usage_unreadable = True
                if state.restore is not None:
                    out = relay.pending  # what was held back, this chunk included
        if end:
            if state.relay.usage:
                self._count_usage(state, state.relay.usage)
            if isinstance(state.relay, ResponsesRelay):
                self._created(state, state.relay.response_id)
        restore = state.restore
        return body_chunks(out if restore is None else restore(out), "response_body", end)

    def _whole_body_chunk(
        self, state: StreamState, body: ep.HttpBody
    ) -> list[ep.ProcessingResponse]:
        if state.passing_through:
            return body_chunks(body.body, "response_body", body.end_of_stream)
        state.response_body += body.body
        if len(state.response_body) > MAX_UPSTREAM_BODY and not body.end_of_stream:
            # too large to hold whole: passed on as it comes, its usage and model name as sent
            data, state.response_body = bytes(state.response_body), bytearray()
            state.passing_through = True
            return body_chunks(data, "response_body", end_of_stream=False)
        if not body.end_of_stream:
            return []
        data = bytes(state.response_body)
        usage = usage_of(data)
        if usage is not None:
            self._count_usage(state, usage)
        self._created(state, id_in_body(data) if state.creates_response else "")
        restore = state.restore
        return body_chunks(data if restore is None else restore(data), "response_body")

    def _created(self, state: StreamState, response_id: str) -> None:
        """A Responses API create answered: where the new response lives is remembered."""
        if state.creates_response and state.status == 200 and response_id:
            responses = self.service.responses
            responses.created(response_id, state.pool, state.endpoint, state.incoming_model)

    def _count_usage(self, state: StreamState, usage: dict[str, object]) -> None:
        prompt, completion, _ = token_counts(usage)
        metrics = self.service.metrics
        for value, direction in ((prompt, "prompt"), (completion, "completion")):
            if isinstance(value, int):
                metrics.child(metrics.tokens, direction).inc(value)
        if isinstance(prompt, int):
            state.prompt_tokens = prompt
