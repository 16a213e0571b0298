"""ext_proc holds a request's body until it can route on it; a body over the policy's
``listen.max_body_bytes`` is refused with a 413 as soon as it is, not held (in process: the
servicer driven as Envoy would)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from bench.envoy_messages import body_messages, headers_message
from epp.servers import ext_proc_response
from epp.servers.ext_proc import ExternalProcessor
from epp.service import EppService
from kvgate.api.envoy import external_processor_pb2 as ep
from policies.loader import load_policy_text

POLICY = """
listen: {max_body: 100000}
pools: {p: {endpoints: [127.0.0.2:9]}}
routes: [{model: m, pool: p}]
"""
HEADERS = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}


async def replies_to(body: bytes) -> list[ep.ProcessingResponse]:
    processor = ExternalProcessor(EppService(load_policy_text(POLICY)))

    async def envoy() -> AsyncIterator[ep.ProcessingRequest]:
        yield headers_message(HEADERS)
        for message in body_messages(body, chunk=10_000):
            yield message

    return [r async for r in processor.Process(envoy(), None)]


async def test_a_body_over_the_limit_is_refused_with_413() -> None:
    body = json.dumps({"model": "m", "prompt": "x" * 200_000}).encode()
    replies = await replies_to(body)
    assert [r.WhichOneof("response") for r in replies] == ["immediate_response"]
    refusal = replies[0].immediate_response
    assert refusal.status.code == 413
    assert json.loads(refusal.body)["error"]["code"] == "request_too_large"


async def test_a_body_within_the_limit_is_routed() -> None:
    body = json.dumps({"model": "m", "prompt": "x" * 50_000}).encode()
    replies = await replies_to(body)
    assert replies[0].WhichOneof("response") == "request_headers"


async def test_a_whole_response_too_large_to_hold_is_passed_on_as_it_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ext_proc_response, "MAX_UPSTREAM_BODY", 100_000)
    processor = ExternalProcessor(EppService(load_policy_text(POLICY)))
    answer = b'{"choices": [], "pad": "' + b"x" * 300_000 + b'"}'
    pieces = [answer[i : i + 50_000] for i in range(0, len(answer), 50_000)]
    held: list[int] = []  # body replies so far, after each piece Envoy sends

    async def envoy() -> AsyncIterator[ep.ProcessingRequest]:
        yield headers_message(HEADERS)
        for message in body_messages(json.dumps({"model": "m", "prompt": "x"}).encode()):
            yield message
        yield ep.ProcessingRequest(response_headers=ep.HttpHeaders())
        for number, piece in enumerate(pieces):
            last = number == len(pieces) - 1
            yield ep.ProcessingRequest(response_body=ep.HttpBody(body=piece, end_of_stream=last))
            held.append(len(bodies(replies)))

    replies: list[ep.ProcessingResponse] = []
    async for reply in processor.Process(envoy(), None):
        replies.append(reply)
    assert b"".join(bodies(replies)) == answer  # every byte, in order
    assert held[2] > 0  # passed on before the body ended: past the limit it is not held


def bodies(replies: list[ep.ProcessingResponse]) -> list[bytes]:
    return [
        r.response_body.response.body_mutation.streamed_response.body
        for r in replies
        if r.WhichOneof("response") == "response_body"
    ]
