"""`kvgate epp` driven over gRPC the way Envoy drives GIE's picker, plus the Pick API and health."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.envoy_messages import body_messages, headers_message
from kvgate.api import epp_pb2, epp_pb2_grpc
from kvgate.api.envoy import base_pb2 as core
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from loadtest.harness.processes import epp_process, free_port

ENDPOINTS = ["127.0.0.2:{p}", "127.0.0.3:{p}"]  # loopback addresses nothing listens on


@pytest.fixture(scope="module")
def epp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    directory: Path = tmp_path_factory.mktemp("epp")
    dead = free_port()
    endpoints = ", ".join(e.format(p=dead) for e in ENDPOINTS)
    policy = directory / "policy.yaml"
    policy.write_text(f"""
pools:
  main: {{model: upstream-model, endpoints: [{endpoints}]}}
routes: [{{model: public-model, pool: main}}]
""")
    grpc_port, metrics_port = free_port(), free_port()
    with epp_process(str(policy), grpc_port, metrics_port):
        yield f"127.0.0.1:{grpc_port}", metrics_port


def body_msgs(body: bytes, pieces: int = 3) -> list[ep.ProcessingRequest]:
    return body_messages(body, max(1, len(body) // pieces + 1))


def exchange(target: str, messages: list[ep.ProcessingRequest]) -> list[ep.ProcessingResponse]:
    with grpc.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stub = ep_grpc.ExternalProcessorStub(channel)  # type: ignore[no-untyped-call]
        return list(stub.Process(iter(messages), timeout=10))


REQUEST_HEADERS = {
    ":path": "/v1/chat/completions",
    ":method": "POST",
    "x-request-id": "req-1",
    "content-type": "application/json",
    "x-custom": "kept",
    "x-gateway-inference-fairness-id": "tenant-a",
}


def chat_body(content: str = "hello") -> bytes:
    return json.dumps(
        {
            "model": "public-model",
            "messages": [{"role": "user", "content": content}],
            "stream": True,
        }
    ).encode()


def set_headers(reply: ep.ProcessingResponse) -> dict[str, str]:
    mutation = reply.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def test_request_path_like_gie(epp: tuple[str, int]) -> None:
    target, _ = epp
    replies = exchange(target, [headers_message(REQUEST_HEADERS), *body_msgs(chat_body())])
    first, *body_replies = replies
    assert first.WhichOneof("response") == "request_headers"
    assert first.request_headers.response.clear_route_cache
    headers = set_headers(first)
    endpoint = headers["x-gateway-destination-endpoint"]
    assert endpoint in {e.format(p=endpoint.rsplit(":", 1)[1]) for e in ENDPOINTS}
    lb = first.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == endpoint
    # the request's own headers are left as they are (not echoed back as GIE does: Envoy keeps
    # them, and every echoed header costs both sides)
    assert "x-custom" not in headers and "x-request-id" not in headers
    assert "x-gateway-inference-fairness-id" not in headers and ":path" not in headers
    body = b"".join(
        r.request_body.response.body_mutation.streamed_response.body for r in body_replies
    )
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body)["model"] == "upstream-model"  # the route's rewrite
    assert body_replies[-1].request_body.response.body_mutation.streamed_response.end_of_stream
    assert (
        first.request_headers.response.header_mutation.set_headers[0].header.key
        == "x-gateway-destination-endpoint"
    )


def test_one_megabyte_body_is_rechunked(epp: tuple[str, int]) -> None:
    target, _ = epp
    big = chat_body("x" * 1_000_000)
    replies = exchange(target, [headers_message(REQUEST_HEADERS), *body_msgs(big, pieces=20)])
    chunks = [r.request_body.response.body_mutation.streamed_response for r in replies[1:]]
    assert all(len(c.body) <= 62_000 for c in chunks) and len(chunks) == 17
    assert [c.end_of_stream for c in chunks] == [False] * 16 + [True]
    assert len(json.loads(b"".join(c.body for c in chunks))["messages"][0]["content"]) == 1_000_000


def test_model_name_rewrite_header_wins(epp: tuple[str, int]) -> None:
    target, _ = epp
    headers = {**REQUEST_HEADERS, "x-gateway-model-name-rewrite": "other-model"}
    replies = exchange(target, [headers_message(headers), *body_msgs(chat_body())])
    body = b"".join(
        r.request_body.response.body_mutation.streamed_response.body for r in replies[1:]
    )
    assert json.loads(body)["model"] == "other-model"


@pytest.mark.parametrize(
    ("headers", "body", "subset", "status"),
    [
        (REQUEST_HEADERS, b"{not json", None, 400),
        (REQUEST_HEADERS, b'{"messages": [{"role": "user", "content": "x"}]}', None, 400),
        (REQUEST_HEADERS, b'{"model": "public-model", "messages": []}', None, 400),
        (
            REQUEST_HEADERS,
            b'{"model": "unknown", "messages": [{"role": "user", "content": "x"}]}',
            None,
            404,
        ),
        (REQUEST_HEADERS, chat_body(), [], 503),
        (REQUEST_HEADERS, chat_body(), ["192.0.2.1:8000"], 503),
    ],
)
def test_errors_are_immediate_responses(
    epp: tuple[str, int],
    headers: dict[str, str],
    body: bytes,
    subset: list[str] | None,
    status: int,
) -> None:
    target, _ = epp
    (reply,) = exchange(target, [headers_message(headers, subset=subset), *body_msgs(body)])
    assert reply.WhichOneof("response") == "immediate_response"
    assert reply.immediate_response.status.code == status
    assert "error" in json.loads(reply.immediate_response.body)


def test_subset_hint_is_honoured(epp: tuple[str, int]) -> None:
    target, _ = epp
    for _ in range(5):
        replies = exchange(
            target,
            [headers_message(REQUEST_HEADERS, subset=["127.0.0.3:1234"]), *body_msgs(chat_body())],
        )
        assert set_headers(replies[0])["x-gateway-destination-endpoint"].startswith("127.0.0.3:")


def stream_headers() -> ep.ProcessingRequest:
    """An endpoint's response headers for a 200 stream."""
    return ep.ProcessingRequest(
        response_headers=ep.HttpHeaders(
            headers=core.HeaderMap(
                headers=[
                    core.HeaderValue(key=":status", raw_value=b"200"),
                    core.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
                ]
            )
        )
    )


