"""Open an upstream response: rank the pool's endpoints, send, retry down the ranking before
the first byte.

A connect error, a timeout waiting for the response headers or a 5xx status is retried on
the next endpoint of the ranking (bounded attempts, exponential backoff with full jitter).
Once response headers are accepted the caller owns the ``Attempt`` and nothing is retried.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.propagate import inject

from gateway.base.errors import GatewayError, NoEndpoint, UpstreamError, UpstreamTimeout
from gateway.base.forwarded import ClientAddress, forwarded_chain
from gateway.base.metrics import GatewayMetrics
from gateway.request.attempt import CANCELLED, CONNECT_FAILED, SERVER_ERROR, TIMED_OUT, Attempt
from gateway.routing.adapter_placement import AdapterPlacement
from gateway.routing.breaker import RetryBudget
from gateway.routing.endpoint_picker import EndpointPicker, EndpointState, PickRequest, Ranking
from kvgate.wire.http.client import UpstreamConnectionError, UpstreamResponse
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.http.messages import Request, header_block, header_line
from kvgate.wire.routing_headers import CLIENT_ROUTING, CLIENT_ROUTING_PREFIX
from policies.schema import Pool, Retries, Timeouts

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: hop-by-hop headers, the body framing the pool sets itself, the
# client's gateway credentials, compression (the gateway must read the stream; a request body
# is forwarded decoded), and what the gateway's own server answered (``Expect``: it sent the
# 100 Continue itself and has the whole body; an upgrade it did not perform).
DROP_REQUEST_HEADERS = (
    HOP_BY_HOP
    | {
        "expect",
        "http2-settings",
        "x-forwarded-for",  # replaced: the chain with this hop's peer appended
        "x-forwarded-proto",
        "host",
        "content-length",
        "content-encoding",
        "authorization",
        "api-key",
        "x-api-key",  # Anthropic's spelling
        "accept-encoding",
        "x-request-id",
    }
    | CLIENT_ROUTING  # routing decisions are the picker's (kvgate.wire.routing_headers)
)
DROP_REQUEST_PREFIXES = (CLIENT_ROUTING_PREFIX,)
# Never passed back: hop-by-hop headers, and the framing the server sets for the client.
DROP_RESPONSE_HEADERS = HOP_BY_HOP | {
    "content-length",
    "content-encoding",
    "server",
    "date",
    "x-request-id",
}
_JSON = b"content-type: application/json\r\n"
RETRYABLE = (UpstreamConnectionError, asyncio.TimeoutError)


REMEMBERED_NAMES = 1024  # header name spellings a HeaderFilter remembers (a module constant:
# a compiled class's attributes are per instance)


class HeaderFilter:
    """Header lines passed on as sent, less the ``drop`` names and those starting with a
    ``drop_prefixes`` entry (any case). Whether a name passes is worked out once per distinct
    spelling (names repeat from request to request; up to ``REMEMBERED_NAMES`` are kept)."""

    def __init__(self, drop: frozenset[str], drop_prefixes: tuple[str, ...] = ()) -> None:
        self._drop = frozenset(name.encode() for name in drop)
        self._prefixes = tuple(prefix.encode() for prefix in drop_prefixes)
        self._passes: dict[bytes, bool] = {}

    def lines(self, headers: list[tuple[bytes, bytes]], out: list[bytes]) -> None:
        """Append a ``name: value`` line (with CRLF) to ``out`` for each header that passes;
        the headers a ``Connection`` header names are this hop's too (RFC 9110, 7.6.1)."""
        passes = self._passes
        start = len(out)
        named: set[bytes] | None = None  # what a Connection header lists (seldom anything)
        for name, value in headers:
            ok = passes.get(name)
            if ok is None:
                lower = name.lower()
                ok = lower not in self._drop and not lower.startswith(self._prefixes)
                if len(passes) < REMEMBERED_NAMES:
                    passes[name] = ok
            if ok:
                out.append(b"%b: %b\r\n" % (name, value))
            elif len(name) == 10 and name.lower() == b"connection":
                options = _connection_options(value)
                if options:
                    named = (named or set()).union(options)
        if named:
            out[start:] = [line for line in out[start:] if _name_of(line) not in named]


def _connection_options(value: bytes) -> list[bytes]:
    """The header names a ``Connection`` value lists (not its ``close`` or ``keep-alive``)."""
    options = (option.strip().lower() for option in value.split(b","))
    return [option for option in options if option and option not in _CONNECTION_TOKENS]


def _name_of(line: bytes) -> bytes:
    return line.split(b":", 1)[0].lower()


