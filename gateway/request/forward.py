"""The first step of proxying a request: its body read and bounded, its route found, how it
streams decided. The ``Forward`` it makes is what every later step reads (``gateway.request.proxy``
lists them)."""

from __future__ import annotations

from gateway.base.api import Api
from gateway.base.context import RequestContext
from gateway.base.errors import BadRequest, ModelNotFound, NotFound
from gateway.request.explain import explain_mode
from gateway.request.form_body import FormBody
from gateway.request.request_body import read_body
from gateway.request.state import GatewayState
from gateway.response_cache.cache import Keep
from gateway.routing.endpoint_picker import PickRequest
from kvgate.wire.http.messages import Request
from kvgate.wire.openai_errors import MODEL_REQUIRED, unknown_model
from policies.schema import Policy, Route


class Forward:
    """One request on its way upstream, whichever pool serves it (a plain slots class: one is
    made per request)."""

    __slots__ = (
        "api",
        "body",
        "client_wants_usage",
        "ctx",
        "form",
        "keep",
        "path",
        "pick",
        "raw",
        "request",
        "rewritten",
        "route",
        "runtime",
        "state",
    )

    def __init__(
        self,
        request: Request,
        state: GatewayState,
        ctx: RequestContext,
        path: str,
        api: Api,
        raw: bytes,
        body: dict[str, object],
        route: Route,
        client_wants_usage: bool,
        form: FormBody | None = None,
    ) -> None:
        self.request = request
        self.state = state  # the gateway's
        self.runtime = state.current  # the policy's, as the request arrived
        self.ctx = ctx
        self.path = path  # the upstream path
        self.api = api  # the API it speaks
        self.raw = raw  # the client's body as sent (decoded)
        self.body = body  # ... parsed (changed by the gateway where ``rewritten``)
        self.rewritten = False  # the body differs from ``raw`` (an output limit was set)
        self.route = route
        self.client_wants_usage = client_wants_usage
        self.form = form  # a multipart body: forwarded as sent, but for its model field
        self.pick = PickRequest(
            ctx.model, api.routed(body), request.headers, ctx.identity, ctx.request_id
        )
        self.keep: Keep | None = None  # where the answer is kept (the response cache missed)


def parse(
    request: Request, state: GatewayState, ctx: RequestContext, path: str, api: Api
) -> Forward:
    """Read the body (bounded in size and depth), find the route of its model (which the
    caller must be allowed and which must take ``path``), and whether the answer streams
    (where ``api`` can) and reports usage to the client."""
    policy = state.current.policy
    listen = policy.listen
    forms = path in policy.passthrough_paths
    raw, body, form = read_body(request, listen.max_body_bytes, listen.max_json_depth, forms)
    route = _route(policy, ctx, path, body)
    if route.explain is not None:
        ctx.explain = explain_mode(route.explain, request.headers, ctx.tenant)
    stream = body.get("stream")
    ctx.stream = (api.streams and stream is True) or (form is not None and stream == "true")
    options = body.get("stream_options")
    # a form's stream is passed on as it is: nothing is added to it, so nothing is stripped
    client_wants_usage = form is not None or (
        isinstance(options, dict) and options.get("include_usage") is True
    )
    return Forward(request, state, ctx, path, api, raw, body, route, client_wants_usage, form)


def _route(policy: Policy, ctx: RequestContext, path: str, body: dict[str, object]) -> Route:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(MODEL_REQUIRED, param="model")
    ctx.model = model
    route = policy.route_for(model)
    if route is None or (ctx.identity is not None and not ctx.identity.may_use(model)):
        raise ModelNotFound(unknown_model(model), param="model")
    if path in policy.passthrough_paths and path not in route.paths:
        raise NotFound(f"{path} is not enabled for the model `{model}` (its route's paths)")
    return route
