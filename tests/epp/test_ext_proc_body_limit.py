"""ext_proc holds a request's body until it can route on it; a body over the policy's
``listen.max_body_bytes`` is refused with a 413 as soon as it is, not held (in process: the
servicer driven as Envoy would)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from epp.servers.ext_proc import ExternalProcessor
from epp.service import EppService
from loadtest.client.envoy_messages import body_messages, headers_message
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
