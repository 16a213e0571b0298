"""Tracing: spans for request, auth and upstream, and W3C traceparent propagated upstream."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import gateway.app
from gateway.app import create_app
from gateway.lifecycle import running
from policies.loader import load_policy_text
from tests.backends.pd.servers import ServerFactory, start_worker
from tests.http_servers import serving

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
KEY_HASH = hashlib.sha256(b"secret-xyz").hexdigest()


@pytest.fixture
async def recording_upstream() -> AsyncIterator[tuple[int, list[dict[str, str]]]]:
    """A real HTTP upstream that records the headers it receives."""
    seen: list[dict[str, str]] = []

    async def complete(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response(
            {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        )

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    async with serving(app) as port:
        yield port, seen


async def test_spans_and_traceparent(
    recording_upstream: tuple[int, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, seen = recording_upstream
    policy = load_policy_text(f"""
pools: {{p: {{endpoints: [127.0.0.1:{port}]}}}}
routes: [{{model: m, pool: p}}]
auth: {{api_keys: [{{sha256: {KEY_HASH}, tenant: t}}]}}
observability: {{tracing: {{exporter: console}}}}
""")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # the policy's exporter, in memory: what the app's tracer is made of
    monkeypatch.setattr(gateway.app, "make_tracer", lambda _: (provider.get_tracer("test"), None))
    app = create_app(policy)
    parent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
    async with (
        running(app, "127.0.0.1", 0) as server,
        aiohttp.ClientSession() as client,
        client.post(
            f"http://127.0.0.1:{server.port}/v1/completions",
            json={"model": "m", "prompt": "x"},
            headers={"traceparent": parent, "Authorization": "Bearer secret-xyz"},
        ) as response,
    ):
        assert response.status == 200
    names = {span.name for span in exporter.get_finished_spans()}
    assert {"POST /v1/completions", "auth"} <= names
    assert all(
        span.context.trace_id == int(CLIENT_TRACE, 16) for span in exporter.get_finished_spans()
    )
    upstream_parent = seen[0]["traceparent"]
    assert upstream_parent.split("-")[1] == CLIENT_TRACE
    assert upstream_parent != parent  # the gateway's own client span is the parent now
    assert "Authorization" not in seen[0] and "authorization" not in {k.lower() for k in seen[0]}
    for span in exporter.get_finished_spans():
        assert "secret-xyz" not in str(span.attributes)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The spans of the apps the test creates: every part of the gateway records them,
    the upstream calls included."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(gateway.app, "make_tracer", lambda settings: (tracer, provider))
    return exporter


async def test_each_hop_of_a_prefill_decode_request_has_its_client_span(
    aiohttp_server: ServerFactory, recorded: InMemorySpanExporter
) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", "--cost", "zero")
    decode = await start_worker(aiohttp_server, "--role", "decode", "--cost", "zero")
    addresses = [w.url.removeprefix("http://") for w in (prefill, decode)]
    policy = load_policy_text(f"""
