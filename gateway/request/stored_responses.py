"""Stored responses (``/v1/responses``): which endpoint holds each one, and the requests about one
by id — retrieve, delete, cancel, list its input items, and a create that continues it
(``previous_response_id``).

A backend keeps the responses it created in its own memory (vLLM, the bundled backend), so a
request about one must reach that endpoint. The gateway remembers where each response it relayed
came from and for whom (bounded; the least recently used is forgotten first). An id it does not
know (another gateway replica or worker relayed it, or this one restarted) is looked up by asking
every endpoint of the pools the caller may use, all at once; the first that has it answers, and
is remembered. A response whose creator the gateway knows is reachable by that tenant only; to
anyone else it does not exist.
"""

from __future__ import annotations

import asyncio

from gateway.base.context import RequestContext
from gateway.base.errors import MethodNotAllowed, NotFound
from gateway.base.identity import Identity
from gateway.request.attempt import CONNECT_FAILED, TIMED_OUT, Attempt
from gateway.request.relay import body_response, read_upstream_body, relay_stream
from gateway.request.runtime import Runtime
from gateway.request.state import STATE
from gateway.request.upstream import (
    RETRYABLE,
    as_gateway_error,
    client_request_headers,
    upstream_headers,
)
from gateway.routing.endpoint_picker import EndpointState, Ranking
from kvgate.response_homes import Home, holds
from kvgate.wire.http.messages import AnyResponse, Request
from kvgate.wire.model_name import model_restorer
from kvgate.wire.openai_errors import response_not_found
from kvgate.wire.responses_api import ACTIONS, RESPONSE_ID, addressed_response
from kvgate.wire.responses_api import STORED_PREFIX as PREFIX
from kvgate.wire.sse import ResponsesRelay
from policies.schema import Policy


def route_name(path: str) -> str:
    """The metrics' route label of a path under ``/v1/responses/``: its id as ``{id}``."""
    _, slash, action = path[len(PREFIX) :].partition("/")
    return f"{PREFIX}{{id}}{slash}{action}" if slash + action in ACTIONS else "other"


def owner_of(identity: Identity | None) -> str | None:
    return None if identity is None or identity.method == "anonymous" else identity.tenant


def created(request: Request, ctx: RequestContext, response_id: str) -> None:
    """A response the gateway just relayed from ``ctx.endpoint``: remember its home."""
    if response_id:
        home = Home(ctx.pool, ctx.endpoint, ctx.model, owner_of(ctx.identity))
        request.app[STATE].response_homes.remember(response_id, home)


def pools_for(policy: Policy, identity: Identity | None) -> dict[str, str]:
    """Pool -> a public model routed to it, for the pools the caller may reach."""
    pools: dict[str, str] = {}
    for route in policy.routes:
        if identity is not None and not identity.may_use(route.model):
            continue
        arms = route.ab_test.arms if route.ab_test is not None else ()
        for name in (route.pool, *(w.pool for w in route.canary), *(a.pool for a in arms)):
            if name:
                pools.setdefault(name, route.model)
    return pools


async def locate(
    request: Request, ctx: RequestContext, response_id: str, pools: dict[str, str]
) -> Home | None:
    """The home of ``response_id`` among ``pools`` (pool -> public model), or None when none
    of their endpoints has it. ``NotFound`` when its creator is another tenant."""
    state = request.app[STATE]
    runtime, homes = state.current, state.response_homes
    known = homes.get(response_id)
    if known is not None and known.owner not in (None, owner_of(ctx.identity)):
        raise NotFound(response_not_found(response_id), param="response_id")
    candidates = {p: [e.address for e in runtime.endpoints.get(p, ())] for p in pools}

    async def has(pool: str, address: str) -> bool:
        call = runtime.calls[pool]
        headers = upstream_headers([], ctx.request_id, runtime.policy.pools[pool])
        return await holds(call.pool, address, response_id, headers, call.timeouts.first_byte)

    return await homes.find(response_id, candidates, has, pools.__getitem__)


def _endpoint(runtime: Runtime, pool: str, address: str) -> EndpointState | None:
    for endpoint in runtime.endpoints.get(pool, ()):
        if endpoint.address == address:
            return endpoint
    return None


