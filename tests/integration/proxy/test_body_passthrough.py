"""A body the gateway reads nothing from (audio, a file, text) is passed on as it arrives, not
held whole: the client has its first bytes while the upstream is still sending, and a body
that breaks off reaches the client cut short, never as a shorter body that looks whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving, streaming_app
from tests.integration.gateway_stack import one_upstream_policy

AUDIO = {"Content-Type": "audio/mpeg"}
FIRST = bytes(range(256)) * 64  # 16 KiB of binary


def gateway_in_front(start_gateway: Callable[..., tuple[str, KvgateProcess]], port: int) -> str:
    url, _ = start_gateway(one_upstream_policy(port))
    return url


async def test_the_first_bytes_arrive_while_the_upstream_is_still_sending(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    app = streaming_app(lambda: [FIRST], stall=3.0, headers=AUDIO)  # then the body's end
    async with serving(app, shutdown_timeout=0.1) as port:
        url = gateway_in_front(start_gateway, port)
        async with aiohttp.ClientSession() as session:
            sent = asyncio.get_running_loop().time()
            async with session.post(f"{url}/v1/completions", json={"model": "m"}) as response:
                assert response.status == 200 and response.headers["content-type"] == "audio/mpeg"
                assert "x-request-id" in response.headers
                assert await response.content.readexactly(len(FIRST)) == FIRST
                assert asyncio.get_running_loop().time() - sent < 2.0  # not after the 3 s stall
                assert await response.read() == b""  # then the body ends, whole


async def test_a_sized_body_keeps_its_content_length(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    whole = FIRST * 256  # 4 MiB: more than comes with the head, so it is passed on as it comes
    headers = {**AUDIO, "Content-Length": str(len(whole))}
    async with serving(streaming_app(lambda: [whole], headers=headers)) as port:
        url = gateway_in_front(start_gateway, port)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json={"model": "m"}) as response,
        ):
            assert response.headers["content-length"] == str(len(whole))
            assert "transfer-encoding" not in response.headers
            assert await response.read() == whole


@asynccontextmanager
async def cut_upstream(sent: bytes, length: int) -> AsyncIterator[int]:
    """An upstream that promises ``length`` bytes of audio, sends ``sent`` and hangs up."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\nContent-Length: {length}\r\n\r\n"
        writer.write(head.encode() + sent)
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_body_the_upstream_breaks_off_is_cut_short_at_the_client(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    async with cut_upstream(FIRST, 10 * len(FIRST)) as port:
        url = gateway_in_front(start_gateway, port)
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "prompt": "x"}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
            # the gateway serves on (its connection to the client was the one closed)
            async with session.get(f"{url}/healthz") as health:
                assert health.status == 200


async def test_a_client_that_leaves_mid_body_closes_the_upstream_connection(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    ended: list[str] = []

    async def endless_audio(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=AUDIO)
        await response.prepare(request)
        try:
            for _ in range(600):  # a minute of audio, a chunk every 0.1 s
                await response.write(FIRST)
                await asyncio.sleep(0.1)
        except (ConnectionResetError, asyncio.CancelledError):
            ended.append("the gateway closed the connection")
            raise
        ended.append("sent it all")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", endless_audio)
    async with serving(app, shutdown_timeout=0.1) as port:
        url = gateway_in_front(start_gateway, port)
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/v1/completions", json={"model": "m"})
            assert await response.content.readexactly(len(FIRST)) == FIRST
            response.close()  # the client goes away
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.05)
    assert ended == ["the gateway closed the connection"]