_CONNECTION_TOKENS = frozenset({b"close", b"keep-alive"})


_FORWARDED = HeaderFilter(  # content-type: the gateway sets its own
    DROP_REQUEST_HEADERS | {"content-type"}, DROP_REQUEST_PREFIXES
)
_RETURNED = HeaderFilter(DROP_RESPONSE_HEADERS)


def upstream_headers(
    client: list[tuple[bytes, bytes]],
    request_id: str,
    pool: Pool,
    forwarded: bytes = b"",
    content_type: str | None = None,
) -> bytes:
    """The header lines sent upstream: the client's (as sent, less ``DROP_REQUEST_HEADERS``),
    ``forwarded`` (the ``X-Forwarded-*`` lines), the request id, the content type (JSON, or
    ``content_type``: a multipart form's own, with its boundary) and the pool's own
    credentials."""
    lines: list[bytes] = []
    _FORWARDED.lines(client, lines)
    if forwarded:
        lines.append(forwarded)
    lines.append(header_line(b"x-request-id", request_id))
    lines.append(_JSON if content_type is None else header_line(b"content-type", content_type))
    if pool.api_key:
        lines.append(header_line(b"authorization", f"Bearer {pool.api_key}"))
    return b"".join(lines)


def client_request_headers(
    request: Request,
    clients: ClientAddress,
    request_id: str,
    pool: Pool,
    content_type: str | None = None,
) -> bytes:
    """``upstream_headers`` for a client's request: its own header lines and this hop's
    ``X-Forwarded-*`` lines (``clients``: the listener's trusted proxies)."""
    headers = request.headers
    forwarded = clients.upstream_lines(
        request.peer, forwarded_chain(headers), headers.get("x-forwarded-proto")
    )
    return upstream_headers(request.raw_headers, request_id, pool, forwarded, content_type)


