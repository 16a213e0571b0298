"""Serve a gateway application on kvgate's HTTP server, with its whole lifecycle.

``running(app, ...)`` starts the application's resources (cleanup contexts), listens (HTTPS with
``listen.tls``, its certificate reloaded when the files change), and on exit
stops accepting, marks the gateway as shutting down (``/readyz`` answers 503), lets in-flight
requests (streams included) finish for up to ``grace`` seconds, then closes everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from aiohttp import web

from gateway.request.error_responses import http_error
from gateway.request.routes import check_head, handle
from gateway.request.state import STATE
from kvgate.wire.http.server import HttpServer
from kvgate.wire.http.tls import CertificateReloader, server_context


@asynccontextmanager
async def running(
    app: web.Application,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    grace: float | None = None,
) -> AsyncIterator[HttpServer]:
    """The listening server; ``port`` 0 picks a free one (read it from ``server.port``)."""
    listen = app[STATE].current.policy.listen
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()  # runs the application's startup and cleanup contexts
    server = HttpServer(
        app,
        handle,
        http_error,
        max_body=listen.max_body_bytes,
        header_timeout=listen.header_timeout,
        body_timeout=listen.body_timeout,
        head_check=partial(check_head, app),
    )
    tls = reloader = None
    if listen.tls is not None:
        tls = server_context(listen.tls.cert, listen.tls.key, listen.tls.client_ca)
        reloader = CertificateReloader(tls, listen.tls.cert, listen.tls.key)
    try:
        await server.start(host, port, reuse_port=reuse_port, tls=tls)
        if reloader is not None:
            reloader.start()
        yield server
    finally:
        if reloader is not None:
            await reloader.stop()
        app[STATE].shutting_down = True
        await server.shutdown(listen.shutdown_grace if grace is None else grace)
        await runner.cleanup()