pools: {{p: {{pd: {{min_uncached_tokens: 16}}, endpoints: [{{address: {addresses[0]}, role: prefill}},
                                                        {{address: {addresses[1]}, role: decode}}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{{sha256: {KEY_HASH}, tenant: t}}]}}
observability: {{tracing: {{exporter: console}}}}
""")
    app = create_app(policy)
    async with running(app, "127.0.0.1", 0) as server, aiohttp.ClientSession() as client:
        await asyncio.sleep(0.5)  # the picker's first scrapes (stale metrics are saturated)
        async with client.post(
            f"http://127.0.0.1:{server.port}/v1/completions",
            json={"model": "kvgate-sim", "prompt": "a long prompt " * 40, "max_tokens": 4},
            headers={"Authorization": "Bearer secret-xyz"},
        ) as response:
            assert response.status == 200, await response.text()
    hops = [
        span.attributes["server.address"]
        for span in recorded.get_finished_spans()
        if span.kind is SpanKind.CLIENT and span.attributes
    ]
    assert hops == addresses  # the prefill hop, then the decode hop
    assert len({span.context.trace_id for span in recorded.get_finished_spans()}) == 1


async def test_the_limits_the_route_and_the_shadow_copy_have_their_spans(
    aiohttp_server: ServerFactory, recorded: InMemorySpanExporter
) -> None:
    primary = await start_worker(aiohttp_server, "--cost", "zero")
    mirror = await start_worker(aiohttp_server, "--cost", "zero")
    hosts = [w.url.removeprefix("http://") for w in (primary, mirror)]
    policy = load_policy_text(f"""
pools: {{p: {{endpoints: [{hosts[0]}]}}, m: {{endpoints: [{hosts[1]}]}}}}
routes: [{{model: kvgate-sim, pool: p, shadow: {{pool: m, sample: 1.0}}}}]
auth: {{api_keys: [{{sha256: {KEY_HASH}, tenant: t}}]}}
limits: {{rules: [{{name: everyone, match: {{tenant: "*"}}, requests_per_min: 1000}}]}}
observability: {{tracing: {{exporter: console}}}}
""")
    app = create_app(policy)
    async with running(app, "127.0.0.1", 0) as server, aiohttp.ClientSession() as client:
        await asyncio.sleep(0.5)  # the picker's first scrapes
        for _ in range(2):  # the second finds its prefix where the first went
            async with client.post(
                f"http://127.0.0.1:{server.port}/v1/completions",
                json={"model": "kvgate-sim", "prompt": "traced " * 40, "max_tokens": 2},
                headers={"Authorization": "Bearer secret-xyz"},
            ) as response:
                assert response.status == 200, await response.text()
        await asyncio.sleep(0.5)  # the shadow copies finish
    spans = recorded.get_finished_spans()
    names = [span.name for span in spans]
    assert names.count("limits") == 2 and names.count("shadow") == 2
    route = [span for span in spans if span.name == "route"][-1]
    attributes = dict(route.attributes or {})
    assert attributes["kvgate.route.endpoint"] == hosts[0]
    assert attributes["kvgate.route.candidate.0"] == hosts[0]
    assert attributes["kvgate.route.deciding_scorer"]
    assert int(attributes["kvgate.route.prefix_match_tokens"]) > 0  # type: ignore[arg-type]
    attempt = next(
        s for s in spans if s.name == "POST /v1/completions" and s.kind is SpanKind.CLIENT
    )
    assert (attempt.attributes or {})["kvgate.retry"] == 0
    shadow = next(s for s in spans if s.name == "shadow")
    assert (shadow.attributes or {})["server.address"] == hosts[1]
    traces = {span.context.trace_id for span in spans if span.name != "shadow"}
    assert len(traces) == 2  # one per request, its shadow copy in it
    assert {span.context.trace_id for span in spans if span.name == "shadow"} == traces


async def test_a_request_that_waits_for_capacity_has_its_admission_span(
    aiohttp_server: ServerFactory, recorded: InMemorySpanExporter
) -> None:
    slow = await start_worker(aiohttp_server, "--cost", "0.05,0,0,0")
    policy = load_policy_text(f"""
pools: {{p: {{max_concurrency: 1, endpoints: [{slow.url.removeprefix("http://")}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{picker: least-in-flight}}
observability: {{tracing: {{exporter: console}}}}
""")
    app = create_app(policy)
    async with running(app, "127.0.0.1", 0) as server, aiohttp.ClientSession() as client:

        async def complete() -> int:
            body = {"model": "kvgate-sim", "prompt": "wait", "max_tokens": 4}
            url = f"http://127.0.0.1:{server.port}/v1/completions"
            async with client.post(url, json=body) as response:
                return response.status

        assert list(await asyncio.gather(complete(), complete())) == [200, 200]
    [admission] = [s for s in recorded.get_finished_spans() if s.name == "admission"]
    attributes = dict(admission.attributes or {})
    assert attributes == {"kvgate.admission.class": "standard", "kvgate.admission.queued_ahead": 0}