def response_headers(
    upstream: list[tuple[bytes, bytes]],
    request_id: str | None,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """The upstream's header lines for the client, as sent, without hop-by-hop ones and the
    upstream's own request id; with ``request_id`` (streams: prepared before the request
    context sees them; whole responses get it from the request context) and ``extra`` (which
    replace the upstream's headers of the same names)."""
    lines: list[bytes] = []
    if extra:
        replaced = {name.lower().encode("latin-1") for name in extra}
        kept = [(name, value) for name, value in upstream if name.lower() not in replaced]
        _RETURNED.lines(kept, lines)
        lines.append(header_block(extra.items()))
    else:
        _RETURNED.lines(upstream, lines)
    if request_id is not None:
        lines.append(header_line(b"x-request-id", request_id))
    return b"".join(lines)


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """What sending to one pool needs; built for every pool by ``build_runtime``."""

    pool: ConnectionPool
    picker: EndpointPicker
    metrics: GatewayMetrics
    timeouts: Timeouts
    retries: Retries
    tracer: trace.Tracer | None
    endpoints: list[EndpointState]  # the pool's endpoints (their breakers)
    budget: RetryBudget  # the pool's retry budget
    adapters: AdapterPlacement | None = None  # where the gateway loads the pool's adapters


async def open_upstream(
    call: UpstreamCall,
    pool: Pool,
    path: str,
    payload: bytes,
    headers: bytes,
    pick: PickRequest,
    ranking: Ranking | None = None,
    tried: set[str] | None = None,
) -> Attempt:
    """The first acceptable upstream response, as an open ``Attempt`` the caller must close.

    The picker ranks the pool once (or the caller did: ``ranking``); each retry takes the
    next endpoint of that ranking that is not in ``tried`` and whose breaker lets requests
    through. ``tried`` (the caller's, when it counts the attempts) gains each endpoint tried."""
    if tried is None:
        tried = set()
    last: GatewayError | None = None
    held: Attempt | None = None  # a 5xx kept as last resort, its verdict pending
    first_byte = call.timeouts.first_byte
    call.budget.deposit()
    if ranking is None:
        ranking = call.picker.rank(pool.name, pick)
    for number in range(call.retries.attempts + 1):
        if number and not call.budget.try_spend():
            call.metrics.retry_budget_exhausted.labels(pool.name).inc()
            break
        blocked = [
            e.address for e in call.endpoints if not e.breaker.closed and not e.breaker.available()
        ]
        endpoint = ranking.next(tried.union(blocked) if blocked else tried)
        if endpoint is None:
            break
        if number:
            call.metrics.retries.labels(pool.name).inc()
            await asyncio.sleep(_backoff(call.retries, number))
        tried.add(endpoint.address)
        attempt = Attempt(endpoint, ranking)
        if call.adapters is not None:
            placed = await _place_adapter(call.adapters, attempt, pool, pick)
            if placed is not None:
                ranking.refused(endpoint)  # the request never went there: nothing to learn
                last = placed
                continue
        try:
            if call.tracer is None:
                response = await call.pool.request(
                    endpoint.address, "POST", path, headers, payload, first_byte=first_byte
                )
            else:
                response = await send_traced(call, endpoint, path, payload, headers, number)
        except RETRYABLE as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            attempt.fail(TIMED_OUT if timed_out else CONNECT_FAILED)
            if not timed_out:
                ranking.refused(endpoint)  # it never took the request: nothing to learn
            kind = "timeout" if timed_out else "connect"
            call.metrics.upstream_errors.labels(endpoint.address, kind).inc()
            last = as_gateway_error(exc, endpoint)
            continue
        except BaseException:
            attempt.fail(CANCELLED)
            if held is not None:
                held.absolve()
                held.close()
            raise
        if response.status == 404 and call.adapters is not None:  # the engine lost it?
            call.adapters.forget(endpoint.address, pool.model or pick.model)
        if attempt.answered(response) is SERVER_ERROR:
            call.metrics.upstream_errors.labels(endpoint.address, f"http_{response.status}").inc()
            if held is not None:  # a second endpoint failed it too: the request is the cause
                call.budget.refund()
                held.absolve()
                held.close()
                attempt.absolve()
                return attempt
            if number < call.retries.attempts:
                held = attempt
                continue
        elif held is not None:
            held.close()  # another endpoint answered: the first one's 5xx was its own
        return attempt
    if held is not None:
        return held  # nobody else could answer: the client gets the upstream's own 5xx
    if last is None:
        raise NoEndpoint(f"no endpoint of pool '{pool.name}' can serve the request")
    raise last


async def send_traced(
    call: UpstreamCall,
    endpoint: EndpointState,
    path: str,
    payload: bytes,
    headers: bytes,
    retry: int = 0,
    hop: str = "",
) -> UpstreamResponse:
    """Send under a client span of its own, whose context the upstream receives (W3C
    ``traceparent``): one span per attempt (``retry``: how many came before it), and per hop
    of a prefill/decode request (``hop``: "prefill" for the first)."""
    assert call.tracer is not None
    attributes: dict[str, str | int] = {"server.address": endpoint.address, "kvgate.retry": retry}
    if hop:
        attributes["kvgate.hop"] = hop
    with call.tracer.start_as_current_span(
        f"POST {path}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        inject(carrier)  # this attempt's client span becomes the upstream's parent
        lines = [
            line + b"\r\n"
            for line in headers.split(b"\r\n")
            if line and line.partition(b":")[0].strip().lower().decode("latin-1") not in carrier
        ]
        headers = b"".join(lines) + header_block(carrier.items())
        return await call.pool.request(
            endpoint.address,
            "POST",
            path,
            headers,
            payload,
            first_byte=call.timeouts.first_byte,
        )


async def _place_adapter(
    adapters: AdapterPlacement, attempt: Attempt, pool: Pool, pick: PickRequest
) -> GatewayError | None:
    """Have the request's LoRA adapter loaded where ``attempt`` goes, for as long as it is
    open; the error when it cannot be (the attempt then failed)."""
    adapter = adapters.adapter_of(pool.model or pick.model)
    if adapter is None:
        return None
    endpoint = attempt.endpoint
    try:
        attempt.hold(await adapters.acquire(endpoint.address, adapter))
    except RETRYABLE as exc:
        attempt.fail(TIMED_OUT if isinstance(exc, asyncio.TimeoutError) else CONNECT_FAILED)
        return as_gateway_error(exc, endpoint)
    except GatewayError as exc:
        attempt.fail(CANCELLED)  # the engine refused the adapter: no verdict on it
        return exc
    except BaseException:
        attempt.fail(CANCELLED)
        raise
    return None


def _backoff(retries: Retries, attempt: int) -> float:
    ceiling = min(retries.max_backoff, retries.backoff * 2 ** (attempt - 1))
    return random.uniform(0, ceiling)


def as_gateway_error(exc: BaseException, endpoint: EndpointState) -> GatewayError:
    """The client's error for a request ``endpoint`` never answered (``RETRYABLE``)."""
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {endpoint.address} did not answer in time")
    return UpstreamError(f"cannot reach upstream {endpoint.address}")
