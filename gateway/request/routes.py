"""The gateway's routes and what runs around them: the proxied OpenAI API (stored responses by
id: ``gateway.request.stored_responses``), models, health, readiness and metrics.

``handle`` is what the HTTP server calls for every request: request context (request id, span,
access log, metrics), auth, the route's handler, errors.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.base.api import APIS, PASSTHROUGH, Api
from gateway.base.context import RequestContext
from gateway.base.errors import (
    Forbidden,
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    Unauthorized,
)
from gateway.base.forwarded import is_loopback
from gateway.request import proxy
from gateway.request.cors import is_preflight, preflight, response_lines
from gateway.request.error_responses import error_on, response_for
from gateway.request.relay import CUT_BY_SHUTDOWN
from gateway.request.request_context import (
    QUIET_PATHS,
    end_server_span,
    log_access,
    request_id_of,
    start_server_span,
)
from gateway.request.runtime import dead_pools
from gateway.request.state import STATE, GatewayState
from gateway.request.stored_responses import home_of, route_name, send_home
from kvgate.wire.http.messages import AnyResponse, Request, Response, header_line, json_response
from kvgate.wire.http.server import SHUTDOWN_CUT
from kvgate.wire.responses_api import STORED_PREFIX as RESPONSE_PREFIX
from policies.schema import Observability

RouteHandler = Callable[[Request, RequestContext], Awaitable[AnyResponse]]


def _model_entry(model: str, created: int) -> dict[str, object]:
    return {"id": model, "object": "model", "created": created, "owned_by": "kvgate"}


async def models(request: Request, ctx: RequestContext) -> Response:
    """The public models this caller may use."""
    identity = ctx.identity
    created = int(time.time())
    data = [
        _model_entry(model, created)
        for model in request.app[STATE].current.policy.public_models
        if identity is None or identity.may_use(model)
    ]
    return json_response({"object": "list", "data": data})


async def model(request: Request, ctx: RequestContext) -> Response:
    """``GET /v1/models/{id}`` (the id may hold slashes): one public model this caller may
    use, else 404 ``model_not_found`` (a model the caller may not use is not revealed)."""
    name = urllib.parse.unquote(request.path[len(MODEL_PREFIX) :])
    identity = ctx.identity
    if name in request.app[STATE].current.policy.public_models and (
        identity is None or identity.may_use(name)
    ):
        return json_response(_model_entry(name, int(time.time())))
    raise ModelNotFound(f"The model '{name}' does not exist", param="model")


async def healthz(request: Request, ctx: RequestContext) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, ctx: RequestContext) -> Response:
    """Ready, or why not: shutting down, the limit store down (fail-closed), or routes whose
    pool has no live endpoint (``degraded``, or 503 with ``listen.ready_with_dead_pools:
    false``). With ``epp.replicas``, ``view`` says whether the picks are shared with the other
    replicas or, the store unreachable, local only (still ready: the replica routes on)."""
    state = request.app[STATE]
    runtime = state.current
    body: dict[str, object] = {"limiter": runtime.limiter.status}
    shared = runtime.embedded.service.shared if runtime.embedded is not None else None
    if shared is not None:
        body["view"] = "shared" if shared.shared else "local only"
    if state.shutting_down:
        return json_response({"status": "shutting down", **body}, status=503)
    if body["limiter"] == "down":  # fail-closed and the limit store is unreachable
        return json_response({"status": "not ready", **body}, status=503)
    dead = dead_pools(runtime)
    if dead:
        routes = sorted(r.model for r in runtime.policy.routes if r.pool in dead)
        body = {"status": "degraded", **body, "dead_pools": dead, "routes": routes}
        if not runtime.policy.listen.ready_with_dead_pools:
            return json_response({**body, "status": "not ready"}, status=503)
        return json_response(body)
    return json_response({"status": "ready", **body})


def metrics_allowed(observability: Observability, request: Request) -> bool:
    """Loopback peers, a bearer of ``metrics.token``, or anyone with ``metrics.public``:
    metrics name every endpoint and model, which a public listener should not tell anyone."""
    if observability.metrics_public or is_loopback(request.peer):
        return True
    token = observability.metrics_token
    given = request.headers.get("authorization", "")
    return token is not None and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


async def metrics(request: Request, ctx: RequestContext) -> Response:
    state = request.app[STATE]
    runtime = state.current
    if not metrics_allowed(runtime.policy.observability, request):
        raise Forbidden(
            f"{request.path} answers loopback clients only; set observability.metrics.token "
            "(and send it as a bearer token) or observability.metrics.public: true"
        )
    embedded = runtime.embedded
    if embedded is not None:
        embedded.service.update_gauges()  # the picker's index sizes, read when scraped
    body = state.parts.metrics.exposition()
    return Response(body, content_type=CONTENT_TYPE_LATEST)


class Proxied:
    """The handler of a proxied OpenAI path (a plain call: no partial with keywords, no extra
    coroutine, per request)."""

    __slots__ = ("api", "path")

    def __init__(self, api: Api, path: str = "") -> None:
        self.api = api  # what the gateway knows of the API
        self.path = path or api.path  # the upstream path

    def __call__(self, request: Request, ctx: RequestContext) -> Awaitable[AnyResponse]:
        return proxy.proxy(request, ctx, self.path, self.api)


ROUTES: dict[str, dict[str, RouteHandler]] = {
    **{path: {"POST": Proxied(api)} for path, api in APIS.items()},
    "/v1/models": {"GET": models},
    "/healthz": {"GET": healthz},
    "/readyz": {"GET": readyz},
}


async def stored_response(request: Request, ctx: RequestContext) -> AnyResponse:
    """A request about a stored response (retrieve, delete, cancel, its input items), sent to
    the endpoint that holds it (``gateway.request.stored_responses``)."""
    response_id, home, endpoint = await home_of(request, ctx)
    ctx.model, ctx.pool, ctx.endpoint = home.model, home.pool, home.endpoint
    return await send_home(request, ctx, response_id, endpoint)


MODEL_PREFIX = "/v1/models/"
MODEL_ROUTE: dict[str, RouteHandler] = {"GET": model}
METRICS_ROUTE: dict[str, RouteHandler] = {"GET": metrics}
RESPONSE_ROUTE: dict[str, RouteHandler] = {
    "GET": stored_response,
    "DELETE": stored_response,
    "POST": stored_response,
}


def _route(request: Request, ctx: RequestContext) -> RouteHandler:
    """The path's handler for the method; HEAD is served wherever GET is (the server sends
    the head only). ``ctx.route`` becomes the route's name (a path with its id as ``{id}``, or
    ``other``): the metrics' label must not grow with the paths clients make up."""
    path = request.path
    methods = ROUTES.get(path)
    if methods is None:
        policy = request.app[STATE].current.policy
        if path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
            methods, ctx.route = MODEL_ROUTE, MODEL_PREFIX + "{id}"
        elif path.startswith(RESPONSE_PREFIX):
            methods, ctx.route = RESPONSE_ROUTE, route_name(path)  # home_of checks the methods
        elif path == policy.observability.metrics_path:
            methods = METRICS_ROUTE
        elif path in policy.passthrough_paths:
            methods = {"POST": Proxied(PASSTHROUGH, path)}
        else:
            ctx.route = "other"
            return Refusal(NotFound(f"no route for {path}"))
    method = request.method
    handler = methods.get("GET" if method == "HEAD" else method)
    if handler is None:
        return Refusal(
            MethodNotAllowed(
                f"{request.method} is not allowed on {request.path}",
                headers={"allow": ", ".join([*methods, "HEAD"] if "GET" in methods else methods)},
            )
        )
    return handler


