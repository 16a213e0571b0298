"""``create_app(policy)``: the gateway's aiohttp application.

The middleware order is written once, here: errors (outermost) → request context (request id,
span, access log, metrics) → auth → handler. Every resource is opened and closed by a
cleanup context.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from epp.gateway_picker import EmbeddedEpp
from epp.metrics import EppMetrics
from epp.saturation import SaturationDetector
from epp.service import EppService
from gateway.admission import AdmissionQueue
from gateway.auth import Authenticator
from gateway.breaker import RetryBudget
from gateway.capacity import AllGates, CapacityGate, ConcurrencyGate, SaturationGate
from gateway.keys import (
    ADMISSION,
    AUTHENTICATOR,
    ENDPOINTS,
    HTTP_SESSION,
    LIMITER,
    METRICS,
    PICKER,
    POLICY,
    RETRY_BUDGETS,
    SHADOW,
    SHUTTING_DOWN,
    TRACER,
)
from gateway.limits.limiter import Limiter
from gateway.metrics import GatewayMetrics, QueueCollector
from gateway.middleware.auth import auth
from gateway.middleware.errors import errors
from gateway.middleware.request_context import request_context
from gateway.picker import LeastInFlightPicker, Picker, endpoint_states
from gateway.routes import setup_routes
from gateway.routing.shadow import ShadowMirror
from gateway.tracing import make_tracer
from policies.schema import Policy


def create_app(policy: Policy, *, picker: Picker | None = None) -> web.Application:
    app = web.Application(
        middlewares=[errors, request_context, auth], client_max_size=policy.listen.max_body_bytes
    )
    app[POLICY] = policy
    app[AUTHENTICATOR] = Authenticator(policy)
    metrics = app[METRICS] = GatewayMetrics()
    app[ENDPOINTS] = endpoint_states(policy, metrics.breaker_changed)
    app[RETRY_BUDGETS] = {
        name: RetryBudget(policy.retries.budget_ratio, policy.retries.min_retries_per_second)
        for name in policy.pools
    }
    embedded: EmbeddedEpp | None = None
    if picker is None and policy.epp.picker == "epp":
        service = EppService(policy, EppMetrics(app[METRICS].registry))
        embedded = EmbeddedEpp(policy, app[ENDPOINTS], service)
        picker = embedded
    app[PICKER] = picker or LeastInFlightPicker(app[ENDPOINTS])
    gate: CapacityGate = ConcurrencyGate({n: p.max_concurrency for n, p in policy.pools.items()})
    if embedded is not None:
        saturation = SaturationGate(embedded.service.datastore.endpoints, SaturationDetector())
        gate = AllGates(gate, saturation)
    app[ADMISSION] = AdmissionQueue(dict(policy.classes), gate)
    metrics.registry.register(QueueCollector(app[ADMISSION]))
    app[SHUTTING_DOWN] = [False]
    app[LIMITER] = Limiter(policy.limits, workers=policy.listen.workers)
    tracer, provider = make_tracer(policy.observability.tracing)
    app[TRACER] = tracer

    async def http_session(app: web.Application) -> AsyncIterator[None]:
        timeouts = policy.timeouts
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=60)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect)
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
        )
        app[HTTP_SESSION] = session
        app[SHADOW] = ShadowMirror(policy, session, app[PICKER], app[METRICS])
        yield
        await app[SHADOW].close()
        await session.close()

    async def tracer_context(app: web.Application) -> AsyncIterator[None]:
        yield
        if provider is not None:
            provider.shutdown()

    async def limiter_context(app: web.Application) -> AsyncIterator[None]:
        yield
        await app[LIMITER].close()

    async def mark_shutting_down(app: web.Application) -> None:
        app[SHUTTING_DOWN][0] = True

    async def epp_context(app: web.Application) -> AsyncIterator[None]:
        if embedded is not None:
            await embedded.start()
        yield
        if embedded is not None:
            await embedded.stop()

    app.cleanup_ctx.append(tracer_context)
    app.cleanup_ctx.append(limiter_context)
    app.cleanup_ctx.append(epp_context)
    app.cleanup_ctx.append(http_session)
    app.on_shutdown.append(mark_shutting_down)
    setup_routes(app)
    return app
