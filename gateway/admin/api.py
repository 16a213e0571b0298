"""The admin API, on its own listener: policy version, breakers, queues, limiter, SLOs, canaries,
the model registry, reload.

Every request needs ``Authorization: Bearer <key>``, one of the keys of ``listen.admin`` as
the policy in force says (``gateway.admin.access``): any role reads; canary actions and stage
changes need ``operator``, a reload ``admin``; each of those, allowed or denied, is a line of
the audit log. With ``--workers N`` each worker answers for itself (the port is shared); a
file change reloads every worker, ``POST /admin/reload`` the one that answered.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.admin.access import UNAUTHENTICATED, AuditLog, Caller, caller_of
from gateway.control.canary.controller import ACTIONS
from gateway.control.models.stages import ACTIONS as STAGE_ACTIONS
from gateway.control.models.stages import StageConflict
from gateway.reload import RELOADER
from gateway.request.state import STATE, GatewayState
from kvgate.wire.openai_errors import error_body
from policies.admin_section import Admin

GATEWAY = web.AppKey("gateway", web.Application)
AUDIT = web.AppKey("audit", AuditLog)
CALLER = "kvgate.admin.caller"  # the request's Caller, set by the guard


def _state(request: web.Request) -> GatewayState:
    return request.app[GATEWAY][STATE]


async def policy(request: web.Request) -> web.Response:
    state = _state(request)
    p = state.current.policy
    return web.json_response(
        {
            "version": state.version,
            "source": p.source,
            "loaded_at": state.current.loaded_at,
            "routes": [r.model for r in p.routes],
            "pools": {n: len(pool.endpoints) for n, pool in p.pools.items()},
        }
    )


async def breakers(request: web.Request) -> web.Response:
    runtime = _state(request).current
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
    admission = _state(request).admission
    return web.json_response(
        {
            pool: {name: q.size for name, q in queue.classes.items()}
            for pool, queue in admission.pools.items()
        }
    )


async def limits(request: web.Request) -> web.Response:
    limiter = _state(request).current.limiter
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
    tracker = _state(request).slos
    return web.json_response(
        {
            "per_process": True,
            "shed_when_exhausted": tracker.shed_when_exhausted,
            "objectives": tracker.snapshot(),
        }
    )


async def canaries(request: web.Request) -> web.Response:
    controllers = _state(request).canaries.controllers
    return web.json_response({model: c.summary() for model, c in controllers.items()})


async def canary_action(request: web.Request) -> web.Response:
    """``POST /admin/canaries/{model}/{action}``: pause, resume, promote (one step), rollback,
    restart (from the first step); needs ``operator``. Saved at once; the other workers adopt
    it within a tick."""
    model, action = request.match_info["model"], request.match_info["action"]
    if action not in ACTIONS:
        message = f"unknown action {action!r} (expected: {', '.join(ACTIONS)})"
        return _error(400, message, "invalid_request_error", "unknown_action")
    audited = f"canary.{action}"
    if (denied := await _denied(request, "operator", audited, model)) is not None:
        return denied
    canaries = _state(request).canaries
    controller = canaries.controllers.get(model)
    before = controller.summary() if controller is not None else None
    try:
        summary = await asyncio.to_thread(canaries.act, model, action)
    except KeyError:
        await _audit(request, audited, "not_found", model)
        message = f"the route {model!r} has no automatic canary"
        return _error(404, message, "invalid_request_error", "not_found")
    except OSError as exc:  # the state store is unreachable: nothing was changed
        await _audit(request, audited, "error", model, before)
        return _error(503, f"canary state not saved: {exc}", "server_error", "state_unavailable")
    await _audit(request, audited, "applied", model, before, summary)
    return web.json_response(summary)


async def models(request: web.Request) -> web.Response:
    """The registered models: each version's stage and traffic share, the canary's progress,
    the SLO verdict, the latest stage changes."""
    state = _state(request)
    return web.json_response(state.models.summary(state.canaries, state.slos.budget_spent))


async def model_action(request: web.Request) -> web.Response:
    """``POST /admin/models/{model}/{version}/{action}``: promote (staging → canary →
    production, archived → staging), rollback, archive; needs ``operator``. Saved at once and
    in force in this worker; the other workers and replicas follow within a tick."""
    info = request.match_info
    model, version, action = info["model"], info["version"], info["action"]
    if action not in STAGE_ACTIONS:
        expected = ", ".join(STAGE_ACTIONS)
        message = f"unknown action {action!r} (expected: {expected})"
        return _error(400, message, "invalid_request_error", "unknown_action")
    audited, target = f"models.{action}", f"{model}@{version}"
    if (denied := await _denied(request, "operator", audited, target)) is not None:
        return denied
    state = _state(request)
    registry = state.models
    before = registry.stages[model].stages if model in registry.stages else None
    caller: Caller = request[CALLER]
    try:
        stages = await asyncio.to_thread(registry.act, model, version, action, caller.name)
    except KeyError:
        await _audit(request, audited, "not_found", target)
        message = f"no registered model {model!r} with a version {version!r}"
        return _error(404, message, "invalid_request_error", "not_found")
    except StageConflict as exc:
        await _audit(request, audited, "refused", target, before)
        return _error(409, str(exc), "invalid_request_error", "stage_conflict")
    except OSError as exc:  # the stages' store is unreachable: nothing was changed
        await _audit(request, audited, "error", target, before)
        return _error(503, f"stages not saved: {exc}", "server_error", "state_unavailable")
    await request.app[GATEWAY][RELOADER].apply_stages()
    await _audit(request, audited, "applied", target, before, stages.stages)
    summary = registry.summary(state.canaries, state.slos.budget_spent)
    return web.json_response(summary[model])


def _error(status: int, message: str, kind: str, code: str) -> web.Response:
    """An admin API refusal, as an OpenAI error body."""
    return web.json_response(error_body(message, kind, code=code), status=status)


async def reload(request: web.Request) -> web.Response:
    """``POST /admin/reload``: read the policy again; needs ``admin``."""
    if (denied := await _denied(request, "admin", "reload")) is not None:
        return denied
    state = _state(request)
    before = state.version
    applied, errors = await request.app[GATEWAY][RELOADER].reload()
    after = state.version
    body = {"applied": applied, "errors": errors, "version": after}
    result = "applied" if applied else "rejected"
    await _audit(request, "reload", result, "", before, {"version": after, "errors": errors})
    return web.json_response(body, status=200 if applied else 422)


async def _denied(
    request: web.Request, role: str, action: str, target: str = ""
) -> web.Response | None:
    """A 403 (audited) unless the caller's role is at least ``role``."""
    caller: Caller = request[CALLER]
    if caller.may(role):
        return None
    await _audit(request, action, "denied", target)
    message = f"{action} needs the {role} role; the key {caller.name!r} is {caller.role}"
    return _error(403, message, "permission_error", "insufficient_role")


