"""A do-nothing ext_proc server with the same gRPC settings as ``kvgate epp``: the floor of
any Python ext_proc server, for ``bench_epp`` to compare against in the same run.

It answers each request the way the EPP does (a header response once the body has ended, then
the body echoed in one streamed chunk) without parsing or picking anything.

``python -m loadtest.bench.null_ext_proc PORT``
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from epp.server import MAX_MESSAGE
from epp.servers.ext_proc import body_chunks


class NullProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(
        self, requests: AsyncIterator[ep.ProcessingRequest], context: object
    ) -> AsyncIterator[ep.ProcessingResponse]:
        body = bytearray()
        async for request in requests:
            if request.WhichOneof("request") != "request_body":
                continue
            body += request.request_body.body
            if request.request_body.end_of_stream:
                yield ep.ProcessingResponse(
                    request_headers=ep.HeadersResponse(
                        response=ep.CommonResponse(clear_route_cache=True)
                    )
                )
                for reply in body_chunks(bytes(body), "request_body"):
                    yield reply


async def serve(port: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(NullProcessor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
