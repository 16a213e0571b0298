"""A stream's last event and the end of its body leave the gateway together: a client that
stops reading at ``[DONE]`` (as most SSE clients do) finds the body complete and keeps its
connection, and an upstream that stalls after ``[DONE]`` does not hold the client's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import ConnectionCount, serving, stalled_sse, streaming_app


def policy(endpoint: str, idle: str = "3s") -> str:
    return f"""
pools: {{p: {{endpoints: [{endpoint}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
timeouts: {{first_byte: 5s, idle: {idle}}}
epp: {{picker: least-in-flight}}
"""


async def connections_for(url: str, requests: int) -> int:
    """New connections a client that stops reading at ``[DONE]`` opens for ``requests``
    sequential streams."""
    count = ConnectionCount()
    async with aiohttp.ClientSession(trace_configs=[count.trace]) as session:
        for number in range(requests):
            body = {"model": "kvgate-sim", "prompt": f"q {number}", "max_tokens": 4, "stream": True}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                async for line in response.content:
                    if line.strip() == b"data: [DONE]":
                        break  # and read no further
                else:
                    raise AssertionError("the stream ended without [DONE]")
    return count.made


async def test_a_client_that_stops_at_done_keeps_its_connection(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(policy(backend))
    assert await connections_for(url, 40) == 1


@pytest.fixture
async def stalls_after_done() -> AsyncIterator[str]:
    """Streams one event and ``[DONE]``, then neither ends the body nor closes."""
    async with stalled_sse(
        b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n'
    ) as port:
        yield f"127.0.0.1:{port}"


async def test_an_upstream_stalled_after_done_does_not_hold_the_client(
    stalls_after_done: str, start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    # an idle timeout longer than the client waits: neither the stream nor the next request
    # on the same connection may wait for it
    url, _ = start_gateway(policy(stalls_after_done, idle="60s"))
    body = {"model": "kvgate-sim", "prompt": "x", "stream": True}
    count = ConnectionCount()
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=[count.trace]) as session:
        for _ in range(2):
            async with session.post(f"{url}/v1/completions", json=body) as response:
                raw = await response.read()  # the whole body: it ended with [DONE]
            events = [e for e in raw.decode().split("\n\n") if e.strip()]
            assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    assert count.made == 1


def endless_event() -> list[bytes]:
    """One event that never ends: 20 MiB without a blank line (the upstream then stalls)."""
    return [b"data: ", *[b"x" * (1 << 20)] * 20]


async def test_an_event_that_never_ends_fails_the_stream_without_waiting_for_the_upstream(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    async with serving(streaming_app(endless_event, stall=60), shutdown_timeout=0.1) as port:
        url, _ = start_gateway(policy(f"127.0.0.1:{port}", idle="60s"))
        body = {"model": "kvgate-sim", "prompt": "x", "stream": True}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            raw = await response.read()
        assert len(raw) < 1 << 20  # none of the unended event
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        assert len(events) == 1 and "without ending an SSE event" in events[0]
        assert "upstream_stream_broken" in events[0]
        async with (  # and the gateway serves on
            aiohttp.ClientSession() as session,
            session.get(f"{url}/healthz") as health,
        ):
            assert health.status == 200
