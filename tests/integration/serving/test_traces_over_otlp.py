"""One trace across the gateway and the engine, exported over OTLP/HTTP to a receiver the test
runs: the client's trace continues through the gateway's spans (auth, limits, route, the
attempt) into the engine's ``llm_request`` and its queue, prefill and decode spans."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]


def decoded(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP export (protobuf)."""
    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                attributes: dict[str, object] = {}
                for a in span.attributes:
                    kind = a.value.WhichOneof("value")
                    attributes[a.key] = getattr(a.value, kind) if kind else None
                found.append(
                    ReceivedSpan(
                        resource.get("service.name", ""),
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        attributes,
                    )
                )
    return found


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[ReceivedSpan]]]:
    """An OTLP/HTTP trace receiver on loopback: its URL and the spans it got."""
    spans: list[ReceivedSpan] = []

    async def export(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        spans.extend(decoded(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    async with serving(app) as port:
        yield f"http://127.0.0.1:{port}/v1/traces", spans


async def arrived(spans: list[ReceivedSpan], names: set[str], within: float) -> None:
    """Until spans of every name in ``names`` have been exported (each process exports in
    batches, every 100 ms here), at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while not names <= {s.name for s in spans}:
        assert time.monotonic() < deadline, sorted({s.name for s in spans})
        await asyncio.sleep(0.1)


async def test_one_trace_runs_from_the_client_through_the_gateway_into_the_engine(
    receiver: tuple[str, list[ReceivedSpan]],
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, spans = receiver
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # both processes export at once
    backend = start_backend("--cost", "zero", "--otlp-traces-endpoint", url)
    gateway, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend.removeprefix("http://")}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
limits: {{rules: [{{name: everyone, match: {{tenant: "*"}}, requests_per_min: 1000}}]}}
observability: {{tracing: {{exporter: otlp, endpoint: "{url}", service_name: edge}}}}
""")
    body = {"model": "kvgate-sim", "prompt": "a traced prompt " * 20, "max_tokens": 4}
    headers = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
    wanted = {"POST /v1/completions", "auth", "limits", "route", "llm_request", "decode"}
    await arrived(spans, wanted, 20.0)
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}  # health probes are not traced
    by_name = {(s.service, s.name): s for s in spans}
    server = by_name[("edge", "POST /v1/completions")]
    for step in ("auth", "limits", "route"):
        assert by_name[("edge", step)].parent_id == server.span_id, step
    attempt = next(
        s for s in spans if s.service == "edge" and s.name == "POST /v1/completions" and s != server
    )
    engine = by_name[("kvgate-backend kvgate-sim", "llm_request")]
    assert engine.parent_id == attempt.span_id  # the engine continues the gateway's attempt
    assert engine.attributes["gen_ai.usage.completion_tokens"] == 4
    for phase in ("queue", "prefill", "decode"):
        assert by_name[("kvgate-backend kvgate-sim", phase)].parent_id == engine.span_id
    assert (
        "gen_ai.usage.cached_tokens" in by_name[("kvgate-backend kvgate-sim", "prefill")].attributes
    )
