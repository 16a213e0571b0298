"""ext_proc counts a request in flight at its endpoint from the pick until its stream ends,
however it ends (in process: the servicer driven as Envoy would)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from epp.servers.ext_proc import ExternalProcessor
from epp.service import EppService
from loadtest.client.envoy_messages import body_messages, headers_message
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
