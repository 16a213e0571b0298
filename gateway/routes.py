"""The gateway's routes and the layers around them: the proxied OpenAI API, models, health,
readiness and metrics.

``handle`` is what the HTTP server calls for every request: errors (outermost) → request
context (request id, span, access log, metrics) → auth (``/v1/*`` only, before the route is
looked up, so an unauthenticated caller learns nothing about paths) → the route's handler.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial

from prometheus_client import CONTENT_TYPE_LATEST

from gateway import proxy
from gateway.context import RequestContext
from gateway.errors import MethodNotAllowed, NotFound
from gateway.http.messages import AnyResponse, Request, Response, json_response
from gateway.keys import METRICS, RUNTIME, SHUTTING_DOWN
from gateway.middleware.auth import authenticate
from gateway.middleware.errors import response_for
from gateway.middleware.request_context import request_context

RouteHandler = Callable[[Request, RequestContext], Awaitable[AnyResponse]]


async def models(request: Request, ctx: RequestContext) -> Response:
    """The public models this caller may use."""
    identity = ctx.identity
    created = int(time.time())
    data = [
        {"id": model, "object": "model", "created": created, "owned_by": "kvgate"}
        for model in request.app[RUNTIME].current.policy.public_models
        if identity is None or identity.may_use(model)
    ]
    return json_response({"object": "list", "data": data})


async def healthz(request: Request, ctx: RequestContext) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, ctx: RequestContext) -> Response:
    limiter = request.app[RUNTIME].current.limiter.status
    if request.app[SHUTTING_DOWN][0]:
        return json_response({"status": "shutting down", "limiter": limiter}, status=503)
    if limiter == "down":  # fail-closed and the limit store is unreachable: nothing is admitted
        return json_response({"status": "not ready", "limiter": limiter}, status=503)
    return json_response({"status": "ready", "limiter": limiter})


async def metrics(request: Request, ctx: RequestContext) -> Response:
    embedded = request.app[RUNTIME].current.embedded
    if embedded is not None:
        embedded.service.update_gauges()  # the picker's index sizes, read when scraped
    body = request.app[METRICS].exposition()
    return Response(body, content_type=CONTENT_TYPE_LATEST)


ROUTES: dict[str, dict[str, RouteHandler]] = {
    "/v1/chat/completions": {"POST": partial(proxy.proxy, path="/v1/chat/completions")},
    "/v1/completions": {"POST": partial(proxy.proxy, path="/v1/completions")},
    "/v1/embeddings": {"POST": partial(proxy.proxy, path="/v1/embeddings", streams=False)},
    "/v1/models": {"GET": models},
    "/healthz": {"GET": healthz},
    "/readyz": {"GET": readyz},
}


def _route(request: Request) -> RouteHandler:
    methods = ROUTES.get(request.path)
    if methods is None:
        if request.path != request.app[RUNTIME].current.policy.observability.metrics_path:
            raise NotFound(f"no route for {request.path}")
        methods = {"GET": metrics}
    handler = methods.get(request.method)
    if handler is None:
        raise MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}",
            headers={"allow": ", ".join(methods)},
        )
    return handler


async def _authenticated(request: Request, ctx: RequestContext) -> AnyResponse:
    if request.path.startswith("/v1/"):
        authenticate(request, ctx)
    return await _route(request)(request, ctx)


async def handle(request: Request) -> AnyResponse:
    """The response to one request (never raises but for cancellation)."""
    try:
        return await request_context(request, _authenticated)
    except Exception as exc:
        return response_for(request, exc)