async def _audit(
    request: web.Request,
    action: str,
    result: str,
    target: str = "",
    before: object = None,
    after: object = None,
) -> None:
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    caller = request.get(CALLER)
    await request.app[AUDIT].record(
        caller, action, result, target=target, before=before, after=after, request_id=request_id
    )


def _guard() -> Middleware:
    """Who may call: the keys, roles and issuers of the policy in force (a reload that removes
    a key revokes it at once; an admin section removed shuts every caller out)."""

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        runtime = _state(request).current
        admin = runtime.policy.listen.admin
        caller = None
        if admin is not None:
            request.app[AUDIT].path = admin.audit_log
            authorization = request.headers.get("Authorization", "")
            caller = caller_of(admin, authorization, runtime.authenticator)
        if caller is None:
            if request.method == "POST":  # an attempted change: on the record
                await _audit(request, _action_of(request), UNAUTHENTICATED)
            message = "admin token required"
            return _error(401, message, "authentication_error", "invalid_admin_token")
        request[CALLER] = caller
        return await handler(request)

    return impl


def _action_of(request: web.Request) -> str:
    """What a call is, as the metrics and the audit log name it: its route (a bounded set),
    never the path the caller made up."""
    resource = request.match_info.route.resource
    if resource is None:
        return "unknown"
    return resource.canonical.removeprefix("/admin/")


def create_admin_app(gateway: web.Application, admin: Admin) -> web.Application:
    app = web.Application(middlewares=[_guard()])
    app[GATEWAY] = gateway
    app[AUDIT] = AuditLog(admin.audit_log, gateway[STATE].parts.metrics.admin_actions)
    app.router.add_get("/admin/policy", policy)
    app.router.add_get("/admin/breakers", breakers)
    app.router.add_get("/admin/queues", queues)
    app.router.add_get("/admin/limits", limits)
    app.router.add_get("/admin/slo", slo)
    app.router.add_get("/admin/canaries", canaries)
    app.router.add_post("/admin/canaries/{model:.+}/{action:[a-z]+}", canary_action)
    app.router.add_get("/admin/models", models)
    app.router.add_post("/admin/models/{model:.+}/{version}/{action:[a-z]+}", model_action)
    app.router.add_post("/admin/reload", reload)
    return app


async def serve_admin(
    gateway: web.Application, admin: Admin, reuse_port: bool
) -> AsyncIterator[None]:
    """Run the admin listener for as long as the gateway app lives (a cleanup context body)."""
    runner = web.AppRunner(create_admin_app(gateway, admin), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, admin.host, admin.port, reuse_port=reuse_port).start()
    yield
    await runner.cleanup()
