"""The inference endpoints the gateway proxies: completions, chat completions, embeddings,
responses (created here; by id: ``gateway.request.stored_responses``) and Anthropic's messages.

The body is forwarded unchanged except for the route's model rewrite and, on streams,
``stream_options.include_usage`` (so usage is always known; the extra chunk is dropped again
for clients that did not ask for it) and, on streams that may have to be resumed, vLLM's
``return_token_ids`` (dropped again likewise). Streams are relayed event by event; if the
upstream dies or stalls mid-stream the answer goes on from another endpoint
(``gateway.request.stream_resume``) or, when it cannot, the client gets an SSE error event and no
``[DONE]``. A client that goes away cancels the handler, which closes the upstream connection
at once.
"""

from __future__ import annotations

import asyncio
import time

from gateway.base.api import COMPLETIONS, Api
from gateway.base.context import RequestContext
from gateway.base.errors import (
    BadRequest,
    Evicted,
    NoEndpoint,
    Rejected,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.guards.admission import Admitted
from gateway.guards.deadlines import deadline, requested_deadline
from gateway.guards.limits.budgets import most_cost
from gateway.guards.limits.limiter import Reservation
from gateway.guards.spend import served, settled_cost
from gateway.request.attempt import Attempt
from gateway.request.disaggregation import run_prefill
from gateway.request.explain import HEADER as EXPLAIN_HEADER
from gateway.request.explain import explained, sent_elsewhere
from gateway.request.forward import Forward, parse
from gateway.request.relay import body_response, read_upstream_body, relay_body, relay_stream
from gateway.request.state import STATE
from gateway.request.stored_responses import created, led_by_previous
from gateway.request.stream_resume import StreamResume, asks_token_ids, may_resume
from gateway.request.tracing import decision_attributes, span
from gateway.request.upstream import UpstreamCall, client_request_headers, open_upstream
from gateway.request.upstream_payload import (
    has_engine_fields,
    payload_for,
    retention_hint,
    with_prompt_ids,
)
from gateway.response_cache.cache import HEADER as CACHE_HEADER
from gateway.response_cache.cache import replayed
from gateway.routing.endpoint_picker import Ranking
from gateway.routing.selector import Selection, select
from gateway.routing.shadow import Outcome, text_of
from kvgate.wire.http.messages import (
    AnyResponse,
    Request,
    Response,
    StreamResponse,
    header_line,
)
from kvgate.wire.model_name import model_restorer
from kvgate.wire.output_limit import OUTPUT_LIMITS
from kvgate.wire.responses_api import id_in_body
from kvgate.wire.routing_headers import INFERENCE_OBJECTIVE
from kvgate.wire.sse import SSERelay
from policies.schema import Pool
from policies.spend_section import Price


async def proxy(request: Request, ctx: RequestContext, path: str, api: Api) -> AnyResponse:
    """Proxy one request of ``api`` (``path``: the upstream path), step by step: parse it and
    find its route, choose the route's arm, answer from the response cache or reserve its
    limits, serve it from the arm's pool (or its fallbacks; with its shadow copy), settle what
    it used."""
    forward = parse(request, request.app[STATE], ctx, path, api)
    runtime = forward.runtime
    selection = _arm(forward)
    if forward.route.cache is not None and forward.form is None and api.cacheable:
        hit = await _cached(forward, selection.pool)
        if hit is not None:  # spends no limit, reaches no engine
            return hit
    reservation = await _reserve(forward, selection.pool) if runtime.limiter.active else None
    shadow = _shadow(forward)
    try:
        if forward.route.fallback:
            response = await _serve_with_fallbacks(forward, selection.pool)
        else:
            response = await _serve_pool(forward, runtime.policy.pools[selection.pool])
    finally:
        _settle(forward, reservation, selection.ab_arm)
    if shadow is not None:
        _compare(forward, shadow, response)
    return response


def _arm(forward: Forward) -> Selection:
    """The pool of the route that serves this request: its canary's or A/B test's arm."""
    request, ctx, route = forward.request, forward.ctx, forward.route
    if route.auto_canary is None:
        selection = select(route, forward.body, request.headers, ctx.identity)
    else:
        split = forward.state.canaries.split(ctx.model)
        selection = select(route, forward.body, request.headers, ctx.identity, canary=split)
        ctx.canary_arm = selection.pool
    if selection.ab_arm:
        ctx.add_headers({"x-kvgate-ab-arm": selection.ab_arm})
    return selection


async def _cached(forward: Forward, pool: str) -> Response | None:
    """The response cache's answer, or None (then ``forward.keep`` keeps this answer). A hit
    costs nothing, and says what the caller's budgets have left, as every answer does."""
    request, route, ctx = forward.request, forward.route, forward.ctx
    assert route.cache is not None
    found = await forward.state.response_cache.look_up(
        route.cache, forward.api, forward.body, request.headers, pool, ctx.tenant, ctx.model
    )
    ctx.cache, forward.keep = found.verdict, found.keep
    ctx.add_headers({CACHE_HEADER: found.verdict})
    if found.answer is None:
        return None
    ctx.status, ctx.endpoint = 200, "cache"
    ctx.canary_arm = ""  # a kept answer says nothing of the canary's engines
    ctx.ttft = time.perf_counter() - ctx.start
    hit = replayed(found.answer, ctx.extra_headers)
    for name, value in (await forward.runtime.limiter.spend_remaining(ctx.identity)).items():
        hit.block += header_line(name.encode(), value)
    return hit


async def _reserve(forward: Forward, pool: str) -> Reservation | None:
    """Take what the request may use from its rate limits and spend budgets."""
    runtime, ctx = forward.runtime, forward.ctx
    context_length = runtime.policy.pools[pool].max_model_len
    call = runtime.calls[pool]
    with span(call.tracer, "limits"):
        reservation = await runtime.limiter.reserve(
            ctx.identity,
            ctx.model,
            forward.request.path,
            forward.body,
            context_length,
            lambda: len(ids) if (ids := call.picker.prompt_token_ids(pool, forward.pick)) else None,
        )
    if reservation is not None:
        ctx.add_headers(reservation.headers)
        if reservation.budget_specs and forward.form is None:
            _hold_to_output_limit(forward, reservation.output_limit)
    return reservation


def _hold_to_output_limit(forward: Forward, limit: int) -> None:
    """Tell the engine the output limit a budget reserved, where the request asks for more or
    names none (the engine would write up to its context): a budget is a cap."""
    field = forward.api.output_field
    if field is None or limit <= 0:
        return
    body = forward.body
    name = next((n for n in OUTPUT_LIMITS if n in body), field)
    asked = body.get(name)
    if type(asked) is int and asked <= limit:
        return
    forward.body = {**body, name: limit}
    forward.rewritten = True


def _shadow(forward: Forward) -> asyncio.Task[Outcome | None] | None:
    """The route's shadow copy of the request, sent now (as JSON: never a form)."""
    route = forward.route
    if not route.shadow or forward.form is not None:
        return None
    runtime = forward.runtime
    return forward.state.shadow.start(
        runtime.policy,
        runtime.picker,
        route,
        forward.path,
        forward.body,
        forward.pick,
        runtime.upstream_tls,
    )


def _compare(forward: Forward, shadow: asyncio.Task[Outcome | None], response: AnyResponse) -> None:
    ctx = forward.ctx
    primary = Outcome(
        ctx.status,
        time.perf_counter() - ctx.start,
        ctx.completion_tokens if ctx.usage_known else None,
        text_of(response.body) if isinstance(response, Response) else None,
    )
    forward.state.shadow.compare(forward.route, shadow, primary)


def _settle(forward: Forward, reservation: Reservation | None, ab_arm: str | None) -> None:
    """Count what the request cost, settle its limits and budgets, record its A/B arm."""
    runtime, ctx, metrics = forward.runtime, forward.ctx, forward.state.parts.metrics
    prices = runtime.policy.spend.prices
    price = prices.get(ctx.model) if prices else None
    cost = None
    if price is not None:
        cost = settled_cost(price, ctx, metrics, lambda: _most_cost(forward, reservation, price))
    if reservation is not None:
        used = ctx.prompt_tokens + ctx.completion_tokens if ctx.usage_known else None
        if used is None and not served(ctx):
            used = 0
        runtime.limiter.settle(reservation, used, cost)
    if ab_arm:
        test, _, name = ab_arm.partition("=")
        metrics.child(metrics.ab_requests, test, name, str(ctx.status or 0)).inc()


def _most_cost(forward: Forward, reservation: Reservation | None, price: Price) -> float:
    """What the request was charged (its budgets' reservation), else the most it may cost."""
    if reservation is not None and reservation.budget_specs:
        return reservation.cost
    pool = forward.runtime.policy.pools.get(forward.ctx.pool)
    context_length = pool.max_model_len if pool is not None else None
    try:
        prompt, output = forward.runtime.limiter.estimate_parts(forward.body, context_length)
    except BadRequest:
        return 0.0
    return most_cost(price, prompt, output)


async def _serve_with_fallbacks(forward: Forward, first_pool: str) -> AnyResponse:
    """Serve from ``first_pool``; if it is saturated or none of its endpoints can answer before
    the first byte, from the pools of the route's fallback models, in order."""
    runtime, ctx, route = forward.runtime, forward.ctx, forward.route
    policy, metrics = runtime.policy, forward.state.parts.metrics
    admission = forward.state.admission
    pools = [first_pool]
    for name in route.fallback:
        fallback = policy.route_for(name)
        if fallback is not None:
            pools.append(select(fallback, forward.body, forward.request.headers, ctx.identity).pool)
    for index, pool_name in enumerate(pools):
        last = index == len(pools) - 1
        if not last and not admission.gate.has_room(pool_name):
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
    """Serve the request from ``pool``, step by step: classify it, shed it while its SLO budget
    is spent, admit it (waiting for capacity in its class), rank the pool's endpoints,
    prefill it first where the pool disaggregates, dispatch it, relay the answer."""
    ctx = forward.ctx
    admitted = _admitted(forward, pool)
    if admitted is None:
        admitted = await _queued(forward, pool)
    ctx.queue_wait = admitted.waited
    try:
        call, headers, ranking = _ranked(forward, pool)
        params = await _prefill(forward, pool, call, headers, ranking)
        resumes = may_resume(forward, call)
        payload = _upstream_payload(forward, pool, params, resumes)
        if forward.api.stored and "previous_response_id" in forward.body:
            previous = forward.body["previous_response_id"]
            ranking = await led_by_previous(forward.request, ctx, pool.name, previous, ranking)
        tried: set[str] = set()
        try:
            attempt = await open_upstream(
                call, pool, forward.path, payload, headers, forward.pick, ranking, tried
            )
        finally:
            ctx.attempts = len(tried)
        _dispatched(forward, attempt)
        try:
            return await _relayed(forward, pool, attempt, payload, headers, resumes, admitted)
        finally:
            attempt.close(ctx.prompt_tokens if ctx.usage_known else None)
    finally:
        admitted.release()


def _admitted(forward: Forward, pool: Pool) -> Admitted | None:
    """Classify the request (its identity's class, or its objective's when lighter), shed it
    while an SLO budget of its route is spent, and admit it if there is room and nobody
    queued (the common case)."""
    request, ctx, state = forward.request, forward.ctx, forward.state
    admission = state.admission
    ctx.pool = pool.name
    objective = request.headers.get(INFERENCE_OBJECTIVE)
    cls = admission.classify(
        ctx.identity.priority_class if ctx.identity else None,
        forward.runtime.policy.epp.class_of(objective) if objective else None,
    )
    ctx.priority_class = cls.name
    ctx.deadline = requested_deadline(request.headers)
    slos = state.slos
    if slos.shedding:
        slos.shed(ctx.model, cls.name)
    return admission.try_enter(pool.name)


async def _queued(forward: Forward, pool: Pool) -> Admitted:
    """Wait in the admission queue for capacity in ``pool``, until the request's deadline at
    the latest."""
    ctx = forward.ctx
    admission = forward.state.admission
    spec = admission.class_of(ctx.priority_class)
    due = deadline(ctx.deadline, spec, forward.runtime.policy.slos, ctx.model, ctx.start)
    tracer = forward.runtime.calls[pool.name].tracer
    attributes: dict[str, str | int] | None = None
    if tracer is not None:
        attributes = {
            "kvgate.admission.class": ctx.priority_class,
            "kvgate.admission.queued_ahead": admission.depth(pool.name, ctx.priority_class),
        }
    try:
        with span(tracer, "admission", attributes):
            return await admission.enter(pool.name, spec.name, ctx.tenant, deadline=due)
    except (Rejected, Evicted) as exc:
        metrics = forward.state.parts.metrics
        metrics.child(metrics.queue_rejections, ctx.priority_class, exc.reason).inc()
        raise


async def _prefill(
    forward: Forward, pool: Pool, call: UpstreamCall, headers: bytes, ranking: Ranking
) -> dict[str, object] | None:
    """The KV-transfer parameters of the prompt's prefill hop, where the pool's picker chose
    to disaggregate the request; None when the ranked endpoints serve it whole."""
    prefiller = ranking.prefill() if forward.form is None else None
    if prefiller is None:
        return None
    body, model = forward.body, forward.ctx.model
    hop = body if not pool.model or pool.model == model else {**body, "model": pool.model}
    return await run_prefill(call, pool, forward.path, hop, headers, prefiller, ranking)


async def _relayed(
    forward: Forward,
    pool: Pool,
    attempt: Attempt,
    payload: bytes,
    headers: bytes,
    resumes: bool,
    admitted: Admitted,
) -> AnyResponse:
    """The upstream's answer relayed: a stream event by event, a JSON body read whole,
    anything else as it comes."""
    request, ctx = forward.request, forward.ctx
    upstream = attempt.response
    assert upstream is not None  # an open attempt has its response head
    if upstream.content_type == "text/event-stream":
        return await _streamed(forward, pool, attempt, payload, headers, resumes, admitted)
    idle = forward.runtime.policy.timeouts.idle
    data = upstream.read_now()  # a whole JSON body usually comes with the headers
    if data is None:
        if upstream.content_type != "application/json":  # nothing in it to read
            return await relay_body(request, ctx, attempt, upstream, idle)
        data = await read_upstream_body(ctx, attempt, upstream, idle)
    if forward.api.stored and upstream.status == 200:
        created(request, ctx, id_in_body(data))
    response = body_response(ctx, upstream, data, model_restorer(pool.model, ctx.model))
    if forward.keep is not None:
        forward.keep.answer(ctx, upstream.status, upstream.content_type, response.body)
    return response


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
        explain = forward.route.explain
        ctx.explanation, header = explained(pool.name, ranking, explain, ctx.tenant, ctx.explain)
        if header is not None:
            ctx.add_headers({EXPLAIN_HEADER: header})
    return call, headers, ranking


def _dispatched(forward: Forward, attempt: Attempt) -> None:
    """The request went to ``attempt``'s endpoint: the context says which (and, explained, that
    it was not the pick where so)."""
    ctx = forward.ctx
    ctx.endpoint = attempt.endpoint.address
    if ctx.explanation is not None:
        header = (ctx.extra_headers or {}).get(EXPLAIN_HEADER)
        moved = sent_elsewhere(ctx.explanation, header, ctx.endpoint)
        if moved is not None:
            ctx.explanation, header = moved
            if header is not None:
                ctx.add_headers({EXPLAIN_HEADER: header})


async def _streamed(
    forward: Forward,
    pool: Pool,
    attempt: Attempt,
    payload: bytes,
    headers: bytes,
    resumes: bool,
    admitted: Admitted,
) -> StreamResponse:
    """The upstream's stream relayed event by event (kept by the response cache, when it
    missed and the stream ends whole); one that can go on elsewhere may be paused while it
    runs, where its class allows."""
    request, ctx, keep = forward.request, forward.ctx, forward.keep
    upstream = attempt.response
    assert upstream is not None
    relay, resume = _stream_relay(forward, pool, payload, headers, resumes)
    idle, restore = forward.runtime.policy.timeouts.idle, model_restorer(pool.model, ctx.model)
    copy = None if keep is None else keep.copy
    copy_limit = forward.state.response_cache.settings.max_entry
    admission = forward.state.admission
    spec = admission.class_of(ctx.priority_class) if resume is not None else None
    with admission.streams.running(pool.name, admitted, spec, ctx.tenant) as pause:
        streamed = await relay_stream(
            request, ctx, attempt, upstream, idle, relay, resume, restore, copy, copy_limit, pause
        )
    if forward.api.stored:
        created(request, ctx, relay.response_id)
    elif keep is not None:
        keep.stream(ctx, streamed.copy is not None)
    return streamed


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
    if pool.tokenized_prompts and forward.api is COMPLETIONS:
        ids = forward.runtime.calls[pool.name].picker.prompt_token_ids(pool.name, forward.pick)
        body = with_prompt_ids(body, ids) or body
    add_usage = ctx.stream and not forward.client_wants_usage and forward.api.usage_on_request
    add_ids = resumes and asks_token_ids(pool, body)
    add_counts = resumes and not pool.returns_token_ids
    hints = retention_hint(pool, body, ctx.tenant) if pool.kv_retention else None
    if (
        pool.model
        or add_usage
        or params is not None
        or hints is not None
        or has_engine_fields(body)
        or add_ids
        or add_counts
        or forward.rewritten
        or body is not forward.body
    ):
        return payload_for(
            body,
            pool,
            ctx.model,
            raw=None if forward.rewritten or body is not forward.body else forward.raw,
            usage=add_usage,
            counts=add_counts,
            kv_transfer_params=params,
            token_ids=add_ids,
            kv_hints=hints,
        )
    return forward.raw


def _stream_relay(
    forward: Forward, pool: Pool, payload: bytes, headers: bytes, resumes: bool
) -> tuple[SSERelay, StreamResume | None]:
    """How the upstream's stream is relayed, and how it goes on if its engine fails."""
    if not resumes:
        return forward.api.relay(strip_usage=not forward.client_wants_usage), None
    resume = StreamResume(forward, pool, payload, headers)
    return resume.relay(), resume
