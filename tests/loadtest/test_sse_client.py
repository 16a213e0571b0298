"""The load tester's streaming client reads a body to its end after ``[DONE]`` (as the openai
client does), so a server that sends the end apart from the last event keeps the connection;
one that never ends the body does not hold the client."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from loadtest.client import sse
from tests.http_servers import serving

EVENTS = b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n'


def app(end_after: float) -> web.Application:
    """Streams one event and ``[DONE]``, then ends the body ``end_after`` seconds later."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENTS)
        await asyncio.sleep(end_after)
        await response.write_eof()
        return response

    application = web.Application()
    application.router.add_post("/v1/completions", stream)
    return application


async def test_a_body_ended_after_done_keeps_the_connection() -> None:
    made = 0

    async def counted(*_: object) -> None:
        nonlocal made
        made += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(counted)
    async with serving(app(0.05)) as port, aiohttp.ClientSession(trace_configs=[trace]) as s:
        for _ in range(5):
            result = await sse.stream_request(s, f"http://127.0.0.1:{port}/v1/completions", {})
            assert result.done and result.text == "a"
    assert made == 1


async def test_a_body_that_never_ends_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "DRAIN_TIMEOUT", 0.2)
    async with serving(app(30), shutdown_timeout=0.1) as port, aiohttp.ClientSession() as s:
        result = await asyncio.wait_for(
            sse.stream_request(s, f"http://127.0.0.1:{port}/v1/completions", {}), 10
        )
    assert result.done and result.text == "a" and result.latency < 1
