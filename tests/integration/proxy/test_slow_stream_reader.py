"""A client that reads a stream slower than the upstream writes it gets every event, in order:
the gateway stops taking the upstream's chunks while the client's connection is backed up and
goes on once it drains."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving, streaming_app

EVENTS = 12_000  # of about 1 KiB: 12 MiB, more than loopback's socket buffers hold
PAD = "x" * 1_000


def fast_events() -> Iterator[bytes]:
    for number in range(EVENTS):
        yield f'data: {{"choices":[{{"index":0,"text":"{number} {PAD}"}}]}}\n\n'.encode()
    yield b"data: [DONE]\n\n"


@pytest.fixture
async def fast_upstream() -> AsyncIterator[str]:
    async with serving(streaming_app(fast_events), shutdown_timeout=0.1) as port:
        yield f"127.0.0.1:{port}"


async def test_a_client_reading_slowly_gets_every_event_in_order(
    fast_upstream: str, start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    url, _ = start_gateway(
        f"""
pools: {{p: {{endpoints: [{fast_upstream}]}}}}
routes: [{{model: m, pool: p}}]
timeouts: {{first_byte: 5s, idle: 10s}}
epp: {{picker: least-in-flight}}
"""
    )
    body = {"model": "m", "prompt": "x", "stream": True}
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        await asyncio.sleep(1.0)  # not reading: the client's and the gateway's buffers fill
        seen = 0
        lines = []
        while (line := await response.content.readline()) != b"":
            if line.startswith(b"data: {"):
                assert line.startswith(b'data: {"choices":[{"index":0,"text":"%d ' % seen)
                seen += 1
                if seen % 1_000 == 0:
                    await asyncio.sleep(0.05)  # and slowly
            elif line.strip():
                lines.append(line.strip())
    assert seen == EVENTS
    assert lines == [b"data: [DONE]"]
