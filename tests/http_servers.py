"""Real HTTP servers for tests: an aiohttp application on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
