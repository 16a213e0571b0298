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
from gateway.request.runtime import RuntimeParts, build_runtime
from gateway.request.state import STATE, GatewayState
from gateway.request.tracing import make_tracer
from gateway.response_cache.cache import ResponseCache
from gateway.routing.endpoint_picker import EndpointPicker
from gateway.routing.shadow import ShadowMirror
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
    metrics = GatewayMetrics()
    models = ModelRegistry(metrics.registry)
    models.update(declared)  # the saved stages, before the first request
    policy = models.resolve(declared)
    tracer, provider = make_tracer(policy.observability.tracing)
    upstreams = ConnectionPool(connect_timeout=policy.timeouts.connect)
    parts = RuntimeParts(metrics, EppMetrics(metrics.registry), upstreams, tracer)
    runtime = build_runtime(policy, parts, picker=picker)
    admission = AdmissionQueue(dict(policy.classes), admission_gate(runtime))
    slos = SloTracker(metrics.registry)
    canaries = Canaries(metrics.registry)
    shadow = ShadowMirror(metrics, tracer, policy.timeouts.connect)
    response_cache = ResponseCache(metrics.registry)
    state = app[STATE] = GatewayState(
        runtime, parts, admission, slos, canaries, models, shadow, response_cache
    )
    metrics.in_flight_source = lambda: {
        pool: sum(endpoint.in_flight for endpoint in endpoints)
        for pool, endpoints in state.current.endpoints.items()
    }
    metrics.registry.register(QueueCollector(admission))
    metrics.registry.register(LimiterCollector(lambda: state.current.limiter))
    slos.update(policy)
    metrics.finished_sink = slos.record
    canaries.budget_spent = slos.budget_spent
    canaries.update(policy)
    shadow.on_result = canaries.shadow_result
    response_cache.update(policy)
    reloader = app[RELOADER] = Reloader(app, policy_path, parts, declared)

    async def connections(app: web.Application) -> AsyncIterator[None]:
        yield
        upstreams.close()
        await shadow.close()

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
        first = state.current
        await first.limiter.start()  # the shared limit store's connections, before any request
        if first.embedded is not None:
            await first.embedded.start()
        watcher = asyncio.create_task(reloader.watch(watch_interval)) if policy_path else None
        clocks = [
            asyncio.create_task(canaries.run()),
            asyncio.create_task(models.run(canaries, reloader.apply_stages)),
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
        await reloader.close()
        await parts.key_sets.stop()
        current = state.current
        if current.embedded is not None:
            await current.embedded.stop()
        await current.limiter.close()
        await response_cache.close()

    async def mark_shutting_down(app: web.Application) -> None:
        state.shutting_down = True

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
    app.cleanup_ctx.append(connections)
    app.cleanup_ctx.append(admin_context)
    app.on_shutdown.append(mark_shutting_down)
    return app
