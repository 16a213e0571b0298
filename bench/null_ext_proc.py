"""A do-nothing ext_proc server with the same gRPC settings as ``kvgate epp``: the floor of
any Python ext_proc server, for ``bench_epp`` to compare against in the same run.

It answers each message the way the EPP does (a header response once the body has ended,
naming the next of ``ENDPOINT``s in turn in ``envoy.lb`` metadata, then the body echoed in
streamed chunks; the response's headers, body chunks and trailers echoed) without parsing or
picking anything.

``python -m bench.null_ext_proc PORT [ENDPOINT ...]``
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator

import grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.server import MAX_MESSAGE
from epp.servers.ext_proc_messages import body_chunks
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc


class NullProcessor(ep_grpc.ExternalProcessorServicer):
    def __init__(self, endpoints: list[str]) -> None:
        self._next = itertools.cycle(endpoints or ["127.0.0.1:1"])

    async def Process(
        self, requests: AsyncIterator[ep.ProcessingRequest], context: object
    ) -> AsyncIterator[ep.ProcessingResponse]:
        body = bytearray()
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "request_headers" and request.request_headers.end_of_stream:
                yield self._routed()
            elif kind == "request_body":
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    yield self._routed()
                    for reply in body_chunks(bytes(body), "request_body"):
                        yield reply
            elif kind == "response_headers":
                yield ep.ProcessingResponse(
                    response_headers=ep.HeadersResponse(response=ep.CommonResponse())
                )
            elif kind == "response_body":
                chunk = request.response_body
                for reply in body_chunks(chunk.body, "response_body", chunk.end_of_stream):
                    yield reply
            elif kind == "request_trailers":
                yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
            elif kind == "response_trailers":
                yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())

    def _routed(self) -> ep.ProcessingResponse:
        metadata = struct_pb2.Struct()
        metadata.update({"envoy.lb": {"x-gateway-destination-endpoint": next(self._next)}})
        return ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(response=ep.CommonResponse(clear_route_cache=True)),
            dynamic_metadata=metadata,
        )


async def serve(port: int, endpoints: list[str]) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(NullProcessor(endpoints), server)  # type: ignore[no-untyped-call]
    checks = health.aio.HealthServicer()  # Envoy's health checks of the ext_proc service
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    service = ep.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
    await checks.set(service, health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2:]))