def test_response_path_reads_usage_and_restores_the_model(epp: tuple[str, int]) -> None:
    target, metrics_port = epp
    events = [
        b'data: {"model":"upstream-model","choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"model":"upstream-model","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\ndata: [DONE]\n\n',
    ]
    served = struct_pb2.Struct()
    served.update({"x-gateway-destination-endpoint-served": "127.0.0.2:1"})
    response_headers = stream_headers()
    response_headers.metadata_context.filter_metadata["envoy.lb"].CopyFrom(served)
    messages = [
        headers_message(REQUEST_HEADERS),
        *body_msgs(chat_body(), pieces=1),
        response_headers,
        ep.ProcessingRequest(response_body=ep.HttpBody(body=events[0])),
        ep.ProcessingRequest(response_body=ep.HttpBody(body=events[1], end_of_stream=True)),
    ]
    replies = exchange(target, messages)
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == [
        "request_headers",
        "request_body",
        "response_headers",
        "response_body",
        "response_body",
    ]
    out = b"".join(
        r.response_body.response.body_mutation.streamed_response.body for r in replies[3:]
    )
    assert b'"model":"public-model"' in out and b"upstream-model" not in out
    assert replies[-1].response_body.response.body_mutation.streamed_response.end_of_stream
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        text = response.read().decode()
    assert 'kvgate_epp_tokens_total{direction="prompt"} 7.0' in text
    assert "kvgate_epp_pick_duration_seconds_bucket" in text


def test_health_services(epp: tuple[str, int]) -> None:
    target, _ = epp
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING


def test_pick_api(epp: tuple[str, int]) -> None:
    target, _ = epp
    with grpc.insecure_channel(target) as channel:
        stub = epp_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]
        response = stub.Pick(
            epp_pb2.PickRequest(model="public-model", routing_text="hello " * 40), timeout=5
        )
        assert response.target_model == "upstream-model" and len(response.endpoints) == 2
        assert response.pd.decode == response.endpoints[0].address
        again = stub.Pick(
            epp_pb2.PickRequest(
                model="public-model",
                routing_text="hello " * 40,
                exclude=[response.endpoints[0].address],
            ),
            timeout=5,
        )
        assert [e.address for e in again.endpoints] == [response.endpoints[1].address]
        for picked in (response, again):  # given ids, which report them finished
            done = epp_pb2.FinishedRequest(request_id=picked.request_id, prompt_tokens=40)
            assert stub.Finished(done, timeout=5).known
        assert not stub.Finished(done, timeout=5).known
        with pytest.raises(grpc.RpcError) as err:
            stub.Pick(epp_pb2.PickRequest(model="nope", routing_text="x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_body_ended_by_trailers_is_routed_and_replies_keep_envoys_order(
    epp: tuple[str, int],
) -> None:
    target, _ = epp
    body = chat_body()
    messages = [
        headers_message(REQUEST_HEADERS),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=body[:20])),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=body[20:])),  # no end_of_stream
        ep.ProcessingRequest(request_trailers=ep.HttpTrailers()),
    ]
    replies = exchange(target, messages)
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "request_trailers"]
    assert set_headers(replies[0])["x-gateway-destination-endpoint"].startswith("127.0.0.")
    sent = replies[1].request_body.response.body_mutation.streamed_response.body
    assert json.loads(sent)["model"] == "upstream-model"