class Refusal:
    """The handler of a path or method there is no route for: raises its error (after auth:
    an unauthenticated caller learns nothing about paths)."""

    __slots__ = ("error",)

    def __init__(self, error: GatewayError) -> None:
        self.error = error

    async def __call__(self, request: Request, ctx: RequestContext) -> AnyResponse:
        raise self.error


def check_head(app: web.Application, target: bytes, headers: CIMultiDict[str]) -> Response | None:
    """A large body's head, before the body is read: ``/v1/*`` must authenticate first (the
    handler authenticates again once the body is in; a head check is for large bodies only)."""
    path = target.partition(b"?")[0].decode("latin-1")
    runtime = app[STATE].current
    if not path.startswith("/v1/") and path not in runtime.policy.passthrough_paths:
        return None
    try:
        runtime.authenticator.authenticate(headers)
    except Unauthorized as exc:
        return error_on(path, exc)
    return None


async def handle(request: Request) -> AnyResponse:
    """The response to one request (never raises but for cancellation).

    One coroutine does it all (a layer per concern costs a coroutine each, per request): the
    request context (request id, server span, access log, metrics), auth (``/v1/*`` only, before
    a missing route is refused, so an unauthenticated caller learns nothing about paths), the
    route's handler, and any exception made into an OpenAI-shaped error.
    """
    state = request.app[STATE]
    ctx = RequestContext(request_id_of(request.headers), request.path)
    tracer = state.parts.tracer
    span = None
    if tracer is not None and request.path not in QUIET_PATHS:  # probes are not traced
        span = start_server_span(tracer, request)
    try:
        try:
            runtime = state.current
            handler = _route(request, ctx)  # a refusal raises after auth
            cors = runtime.policy.cors
            if cors is not None and is_preflight(request.method, request.headers):
                response: AnyResponse = preflight(cors, request.headers)  # before auth
            else:
                if cors is not None:
                    ctx.cors = response_lines(cors, request.headers.get("origin"))
                path = request.path
                if path.startswith("/v1/") or path in runtime.policy.passthrough_paths:
                    authenticator = runtime.authenticator
                    if tracer is None:
                        ctx.identity = authenticator.authenticate(request.headers)
                    else:
                        with tracer.start_as_current_span("auth"):
                            ctx.identity = authenticator.authenticate(request.headers)
                response = await handler(request, ctx)
        except asyncio.CancelledError as cancel:
            if cancel.args and cancel.args[0] == SHUTDOWN_CUT:
                # still running when the shutdown grace ended; a stream keeps its status
                ctx.error = CUT_BY_SHUTDOWN
                ctx.status = ctx.status or 503
            else:
                ctx.status, ctx.error = 499, ctx.error or "client_disconnected"
            _finish(request, ctx, state)
            raise
        except Exception as exc:
            response = response_for(request, exc)
            if isinstance(exc, GatewayError):
                ctx.error = ctx.error or exc.code or type(exc).__name__
        if not response.prepared:
            # no handler sets it; as an encoded line (headers as pairs are formatted per line)
            response.block += header_line(b"x-request-id", ctx.request_id) + ctx.cors
        ctx.status = ctx.status or response.status
        _finish(request, ctx, state)
    finally:
        if span is not None:
            end_server_span(span, ctx)
    return response


def _finish(request: Request, ctx: RequestContext, state: GatewayState) -> None:
    """Count and log the finished request (probes and scrapes are not)."""
    runtime = state.current
    observability = runtime.policy.observability
    path = request.path
    if path in QUIET_PATHS or path == observability.metrics_path:
        return
    ctx.elapsed = time.perf_counter() - ctx.start
    state.parts.metrics.finished(ctx)
    if ctx.canary_arm:
        state.canaries.observe(ctx)
    if observability.access_log == "json":
        log_access(request, ctx, runtime.client_address)
