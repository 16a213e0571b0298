"""The admin API, on its own listener: policy version, breakers, queues, limiter, SLOs, canaries,
reload.

Every request needs ``Authorization: Bearer <listen.admin.token>`` (compared in constant time).
With ``--workers N`` each worker answers for itself (the port is shared); a file change reloads
every worker, ``POST /admin/reload`` the one that answered.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.canary.controller import ACTIONS
from gateway.keys import ADMISSION, CANARIES, RUNTIME, SLOS
from gateway.reload import RELOADER
from kvgate.wire.openai_errors import error_body

GATEWAY = web.AppKey("gateway", web.Application)


def _gateway(request: web.Request) -> web.Application:
    return request.app[GATEWAY]


async def policy(request: web.Request) -> web.Response:
    holder = _gateway(request)[RUNTIME]
    p = holder.current.policy
    return web.json_response(
        {
            "version": holder.version,
            "source": p.source,
            "loaded_at": holder.current.loaded_at,
            "routes": [r.model for r in p.routes],
            "pools": {n: len(pool.endpoints) for n, pool in p.pools.items()},
        }
    )


async def breakers(request: web.Request) -> web.Response:
    runtime = _gateway(request)[RUNTIME].current
    return web.json_response(
        {
            pool: [
                {"endpoint": s.address, "state": s.breaker.state.value, "in_flight": s.in_flight}
                for s in states
            ]
            for pool, states in runtime.endpoints.items()
        }
    )


async def queues(request: web.Request) -> web.Response:
    admission = _gateway(request)[ADMISSION]
    return web.json_response(
        {
            pool: {name: q.size for name, q in queue.classes.items()}
            for pool, queue in admission.pools.items()
        }
    )


async def limits(request: web.Request) -> web.Response:
    limiter = _gateway(request)[RUNTIME].current.limiter
    return web.json_response(
        {
            "store": limiter.limits.store.kind,
            "status": limiter.status,
            "store_errors": limiter.store_errors,
            "rules": [rule.name for rule in limiter.limits.rules],
        }
    )


async def slo(request: web.Request) -> web.Response:
    """Every objective's events, budget and burn rates in this process's windows (with
    ``--workers N``, the worker that answered; ``kvgate_slo_events_total`` adds them up)."""
    tracker = _gateway(request)[SLOS]
    return web.json_response(
        {
            "per_process": True,
            "shed_when_exhausted": tracker.shed_when_exhausted,
            "objectives": tracker.snapshot(),
        }
    )


async def canaries(request: web.Request) -> web.Response:
    controllers = _gateway(request)[CANARIES].controllers
    return web.json_response({model: c.summary() for model, c in controllers.items()})


async def canary_action(request: web.Request) -> web.Response:
    """``POST /admin/canaries/{model}/{action}``: pause, resume, promote (one step), rollback,
    restart (from the first step). Saved at once; the other workers adopt it within a tick."""
    model, action = request.match_info["model"], request.match_info["action"]
    if action not in ACTIONS:
        body = error_body(
            f"unknown action {action!r} (expected: {', '.join(ACTIONS)})",
            "invalid_request_error",
            code="unknown_action",
        )
        return web.json_response(body, status=400)
    try:
        summary = await asyncio.to_thread(_gateway(request)[CANARIES].act, model, action)
    except KeyError:
        body = error_body(
            f"the route {model!r} has no automatic canary",
            "invalid_request_error",
            code="not_found",
        )
        return web.json_response(body, status=404)
    except OSError as exc:  # the state store is unreachable: nothing was changed
        body = error_body(
            f"canary state not saved: {exc}", "server_error", code="state_unavailable"
        )
        return web.json_response(body, status=503)
    return web.json_response(summary)


async def reload(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    applied, errors = await gateway[RELOADER].reload()
    body = {"applied": applied, "errors": errors, "version": gateway[RUNTIME].version}
    return web.json_response(body, status=200 if applied else 422)


def _guard(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if not token or not hmac.compare_digest(given, expected):
            body = error_body(
                "admin token required", "authentication_error", code="invalid_admin_token"
            )
            return web.json_response(body, status=401)
        return await handler(request)

    return impl


def create_admin_app(gateway: web.Application, token: str) -> web.Application:
    app = web.Application(middlewares=[_guard(token)])
    app[GATEWAY] = gateway
    app.router.add_get("/admin/policy", policy)
    app.router.add_get("/admin/breakers", breakers)
    app.router.add_get("/admin/queues", queues)
    app.router.add_get("/admin/limits", limits)
    app.router.add_get("/admin/slo", slo)
    app.router.add_get("/admin/canaries", canaries)
    app.router.add_post("/admin/canaries/{model:.+}/{action:[a-z]+}", canary_action)
    app.router.add_post("/admin/reload", reload)
    return app


async def serve_admin(
    gateway: web.Application, host: str, port: int, token: str, reuse_port: bool
) -> AsyncIterator[None]:
    """Run the admin listener for as long as the gateway app lives (a cleanup context body)."""
    runner = web.AppRunner(create_admin_app(gateway, token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_port=reuse_port).start()
    yield
    await runner.cleanup()
