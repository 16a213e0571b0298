"""The inference endpoints the gateway proxies: completions, chat completions, embeddings,
responses (created here; by id: ``gateway.stored_responses``) and Anthropic's messages.

The body is forwarded unchanged except for the route's model rewrite and, on streams,
``stream_options.include_usage`` (so usage is always known; the extra chunk is dropped again
for clients that did not ask for it) and, on streams that may have to be resumed, vLLM's
``return_token_ids`` (dropped again likewise). Streams are relayed event by event; if the
upstream dies or stalls mid-stream the answer goes on from another endpoint
(``gateway.stream_resume``) or, when it cannot, the client gets an SSE error event and no
``[DONE]``. A client that goes away cancels the handler, which closes the upstream connection
at once.
"""

from __future__ import annotations

import time

from gateway.admission import AdmissionQueue
from gateway.attempt import Attempt
from gateway.context import RequestContext
from gateway.disaggregation import run_prefill
from gateway.endpoint_picker import PickRequest, Ranking
from gateway.errors import (
    BadRequest,
    Evicted,
    ModelNotFound,
    NoEndpoint,
    NotFound,
    Rejected,
    SloShed,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.explain import explain_mode, record_explanation
from gateway.form_body import FormBody
from gateway.keys import ADMISSION, CANARIES, METRICS, RESPONSE_CACHE, RUNTIME, SHADOW, SLOS
from gateway.limits.limiter import Reservation
from gateway.metrics import GatewayMetrics
from gateway.relay import body_response, read_upstream_body, relay_body, relay_stream
from gateway.request_body import read_body
from gateway.response_cache.cache import Keep
from gateway.routing.selector import Selection, select
from gateway.routing.shadow import Outcome, text_of
from gateway.runtime import Runtime
from gateway.spend import settled_cost
from gateway.stored_responses import continuing, created
from gateway.stream_resume import StreamResume, asks_token_ids, stream_resume
from gateway.tracing import decision_attributes, span
from gateway.upstream import UpstreamCall, client_request_headers, open_upstream
from gateway.upstream_payload import KV_TRANSFER, payload_for, pool_body
from kvgate.wire.http.messages import AnyResponse, Request, Response, StreamResponse
from kvgate.wire.messages_api import MESSAGES_PATH, chat_messages
from kvgate.wire.model_name import model_restorer
from kvgate.wire.openai_errors import MODEL_REQUIRED, unknown_model
from kvgate.wire.responses_api import RESPONSES_PATH, id_in_body, input_messages
from kvgate.wire.routing_headers import INFERENCE_OBJECTIVE
from kvgate.wire.sse import MessagesRelay, ResponsesRelay, SSERelay
from policies.schema import Policy, Pool, Route

# the streams that report usage in a last chunk only when stream_options asks for it
OPENAI_STREAMS = frozenset({"/v1/chat/completions", "/v1/completions"})


async def proxy(
    request: Request, ctx: RequestContext, path: str, streams: bool = True
) -> AnyResponse:
    """Proxy one OpenAI API request (``path``: the upstream path; ``streams``: whether the
    endpoint can stream): read it, find its route and arm, answer from the response cache or
    reserve its limits, send it to a pool (with its shadow copy), settle what it used."""
    app = request.app
    runtime = app[RUNTIME].current
    policy = runtime.policy
    listen = policy.listen
    forms = path in policy.passthrough_paths
    raw, body, form = read_body(request, listen.max_body_bytes, listen.max_json_depth, forms)
    route = _route(policy, ctx, path, body)
    if route.explain is not None:
        ctx.explain = explain_mode(route.explain, request.headers, ctx)
    stream = body.get("stream")
    ctx.stream = (streams and stream is True) or (form is not None and stream == "true")
    options = body.get("stream_options")
    # a form's stream is passed on as it is: nothing is added to it, so nothing is stripped
    client_wants_usage = form is not None or (
        isinstance(options, dict) and options.get("include_usage") is True
    )
    selection = _arm(request, ctx, route, body)
    keep = None
    if route.cache is not None and form is None:
        cache, headers = app[RESPONSE_CACHE], request.headers
        hit, keep = await cache.look_up(ctx, route.cache, path, body, headers, selection.pool)
        if hit is not None:  # spends no limit, reaches no engine
            return hit
    reservation = None
    if runtime.limiter.active:
        reservation = await _reserve(request, runtime, ctx, body, selection.pool)
    routed = _routed_body(path, body)
    pick = PickRequest(ctx.model, routed, request.headers, ctx.identity, ctx.request_id)
    shadow = None
    if route.shadow and form is None:  # a shadow copy is sent as JSON
        shadow = app[SHADOW].start(
            policy, runtime.picker, route, path, body, pick, runtime.upstream_tls
        )
    forward = Forward(
        request, runtime, ctx, path, raw, body, pick, client_wants_usage, form, route.resume, keep
    )
    try:
        if route.fallback:
            response = await _serve_with_fallbacks(forward, route, selection.pool)
        else:
            response = await _serve_pool(forward, policy.pools[selection.pool])
    finally:
        _settle(request, runtime, ctx, reservation, selection.ab_arm)
    if shadow is not None:
        primary = Outcome(
            ctx.status,
            time.perf_counter() - ctx.start,
            ctx.completion_tokens if ctx.usage_known else None,
            text_of(response.body) if isinstance(response, Response) else None,
        )
        app[SHADOW].compare(route, shadow, primary)
    return response


def _routed_body(path: str, body: dict[str, object]) -> dict[str, object]:
    """The body the picker reads: a response's input and a message's system prompt and content
    blocks as the chat messages they render to."""
    if path == RESPONSES_PATH:
        return {**body, "messages": input_messages(body)}
    if path == MESSAGES_PATH:
        return {**body, "messages": chat_messages(body)}
    return body


def _route(policy: Policy, ctx: RequestContext, path: str, body: dict[str, object]) -> Route:
    """The route of the body's model, which the caller must be allowed and which must take
    ``path``."""
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


def _arm(request: Request, ctx: RequestContext, route: Route, body: dict[str, object]) -> Selection:
    """The pool of the route that serves this request: its canary's or A/B test's arm."""
    if route.auto_canary is None:
        selection = select(route, body, request.headers, ctx.identity)
    else:
        split = request.app[CANARIES].split(ctx.model)
        selection = select(route, body, request.headers, ctx.identity, canary=split)
        ctx.canary_arm = selection.pool
    if selection.ab_arm:
        ctx.add_headers({"x-kvgate-ab-arm": selection.ab_arm})
    return selection


async def _reserve(
    request: Request, runtime: Runtime, ctx: RequestContext, body: dict[str, object], pool: str
) -> Reservation | None:
    """Take what the request may use from its rate limits and spend budgets."""
    limiter = runtime.limiter
    context_length = runtime.policy.pools[pool].max_model_len
    with span(runtime.calls[pool].tracer, "limits"):
        reservation = await limiter.reserve(
            ctx.identity, ctx.model, request.path, body, context_length
        )
    if reservation is not None:
        ctx.add_headers(reservation.headers)
    return reservation


def _settle(
    request: Request,
    runtime: Runtime,
    ctx: RequestContext,
    reservation: Reservation | None,
    ab_arm: str | None,
) -> None:
    """Count what the request cost, settle its limits and budgets, record its A/B arm."""
    prices = runtime.policy.spend.prices
    price = prices.get(ctx.model) if prices else None
    cost = None if price is None else settled_cost(price, ctx, request.app[METRICS])
    if reservation is not None:
        used = ctx.prompt_tokens + ctx.completion_tokens if ctx.usage_known else None
        runtime.limiter.settle(reservation, used, cost)
    if ab_arm:
        _record_ab(request.app[METRICS], ab_arm, ctx)


class Forward:
    """What sending one request upstream needs, whichever pool serves it (a plain slots class:
    one is made per request)."""

    __slots__ = (
        "body",
        "client_wants_usage",
        "ctx",
        "form",
        "keep",
        "path",
        "pick",
        "raw",
        "request",
        "resume",
        "runtime",
    )

    def __init__(
        self,
        request: Request,
        runtime: Runtime,
        ctx: RequestContext,
        path: str,
        raw: bytes,
        body: dict[str, object],
        pick: PickRequest,
        client_wants_usage: bool,
        form: FormBody | None = None,
        resume: bool = False,
        keep: Keep | None = None,
    ) -> None:
        self.request = request
        self.runtime = runtime
        self.ctx = ctx
        self.path = path  # the upstream path
        self.raw = raw  # the client's body as sent
        self.body = body  # ... parsed
        self.pick = pick
        self.client_wants_usage = client_wants_usage
        self.form = form  # a multipart body: forwarded as sent, but for its model field
        self.resume = resume  # the route lets a broken stream go on elsewhere
        self.keep = keep  # where the answer is kept (the response cache missed)


async def _serve_with_fallbacks(forward: Forward, route: Route, first_pool: str) -> AnyResponse:
    """Serve from ``first_pool``; if it is saturated or none of its endpoints can answer before
    the first byte, from the pools of the route's fallback models, in order."""
    runtime, ctx = forward.runtime, forward.ctx
    policy, metrics = runtime.policy, forward.request.app[METRICS]
    admission = forward.request.app[ADMISSION]
    pools = [first_pool]
    for name in route.fallback:
        fallback = policy.route_for(name)
        if fallback is not None:
            pools.append(select(fallback, forward.body, forward.request.headers, ctx.identity).pool)
    for index, pool_name in enumerate(pools):
        last = index == len(pools) - 1
        if not last and not admission.gate.has_capacity(pool_name):
            metrics.child(metrics.fallbacks, route.model, "saturated").inc()
            continue
        try:
            return await _serve_pool(forward, policy.pools[pool_name])
        except (NoEndpoint, UpstreamError, UpstreamTimeout):
            if last:
                raise
            metrics.child(metrics.fallbacks, route.model, "unavailable").inc()
    raise NoEndpoint(f"no pool of route '{route.model}' can serve the request")


async def _serve_pool(forward: Forward, pool: Pool) -> AnyResponse:
    """Wait for capacity in ``pool`` (in the caller's priority class), send the request to one
    of its endpoints (after its prefill hop, where the pool disaggregates) and relay the
    answer: a stream event by event, a JSON body read whole, anything else as it comes."""
    request, runtime, ctx = forward.request, forward.runtime, forward.ctx
    admission = request.app[ADMISSION]
    if not _admitted_at_once(forward, pool, admission):
        await _queued(forward, pool, admission)
    try:
        body, form = forward.body, forward.form
        call, headers, ranking = _ranked(forward, pool)
        prefiller = ranking.prefill() if form is None else None
        params = None
        if prefiller is not None:  # a prefill/decode pool disaggregates this request
            hop = (
                body if not pool.model or pool.model == ctx.model else {**body, "model": pool.model}
            )
            params = await run_prefill(call, pool, forward.path, hop, headers, prefiller, ranking)
        resumes = form is None and stream_resume(call, ctx, forward.path, body, forward.resume)
        payload = _upstream_payload(forward, pool, params, resumes)
        responses = forward.path == RESPONSES_PATH
        if responses and "previous_response_id" in body:
            previous = body["previous_response_id"]
            ranking = await continuing(request, ctx, pool.name, previous, ranking)
        attempt = await open_upstream(
            call, ctx, pool, forward.path, payload, headers, forward.pick, ranking
        )
        ctx.endpoint = attempt.endpoint.address
        upstream = attempt.response
        assert upstream is not None  # an open attempt has its response head
        idle = runtime.policy.timeouts.idle
        try:
            if upstream.content_type == "text/event-stream":
                return await _streamed(forward, pool, attempt, payload, headers, resumes)
            data = upstream.read_now()  # a whole JSON body usually comes with the headers
            if data is None:
                if upstream.content_type != "application/json":  # nothing in it to read
                    return await relay_body(request, ctx, attempt, upstream, idle)
                data = await read_upstream_body(ctx, attempt, upstream, idle)
            if responses and upstream.status == 200:
                created(request, ctx, id_in_body(data))
            response = body_response(ctx, upstream, data, model_restorer(pool.model, ctx.model))
            if forward.keep is not None:
                forward.keep.body(upstream.status, upstream.content_type, response.body)
            return response
        finally:
            attempt.close(ctx.prompt_tokens if ctx.usage_known else None)
    finally:
        admission.done(pool.name)


def _ranked(forward: Forward, pool: Pool) -> tuple[UpstreamCall, bytes, Ranking]:
    """What sending to ``pool`` needs, the headers sent, and its endpoints in the picker's
    order."""
    request, runtime, ctx, form = forward.request, forward.runtime, forward.ctx, forward.form
    content_type = None if form is None else form.content_type
    headers = client_request_headers(
        request, runtime.client_address, ctx.request_id, pool, content_type
    )
    call = runtime.calls[pool.name]
    if call.tracer is None:
        ranking = call.picker.rank(pool.name, forward.pick)
    else:
        attributes = {"kvgate.pool": pool.name}
        with call.tracer.start_as_current_span("route", attributes=attributes) as route:
            ranking = call.picker.rank(pool.name, forward.pick)
            route.set_attributes(decision_attributes(ranking))
    if ctx.explain:
        record_explanation(ctx, pool.name, ranking)
    return call, headers, ranking


async def _streamed(
    forward: Forward, pool: Pool, attempt: Attempt, payload: bytes, headers: bytes, resumes: bool
) -> StreamResponse:
    """The upstream's stream relayed event by event (kept by the response cache, when it
    missed and the stream ends whole)."""
    request, ctx, keep = forward.request, forward.ctx, forward.keep
    upstream = attempt.response
    assert upstream is not None
    relay, resume = _stream_relay(forward, pool, payload, headers, resumes)
    idle, restore = forward.runtime.policy.timeouts.idle, model_restorer(pool.model, ctx.model)
    copy = None if keep is None else keep.copy
    streamed = await relay_stream(
        request, ctx, attempt, upstream, idle, relay, resume, restore, copy
    )
    if forward.path == RESPONSES_PATH:
        created(request, ctx, relay.response_id)
    elif keep is not None:
        keep.stream(ctx)
    return streamed


def _admitted_at_once(forward: Forward, pool: Pool, admission: AdmissionQueue) -> bool:
    """Set the request's admission class (its identity's, or its objective's when lighter),
    shed it when its SLO budget is spent, and admit it if there is room and nobody queued."""
    request, runtime, ctx = forward.request, forward.runtime, forward.ctx
    ctx.pool = pool.name
    cls = admission.class_of(ctx.identity.priority_class if ctx.identity else None)
    objective = request.headers.get(INFERENCE_OBJECTIVE)
    if objective:  # an objective may put the request in a lighter class, never a heavier one
        lighter = admission.classes.get(runtime.policy.epp.class_of(objective) or "")
        if lighter is not None and lighter.weight <= cls.weight:
            cls = lighter
    ctx.priority_class = cls.name
    shedding = request.app[SLOS].shedding
    if shedding and ctx.priority_class in shedding.get(ctx.model, ()):
        raise SloShed(
            f"an SLO budget of `{ctx.model}` is spent; {ctx.priority_class} requests are shed "
            "until it recovers",
            headers={"retry-after": "30"},
        )
    if admission.try_admit(pool.name):  # the common case: room, nobody queued
        ctx.queue_wait = 0.0
        return True
    return False


async def _queued(forward: Forward, pool: Pool, admission: AdmissionQueue) -> None:
    """Wait in the admission queue for capacity in ``pool``."""
    ctx = forward.ctx
    tracer = forward.runtime.calls[pool.name].tracer
    attributes: dict[str, str | int] | None = None
    if tracer is not None:
        attributes = {
            "kvgate.admission.class": ctx.priority_class,
            "kvgate.admission.queued_ahead": admission.depth(pool.name, ctx.priority_class),
        }
    try:
        with span(tracer, "admission", attributes):
            ctx.queue_wait = await admission.admit(pool.name, ctx.priority_class, ctx.tenant)
    except (Rejected, Evicted) as exc:
        reason = "full" if isinstance(exc, Rejected) else "expired"
        metrics = forward.request.app[METRICS]
        metrics.child(metrics.queue_rejections, ctx.priority_class, reason).inc()
        raise


def _upstream_payload(
    forward: Forward, pool: Pool, params: dict[str, object] | None, resumes: bool
) -> bytes:
    """The bytes sent upstream: the client's, unless the pool, usage, a prefill hop or a
    resumable stream change the body."""
    body, form, ctx = forward.body, forward.form, forward.ctx
    if form is not None:
        return (
            form.with_model(pool.model) if pool.model and pool.model != ctx.model else forward.raw
        )
    add_usage = ctx.stream and not forward.client_wants_usage and forward.path in OPENAI_STREAMS
    add_ids = resumes and asks_token_ids(pool, body)
    if pool.model or add_usage or params is not None or KV_TRANSFER in body or add_ids:
        return payload_for(forward.raw, body, pool, ctx.model, add_usage, params, add_ids)
    return forward.raw


def _stream_relay(
    forward: Forward, pool: Pool, payload: bytes, headers: bytes, resumes: bool
) -> tuple[SSERelay, StreamResume | None]:
    """How the upstream's stream is relayed, and how it goes on if its engine fails."""
    if forward.path == RESPONSES_PATH:
        return ResponsesRelay(), None
    if forward.path == MESSAGES_PATH:
        return MessagesRelay(), None
    if not resumes:
        return SSERelay(strip_usage=not forward.client_wants_usage), None
    ctx = forward.ctx
    resume = StreamResume(
        forward.runtime.calls[pool.name],
        ctx,
        pool,
        forward.path,
        pool_body(forward.body, pool, ctx.model),
        payload,
        headers,
        forward.pick,
        forward.client_wants_usage,
    )
    return resume.relay(), resume


def _record_ab(metrics: GatewayMetrics, arm: str, ctx: RequestContext) -> None:
    test, _, name = arm.partition("=")
    metrics.child(metrics.ab_requests, test, name, str(ctx.status or 0)).inc()
