"""ext_proc counts a request in flight at its endpoint from the pick until its stream ends,
however it ends (in process: the servicer driven as Envoy would)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from bench.envoy_messages import body_messages, headers_message
from epp.servers.ext_proc import ExternalProcessor
from epp.service import EppService
from kvgate.api.envoy import base_pb2 as core
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.wire.sse import MAX_EVENT_BYTES
from policies.loader import load_policy_text

POLICY = "pools: {p: {endpoints: [127.0.0.2:9, 127.0.0.3:9]}}\nroutes: [{model: m, pool: p}]\n"
HEADERS = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}
BODY = json.dumps({"model": "m", "prompt": "hello"}).encode()


async def test_in_flight_from_the_pick_to_the_end_of_the_stream() -> None:
    service = EppService(load_policy_text(POLICY))
    processor = ExternalProcessor(service)
    seen: list[int] = []

    async def envoy() -> AsyncIterator[ep.ProcessingRequest]:
        yield headers_message(HEADERS)
        for message in body_messages(BODY):
            yield message
        seen.append(sum(e.in_flight for e in service.datastore.endpoints("p")))
        # the client goes away before any response: the stream just ends

    replies = [r async for r in processor.Process(envoy(), None)]
    assert replies[0].WhichOneof("response") == "request_headers"
    assert seen == [1]  # picked and sent
    assert sum(e.in_flight for e in service.datastore.endpoints("p")) == 0


async def test_tokens_in_flight_follow_the_streamed_response() -> None:
    """A streamed response's first body chunk ends the prompt's count; its end, the output's;
    the usage in its last event is what the approximate index learns the endpoint's tokens from."""
    service = EppService(load_policy_text(POLICY))
    processor = ExternalProcessor(service)
    body = json.dumps({"model": "m", "prompt": "x" * 2_400, "max_tokens": 5, "stream": True})
    counts: list[tuple[int, int]] = []

    def count() -> None:
        endpoints = service.datastore.endpoints("p")
        counts.append(
            (
                sum(e.load.prefill_tokens for e in endpoints),
                sum(e.load.decode_tokens for e in endpoints),
            )
        )

    first = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
    last = b'data: {"choices":[],"usage":{"prompt_tokens":2400,"completion_tokens":5}}\n\ndata: [DONE]\n\n'

    async def envoy() -> AsyncIterator[ep.ProcessingRequest]:
        yield headers_message(HEADERS)
        for message in body_messages(body.encode()):
            yield message
        count()
        yield ep.ProcessingRequest(
            response_headers=ep.HttpHeaders(
                headers=core.HeaderMap(
                    headers=[core.HeaderValue(key="content-type", raw_value=b"text/event-stream")]
                )
            )
        )
        yield ep.ProcessingRequest(response_body=ep.HttpBody(body=first))
        count()
        yield ep.ProcessingRequest(response_body=ep.HttpBody(body=last, end_of_stream=True))

    _ = [r async for r in processor.Process(envoy(), None)]
    count()
    assert counts == [(600, 5), (0, 5), (0, 0)]  # 2,400 characters at the configured 4 per token
    assert service.prefix is not None
    learned = service.prefix.chars_per_token.of  # type: ignore[attr-defined]
    assert sorted([learned("127.0.0.2:9"), learned("127.0.0.3:9")], key=str) == [1.0, None]


async def test_a_streamed_response_that_never_ends_an_event_still_passes_through() -> None:
    """Past the relay's limit ext_proc stops reading usage from the stream, passes the body on
    and still ends the request's count when the stream ends."""
    service = EppService(load_policy_text(POLICY))
    processor = ExternalProcessor(service)
    body = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode()
    chunk = b"x" * (1 << 20)
    chunks = MAX_EVENT_BYTES // len(chunk) + 2

    async def envoy() -> AsyncIterator[ep.ProcessingRequest]:
        yield headers_message(HEADERS)
        for message in body_messages(body):
            yield message
        yield ep.ProcessingRequest(
            response_headers=ep.HttpHeaders(
                headers=core.HeaderMap(
                    headers=[core.HeaderValue(key="content-type", raw_value=b"text/event-stream")]
                )
            )
        )
        yield ep.ProcessingRequest(response_body=ep.HttpBody(body=b"data: "))
        for number in range(chunks):
            last = number == chunks - 1
            yield ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk, end_of_stream=last))

    replies = [r async for r in processor.Process(envoy(), None)]
    passed = b"".join(
        r.response_body.response.body_mutation.streamed_response.body
        for r in replies
        if r.WhichOneof("response") == "response_body"
    )
    assert passed == b"data: " + chunk * chunks  # every byte passed on
    assert sum(e.in_flight for e in service.datastore.endpoints("p")) == 0
