"""``create_app(policy)``: the gateway's state and lifecycle, in an aiohttp ``Application``.

The application is not served by aiohttp: ``gateway.lifecycle`` runs kvgate's own HTTP server
(``kvgate.wire.http``) with ``gateway.request.routes.handle`` and uses the application for its typed
state and its cleanup contexts (every resource is opened and closed by one). With ``policy_path``
the file is watched and reloaded when it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from epp.metrics import EppMetrics
from gateway.admin.api import serve_admin
from gateway.base.metric_batch import FLUSH_INTERVAL
from gateway.base.metrics import GatewayMetrics
from gateway.control.canary.canaries import Canaries
from gateway.control.models.registry import ModelRegistry
from gateway.control.slo.tracker import SloTracker
from gateway.guards.admission import AdmissionQueue, QueueCollector
from gateway.guards.limits.collector import LimiterCollector
from gateway.guards.remote_jwks import jwks_urls
from gateway.reload import RELOADER, Reloader, admission_gate
from gateway.request.keys import (
    ADMISSION,
    CANARIES,
    HTTP_SESSION,
    METRICS,
    MODELS,
    RESPONSE_CACHE,
    RESPONSE_HOMES,
    RUNTIME,
    SHADOW,
    SHUTTING_DOWN,
    SLOS,
    TRACER,
    UPSTREAMS,
)
from gateway.request.runtime import RuntimeHolder, RuntimeParts, build_runtime
from gateway.request.tracing import make_tracer
from gateway.response_cache.cache import ResponseCache
from gateway.routing.endpoint_picker import EndpointPicker
from gateway.routing.shadow import ShadowMirror
from kvgate.response_homes import ResponseHomes
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.schema import Policy


def create_app(
    declared: Policy,
    *,
    picker: EndpointPicker | None = None,
    policy_path: str | None = None,
    watch_interval: float = 1.0,
) -> web.Application:
    """The gateway for the policy ``declared`` (run with its registered models' saved stages)."""
    app = web.Application()
    metrics = app[METRICS] = GatewayMetrics()
    models = app[MODELS] = ModelRegistry(metrics.registry)
    models.update(declared)  # the saved stages, before the first request
    policy = models.resolve(declared)
    epp_metrics = EppMetrics(metrics.registry)
    tracer, provider = make_tracer(policy.observability.tracing)
    app[TRACER] = tracer
    upstreams = app[UPSTREAMS] = ConnectionPool(connect_timeout=policy.timeouts.connect)
    parts = RuntimeParts(metrics, epp_metrics, upstreams, tracer)
    runtime = build_runtime(policy, parts, picker=picker)
    admission = app[ADMISSION] = AdmissionQueue(dict(policy.classes), admission_gate(runtime))
    slos = app[SLOS] = SloTracker(metrics.registry)
    holder = app[RUNTIME] = RuntimeHolder(runtime, parts, admission, slos)
    metrics.in_flight_source = lambda: {
        pool: sum(endpoint.in_flight for endpoint in endpoints)
        for pool, endpoints in holder.current.endpoints.items()
    }
    metrics.registry.register(QueueCollector(admission))
    metrics.registry.register(LimiterCollector(lambda: holder.current.limiter))
    slos.update(policy)
    metrics.finished_sink = slos.record
    canaries = app[CANARIES] = Canaries(metrics.registry)
    canaries.budget_spent = slos.budget_spent
    canaries.update(policy)
    app[SHUTTING_DOWN] = [False]
    app[RESPONSE_HOMES] = ResponseHomes()
    response_cache = app[RESPONSE_CACHE] = ResponseCache(metrics.registry)
    response_cache.update(policy)
    app[RELOADER] = Reloader(app, policy_path, parts, declared)

    async def http_session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=60)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.timeouts.connect)
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
        )
        app[HTTP_SESSION] = session
        app[SHADOW] = ShadowMirror(session, app[METRICS], app[TRACER])
        app[SHADOW].on_result = canaries.shadow_result
        yield
        app[UPSTREAMS].close()
        await app[SHADOW].close()
        await session.close()

    async def metrics_flusher(app: web.Application) -> AsyncIterator[None]:
        async def flush_forever() -> None:
            while True:
                await asyncio.sleep(FLUSH_INTERVAL)
                metrics.flush()

        task = asyncio.create_task(flush_forever())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        metrics.flush()

    async def tracer_context(app: web.Application) -> AsyncIterator[None]:
        yield
        if provider is not None:
            provider.shutdown()

    async def runtime_context(app: web.Application) -> AsyncIterator[None]:
        await parts.key_sets.fetch_new(jwks_urls(policy))  # issuers' keys before any request
        parts.key_sets.start()
        first = app[RUNTIME].current
        await first.limiter.start()  # the shared limit store's connections, before any request
        if first.embedded is not None:
            await first.embedded.start()
        watcher = asyncio.create_task(app[RELOADER].watch(watch_interval)) if policy_path else None
        clocks = [
            asyncio.create_task(canaries.run()),
            asyncio.create_task(models.run(canaries, app[RELOADER].apply_stages)),
        ]
        yield
        for clock in clocks:
            clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await clock
        canaries.close()
        models.close()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await app[RELOADER].close()
        await parts.key_sets.stop()
        current = app[RUNTIME].current
        if current.embedded is not None:
            await current.embedded.stop()
        await current.limiter.close()
        await response_cache.close()

    async def mark_shutting_down(app: web.Application) -> None:
        app[SHUTTING_DOWN][0] = True

    async def admin_context(app: web.Application) -> AsyncIterator[None]:
        admin = policy.listen.admin
        if admin is None:
            yield
            return
        async for _ in serve_admin(app, admin, reuse_port=policy.listen.workers > 1):
            yield

    app.cleanup_ctx.append(metrics_flusher)
    app.cleanup_ctx.append(tracer_context)
    app.cleanup_ctx.append(runtime_context)
    app.cleanup_ctx.append(http_session)
    app.cleanup_ctx.append(admin_context)
    app.on_shutdown.append(mark_shutting_down)
    return app
