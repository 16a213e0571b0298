"""Real HTTP servers for tests: an aiohttp application on a free loopback port, and a scripted
upstream speaking raw HTTP/1.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from loadtest.harness.processes import free_port


@asynccontextmanager
async def serving(app: web.Application, *, shutdown_timeout: float = 60.0) -> AsyncIterator[int]:
    """Serve ``app`` on 127.0.0.1; yields the port, cleans up on exit."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def streaming_app(
    parts: Callable[[], Iterable[bytes]],
    *,
    stall: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> web.Application:
    """``POST /v1/completions`` answers with ``parts()`` written one by one (an event stream
    unless ``headers`` say otherwise), then waits ``stall`` seconds before ending the body."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=headers or {"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for part in parts():
            await response.write(part)
        await asyncio.sleep(stall)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    return app


def sse_app(first: bytes, end_after: float) -> web.Application:
    """``POST /v1/completions`` streams the events ``first``, then ends the body
    ``end_after`` seconds later (a stalled upstream, given longer than the test waits)."""
    return streaming_app(lambda: [first], stall=end_after)


@asynccontextmanager
async def stalled_sse(first: bytes) -> AsyncIterator[int]:
    """An SSE upstream that sends ``first`` and then stalls: it neither ends the body nor
    closes within any test's patience. Yields its port."""
    async with serving(sse_app(first, 30), shutdown_timeout=0.1) as port:
        yield port


@dataclass
class ConnectionCount:
    """An aiohttp ``TraceConfig`` counting the connections its client session opens."""

    made: int = 0
    trace: aiohttp.TraceConfig = field(default_factory=aiohttp.TraceConfig)

    def __post_init__(self) -> None:
        self.trace.on_connection_create_end.append(self._count)

    async def _count(self, *_: object) -> None:
        self.made += 1


@dataclass
class Upstream:
    """A scripted HTTP server: ``answer(request_number)`` gives the bytes to send back (None:
    close the connection without answering)."""

    answer: Callable[[int], bytes | None]
    silent: bool = False  # read requests, never answer (a stalled upstream)
    port: int = 0
    connections: int = 0
    requests: int = 0
    closed: list[int] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.requests += 1
                if self.silent:
                    await asyncio.sleep(3600)
                reply = self.answer(self.requests)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        self.closed.append(number)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def loopback_server(serve: Handler) -> asyncio.Server:
    """``asyncio.start_server`` on a free loopback port, each connection closed when ``serve``
    returns, raises or is cancelled (the test's loop ending with connections still open)."""

    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    return await asyncio.start_server(closing, "127.0.0.1", 0)


async def started(
    answer: Callable[[int], bytes | None], *, silent: bool = False
) -> tuple[Upstream, asyncio.Server]:
    """A scripted upstream listening on a free loopback port."""
    up = Upstream(answer, silent)
    server = await loopback_server(up.serve)
    up.port = server.sockets[0].getsockname()[1]
    return up, server