def test_client_routing_headers_are_removed_and_the_destination_overwritten(
    epp: tuple[str, int],
) -> None:
    target, _ = epp
    forged = {
        **REQUEST_HEADERS,
        "x-gateway-destination-endpoint": "6.6.6.6:1",
        "x-prefiller-host-port": "6.6.6.6:2",
        "x-llm-d-prefill-target": "6.6.6.6:3",
    }
    replies = exchange(target, [headers_message(forged), *body_msgs(chat_body())])
    mutation = replies[0].request_headers.response.header_mutation
    destination = [
        h for h in mutation.set_headers if h.header.key == "x-gateway-destination-endpoint"
    ]
    assert len(destination) == 1 and destination[0].header.raw_value.startswith(b"127.0.0.")
    assert destination[0].append_action == core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert set(mutation.remove_headers) == {"x-prefiller-host-port", "x-llm-d-prefill-target"}
    assert not {"x-prefiller-host-port", "x-llm-d-prefill-target"} & set(set_headers(replies[0]))


def response_headers_message(content_type: str | None) -> ep.ProcessingRequest:
    headers = [core.HeaderValue(key=":status", raw_value=b"200")]
    if content_type is not None:
        headers.append(core.HeaderValue(key="content-type", raw_value=content_type.encode()))
    return ep.ProcessingRequest(
        response_headers=ep.HttpHeaders(headers=core.HeaderMap(headers=headers))
    )


def test_a_request_without_body_keeps_the_responses_model(epp: tuple[str, int]) -> None:
    # e.g. GET /v1/responses/{id} on a pool whose model is rewritten: nothing to restore
    target, _ = epp
    get = {":path": "/v1/models", ":method": "GET", "x-request-id": "get-1"}
    whole = b'{"object":"model","id":"x","model":"upstream-model"}'
    replies = exchange(
        target,
        [
            headers_message(get, end=True),
            response_headers_message("application/json"),
            ep.ProcessingRequest(response_body=ep.HttpBody(body=whole, end_of_stream=True)),
        ],
    )
    out = replies[-1].response_body.response.body_mutation.streamed_response.body
    assert out == whole


def test_streaming_is_known_from_the_request_too(epp: tuple[str, int]) -> None:
    # a stream whose response names no SSE content type is still relayed chunk by chunk
    target, _ = epp
    events = [b'data: {"choices":[]}\n\n', b"data: [DONE]\n\n"]
    replies = exchange(
        target,
        [
            headers_message(REQUEST_HEADERS),
            *body_msgs(chat_body(), pieces=1),
            response_headers_message(None),
            ep.ProcessingRequest(response_body=ep.HttpBody(body=events[0])),
            ep.ProcessingRequest(response_body=ep.HttpBody(body=events[1], end_of_stream=True)),
        ],
    )
    bodies = [r.response_body.response.body_mutation.streamed_response for r in replies[3:]]
    assert [b.body for b in bodies] == events  # each chunk at once, not buffered to the end
    assert [b.end_of_stream for b in bodies] == [False, True]


def test_a_request_without_an_id_gets_one(epp: tuple[str, int]) -> None:
    target, _ = epp
    headers = {k: v for k, v in REQUEST_HEADERS.items() if k != "x-request-id"}
    first, *_ = exchange(target, [headers_message(headers), *body_msgs(chat_body())])
    assert set_headers(first)["x-request-id"]


def test_a_model_name_split_across_chunks_is_restored_and_nothing_is_lost(
    epp: tuple[str, int],
) -> None:
    """A renamed route's stream: events are echoed whole, so a model name that Envoy's chunks
    cut in two is still put back, and every other byte arrives as sent."""
    events = (
        b'data: {"model":"upstream-model","choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"model":"upstream-model","choices":[{"delta":{"content":" there"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    cut = events.index(b"upstream-model", 20) + 5  # inside the second event's model name
    replies = exchange(
        epp[0],
        [
            headers_message(REQUEST_HEADERS),
            *body_msgs(chat_body(), pieces=1),
            stream_headers(),
            ep.ProcessingRequest(response_body=ep.HttpBody(body=events[:cut])),
            ep.ProcessingRequest(response_body=ep.HttpBody(body=events[cut:], end_of_stream=True)),
        ],
    )
    out = b"".join(
        r.response_body.response.body_mutation.streamed_response.body
        for r in replies
        if r.WhichOneof("response") == "response_body"
    )
    assert out == events.replace(b"upstream-model", b"public-model")
