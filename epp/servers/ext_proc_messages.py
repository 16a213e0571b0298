"""What one ext_proc stream keeps (``StreamState``) and the messages it exchanges with Envoy:
headers read, header options, body replies in chunks, error replies, routing metadata."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import cast

from google.protobuf import struct_pb2

from epp.service import Dispatch
from kvgate.api.envoy import base_pb2 as core
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.api.envoy import http_status_pb2
from kvgate.wire.messages_api import MESSAGES_PATH
from kvgate.wire.messages_api import error_body as messages_error_body
from kvgate.wire.model_name import Restore
from kvgate.wire.openai_errors import error_body, error_type_for
from kvgate.wire.routing_headers import DESTINATION, SUBSET_KEY
from kvgate.wire.sse import SSERelay

BODY_CHUNK = 62_000  # GIE's limit, a margin under Envoy's 64 KiB
SUBSET_NAMESPACE = "envoy.lb.subset_hint"


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
    new_request_id: bool = False  # the request came without an x-request-id: one was made
    restore: Restore | None = None  # puts the public model name back in what is answered


def header_option(key: str, value: str) -> core.HeaderValueOption:
    """A header set on the request, replacing any value the client sent (Envoy's default
    action would append to it)."""
    return core.HeaderValueOption(
        header=core.HeaderValue(key=key, raw_value=value.encode()),
        append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def immediate(
    status: int,
    message: str,
    code: str | None,
    *,
    param: str | None = None,
    request_id: str = "",
    path: str = "",
) -> ep.ProcessingResponse:
    """The picker's own answer, as the gateway would give it to a request for ``path`` (the
    request's id included)."""
    if path == MESSAGES_PATH:
        body = json.dumps(messages_error_body(status, message))
    else:
        body = json.dumps(error_body(message, error_type_for(status), param, code))
    headers = [header_option("content-type", "application/json")]
    if request_id:
        headers.append(header_option("x-request-id", request_id))
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=cast(http_status_pb2.StatusCode, status)),
            body=body.encode(),
            headers=ep.HeaderMutation(set_headers=headers),
            details=f"inference error: {code}",
        )
    )


def body_chunks(data: bytes, phase: str, end_of_stream: bool = True) -> list[ep.ProcessingResponse]:
    """``data`` as streamed body replies of at most BODY_CHUNK bytes; EoS on the last one."""
    if len(data) <= BODY_CHUNK:  # as a rule: one reply
        return [_body_reply(data, phase, end_of_stream)]
    pieces = [data[i : i + BODY_CHUNK] for i in range(0, len(data), BODY_CHUNK)]
    last = len(pieces) - 1
    return [_body_reply(p, phase, end_of_stream and i == last) for i, p in enumerate(pieces)]


def _body_reply(piece: bytes, phase: str, end_of_stream: bool) -> ep.ProcessingResponse:
    mutation = ep.BodyMutation(
        streamed_response=ep.StreamedBodyResponse(body=piece, end_of_stream=end_of_stream)
    )
    reply = ep.BodyResponse(response=ep.CommonResponse(body_mutation=mutation))
    if phase == "request_body":
        return ep.ProcessingResponse(request_body=reply)
    return ep.ProcessingResponse(response_body=reply)


@functools.lru_cache(maxsize=4096)
def lb_metadata(endpoint: str) -> struct_pb2.Struct:
    """The ``envoy.lb`` dynamic metadata naming ``endpoint`` (built once per endpoint; a reply
    copies it)."""
    metadata = struct_pb2.Struct()
    metadata.update({"envoy.lb": {DESTINATION: endpoint}})
    return metadata


def read_headers(header_map: core.HeaderMap) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode() if h.raw_value else h.value)
        for h in header_map.headers
    }


def subset_hint(request: ep.ProcessingRequest) -> set[str] | None:
    hint = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    return {v.string_value.rsplit(":", 1)[0] for v in hint.fields[SUBSET_KEY].list_value.values}