async def home_of(request: Request, ctx: RequestContext) -> tuple[str, Home, EndpointState]:
    """Where a request about a stored response goes (``/v1/responses/{id}``: GET, DELETE;
    ``.../cancel``: POST; ``.../input_items``: GET): the response's id, its home and its
    endpoint. ``NotFound`` where none holds it for this caller."""
    addressed = addressed_response(request.path)
    if addressed is None:
        raise NotFound(f"no route for {request.path}")
    response_id, action = addressed
    methods = ACTIONS[action]
    if request.method not in methods and not (request.method == "HEAD" and "GET" in methods):
        allow = ", ".join(methods)
        raise MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}", headers={"allow": allow}
        )
    runtime = request.app[STATE].current
    home = await locate(request, ctx, response_id, pools_for(runtime.policy, ctx.identity))
    endpoint = None if home is None else _endpoint(runtime, home.pool, home.endpoint)
    if home is None or endpoint is None:
        raise NotFound(response_not_found(response_id), param="response_id")
    return response_id, home, endpoint


async def send_home(
    request: Request, ctx: RequestContext, response_id: str, endpoint: EndpointState
) -> AnyResponse:
    """The request about stored response ``response_id`` sent to ``endpoint`` (of
    ``ctx.pool``), its home; its answer relayed as it is (a deleted response's home is
    forgotten)."""
    state = request.app[STATE]
    response = await _send(request, ctx, state.current, endpoint)
    if request.method == "DELETE" and ctx.status == 200:
        state.response_homes.forget(response_id)
    return response


async def _send(
    request: Request, ctx: RequestContext, runtime: Runtime, endpoint: EndpointState
) -> AnyResponse:
    pool = runtime.policy.pools[ctx.pool]
    call = runtime.calls[ctx.pool]
    headers = client_request_headers(request, runtime.client_address, ctx.request_id, pool)
    target = f"{request.path}?{request.query}" if request.query else request.path
    method = "GET" if request.method == "HEAD" else request.method
    attempt = Attempt(endpoint)
    try:
        upstream = await call.pool.request(
            endpoint.address, method, target, headers, request.body,
            first_byte=call.timeouts.first_byte,
        )  # fmt: skip
    except RETRYABLE as exc:
        attempt.fail(TIMED_OUT if isinstance(exc, asyncio.TimeoutError) else CONNECT_FAILED)
        raise as_gateway_error(exc, endpoint) from exc
    attempt.answered(upstream)
    idle = runtime.policy.timeouts.idle
    restore = model_restorer(pool.model, ctx.model)
    try:
        if upstream.content_type == "text/event-stream":
            relay = ResponsesRelay()
            return await relay_stream(request, ctx, attempt, upstream, idle, relay, None, restore)
        data = upstream.read_now()
        if data is None:
            data = await read_upstream_body(ctx, attempt, upstream, idle)
        return body_response(ctx, upstream, data, restore)
    finally:
        attempt.close()


class HomeFirstRanking:
    """A ranking whose first endpoint is the one holding the response a create builds on
    (``previous_response_id``); the picker's ranking after it (retries)."""

    def __init__(self, home: EndpointState, ranking: Ranking) -> None:
        self._home: EndpointState | None = home
        self._ranking = ranking

    def next(self, exclude: set[str]) -> EndpointState | None:
        home, self._home = self._home, None
        if home is not None and home.address not in exclude:
            return home
        return self._ranking.next(exclude)

    def refused(self, endpoint: EndpointState) -> None:
        self._ranking.refused(endpoint)

    def started(self, endpoint: EndpointState) -> None:
        self._ranking.started(endpoint)

    def finished(self, endpoint: EndpointState, prompt_tokens: int | None = None) -> None:
        self._ranking.finished(endpoint, prompt_tokens)

    def prefill(self) -> EndpointState | None:
        return None  # the previous response's endpoint has its conversation: no hop


async def led_by_previous(
    request: Request, ctx: RequestContext, pool: str, previous: object, ranking: Ranking
) -> Ranking:
    """``ranking``, led by the endpoint that holds ``previous`` (a create's
    ``previous_response_id``) when it is in ``pool``."""
    if not isinstance(previous, str) or not RESPONSE_ID.fullmatch(previous):
        return ranking
    home = await locate(request, ctx, previous, {pool: ctx.model})
    if home is None:
        return ranking  # nowhere: the endpoint the picker chose answers that it has none
    endpoint = _endpoint(request.app[STATE].current, pool, home.endpoint)
    return ranking if endpoint is None else HomeFirstRanking(endpoint, ranking)
