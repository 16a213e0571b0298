"""Bodies cannot hold the gateway: a large body is authenticated from its
head before it is read (401 without reading it), and a body trickled past
``listen.body_timeout`` gets 408."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

from loadtest.harness.processes import KvgateProcess

KEY = "sk-slow-bodies"


async def raw_exchange(port: int, data: bytes, trickle: int = 0) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = asyncio.get_running_loop().time()
    writer.write(data)
    for _ in range(trickle):
        await asyncio.sleep(0.1)
        writer.write(b" ")
    try:
        async with asyncio.timeout(10):
            raw = await reader.read()
    finally:
        writer.close()
    return raw, asyncio.get_running_loop().time() - started


async def test_large_unauthenticated_and_slow_bodies(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
listen: {{body_timeout: 500ms}}
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
""")
    port = int(url.rsplit(":", 1)[1])
    big = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer wrong\r\ncontent-length: 7500000\r\n\r\n"
    )
    raw, seconds = await raw_exchange(port, big)  # the 7.5 MB body is never sent
    assert raw.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in raw, raw[:300]
    assert seconds < 2.0
    slow = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 200\r\n\r\n{"
    )
    raw, seconds = await raw_exchange(port, slow, trickle=15)  # a byte every 100 ms
    assert raw.startswith(b"HTTP/1.1 408 ") and b"body took too long" in raw, raw[:300]
    assert 0.4 < seconds < 3.0
