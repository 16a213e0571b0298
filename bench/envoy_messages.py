"""The messages Envoy sends an ext_proc server for one request (headers, then the body in
chunks), built with ``xds-protos``; shared by ``bench_epp`` and the ext_proc tests."""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf import struct_pb2

from epp.servers.ext_proc_messages import BODY_CHUNK, SUBSET_NAMESPACE
from kvgate.api.envoy import base_pb2 as core
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.wire.routing_headers import SUBSET_KEY


def headers_message(
    headers: Mapping[str, str], *, end: bool = False, subset: list[str] | None = None
) -> ep.ProcessingRequest:
    """The request headers; ``subset``: the endpoint subset hint Envoy passes as metadata."""
    request = ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(
            headers=core.HeaderMap(
                headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            ),
            end_of_stream=end,
        )
    )
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({SUBSET_KEY: subset})
        request.metadata_context.filter_metadata[SUBSET_NAMESPACE].CopyFrom(hint)
    return request


def body_messages(body: bytes, chunk: int = BODY_CHUNK) -> list[ep.ProcessingRequest]:
    """The body in pieces of at most ``chunk`` bytes, end of stream on the last."""
    chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return [
        ep.ProcessingRequest(request_body=ep.HttpBody(body=c, end_of_stream=i == len(chunks) - 1))
        for i, c in enumerate(chunks)
    ]
