"""The load tester's streaming client reads a body to its end after ``[DONE]`` (as the openai
client does), so a server that sends the end apart from the last event keeps the connection;
one that never ends the body does not hold the client."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from loadtest.client import sse
from tests.http_servers import ConnectionCount, serving, sse_app, stalled_sse

EVENTS = b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n'


async def test_a_body_ended_after_done_keeps_the_connection() -> None:
    count = ConnectionCount()
    async with (
        serving(sse_app(EVENTS, 0.05)) as port,
        aiohttp.ClientSession(trace_configs=[count.trace]) as session,
    ):
        for _ in range(5):
            url = f"http://127.0.0.1:{port}/v1/completions"
            result = await sse.stream_request(session, url, {})
            assert result.done and result.text == "a"
    assert count.made == 1


async def test_a_body_that_never_ends_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "DRAIN_TIMEOUT", 0.2)
    async with (
        stalled_sse(EVENTS) as port,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{port}/v1/completions"
        result = await asyncio.wait_for(sse.stream_request(session, url, {}), 10)
    assert result.done and result.text == "a" and result.latency < 1


CALLS = (
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function",'
    b'"function":{"name":"read_file","arguments":""}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"{\\"path\\": 1}"}}]}}]}\n\n'
    b"data: [DONE]\n\n"
)


async def test_a_streamed_tool_call_counts_as_the_answer() -> None:
    """An agent's answer that calls a tool has no content: its first delta (the call's name)
    is its first token, and the arguments are its text."""
    async with serving(sse_app(CALLS, 0.05)) as port, aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/completions"
        result = await sse.stream_request(session, url, {})
    assert result.done and result.chunks == 2 and 0 < result.ttft < result.chunk_times[1]
    assert result.text == '{"path": 1}'
