"""Open an upstream response: pick an endpoint, send, retry elsewhere before the first byte.

A connect error, a timeout waiting for the response headers or a 5xx status is retried on
another endpoint of the pool (bounded attempts, exponential backoff with full jitter). Once
response headers are accepted the caller owns the response and nothing is retried.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.propagate import inject

from gateway.breaker import RetryBudget
from gateway.context import RequestContext
from gateway.errors import GatewayError, NoEndpoint, UpstreamError, UpstreamTimeout
from gateway.metrics import GatewayMetrics
from gateway.picker import EndpointState, Picker, PickRequest
from kvgate.wire.http.client import ConnectionPool, UpstreamConnectionError, UpstreamResponse
from kvgate.wire.http.messages import header_block, header_line
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
# client's gateway credentials, and compression (the gateway must read the stream).
DROP_REQUEST_HEADERS = HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "api-key",
    "accept-encoding",
    "x-request-id",
}
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
    """Header lines passed on as sent, less the ``drop`` names (any case). Whether a name
    passes is worked out once per distinct spelling (names repeat from request to request;
    up to ``REMEMBERED_NAMES`` of them are kept)."""

    def __init__(self, drop: frozenset[str]) -> None:
        self._drop = frozenset(name.encode() for name in drop)
        self._passes: dict[bytes, bool] = {}

    def lines(self, headers: list[tuple[bytes, bytes]], out: list[bytes]) -> None:
        """Append a ``name: value`` line (with CRLF) to ``out`` for each header that passes."""
        passes = self._passes
        for name, value in headers:
            ok = passes.get(name)
            if ok is None:
                ok = name.lower() not in self._drop
                if len(passes) < REMEMBERED_NAMES:
                    passes[name] = ok
            if ok:
                out.append(b"%b: %b\r\n" % (name, value))


_FORWARDED = HeaderFilter(DROP_REQUEST_HEADERS | {"content-type"})  # the gateway sets its own
_RETURNED = HeaderFilter(DROP_RESPONSE_HEADERS)


def upstream_headers(client: list[tuple[bytes, bytes]], request_id: str, pool: Pool) -> bytes:
    """The header lines sent upstream: the client's (as sent, less ``DROP_REQUEST_HEADERS``),
    the request id, the content type and the pool's own credentials."""
    lines: list[bytes] = []
    _FORWARDED.lines(client, lines)
    lines.append(header_line(b"x-request-id", request_id))
    lines.append(_JSON)
    if pool.api_key:
        lines.append(header_line(b"authorization", f"Bearer {pool.api_key}"))
    return b"".join(lines)


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
    pool: ConnectionPool
    picker: Picker
    metrics: GatewayMetrics
    timeouts: Timeouts
    retries: Retries
    tracer: trace.Tracer | None
    endpoints: list[EndpointState]  # the pool's endpoints (their breakers)
    budget: RetryBudget  # the pool's retry budget


async def open_upstream(
    call: UpstreamCall,
    ctx: RequestContext,
    pool: Pool,
    path: str,
    payload: bytes,
    headers: bytes,
    pick: PickRequest,
) -> tuple[EndpointState, UpstreamResponse]:
    """The first acceptable upstream response; the endpoint's in-flight count is raised.

    The caller must call ``endpoint.in_flight -= 1`` and close the response when done.
    """
    tried: set[str] = set()
    last: GatewayError | None = None
    held: tuple[EndpointState, UpstreamResponse] | None = None  # a 5xx kept as last resort
    first_byte = call.timeouts.first_byte
    call.budget.deposit()
    for attempt in range(call.retries.attempts + 1):
        if attempt and not call.budget.try_spend():
            call.metrics.retry_budget_exhausted.labels(pool.name).inc()
            break
        blocked = [
            e.address for e in call.endpoints if not e.breaker.closed and not e.breaker.available()
        ]
        exclude = tried.union(blocked) if blocked else tried
        endpoint = call.picker.pick(pool.name, pick, exclude)
        if endpoint is None:
            break
        if attempt:
            call.metrics.retries.labels(pool.name).inc()
            await asyncio.sleep(_backoff(call.retries, attempt))
        tried.add(endpoint.address)
        ctx.attempts = attempt + 1
        endpoint.in_flight += 1
        if not endpoint.breaker.closed:
            endpoint.breaker.on_dispatch()  # half-open: uses up a probe
        try:
            if call.tracer is None:
                response = await call.pool.request(
                    endpoint.address, "POST", path, headers, payload, first_byte=first_byte
                )
            else:
                response = await _send_traced(call, endpoint, path, payload, headers)
        except RETRYABLE as exc:
            endpoint.in_flight -= 1
            endpoint.breaker.record(ok=False)
            kind = "timeout" if isinstance(exc, asyncio.TimeoutError) else "connect"
            call.metrics.upstream_errors.labels(endpoint.address, kind).inc()
            last = _as_gateway_error(exc, endpoint)
            continue
        except BaseException:
            endpoint.in_flight -= 1
            _release(held)
            raise
        endpoint.breaker.record(ok=response.status < 500)
        if response.status >= 500:
            call.metrics.upstream_errors.labels(endpoint.address, f"http_{response.status}").inc()
            if attempt < call.retries.attempts:
                _release(held)
                held = (endpoint, response)
                continue
        _release(held)
        return endpoint, response
    if held is not None:
        return held  # nobody else could answer: the client gets the upstream's own 5xx
    if last is None:
        raise NoEndpoint(f"no endpoint of pool '{pool.name}' can serve the request")
    ctx.error = last.code or "upstream_error"
    raise last


def _release(held: tuple[EndpointState, UpstreamResponse] | None) -> None:
    if held is not None:
        held[0].in_flight -= 1
        held[1].close()


async def _send_traced(
    call: UpstreamCall,
    endpoint: EndpointState,
    path: str,
    payload: bytes,
    headers: bytes,
) -> UpstreamResponse:
    assert call.tracer is not None
    with call.tracer.start_as_current_span(
        f"POST {path}",
        kind=trace.SpanKind.CLIENT,
        attributes={"server.address": endpoint.address},
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
            endpoint.address, "POST", path, headers, payload, first_byte=call.timeouts.first_byte
        )


def _backoff(retries: Retries, attempt: int) -> float:
    ceiling = min(retries.max_backoff, retries.backoff * 2 ** (attempt - 1))
    return random.uniform(0, ceiling)


def _as_gateway_error(exc: BaseException, endpoint: EndpointState) -> GatewayError:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {endpoint.address} did not answer in time")
    return UpstreamError(f"cannot reach upstream {endpoint.address}")
