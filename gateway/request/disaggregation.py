"""Prefill/decode pools: the gateway runs the prefill hop, then the decode hop.

When the picker chose to disaggregate a request (``Ranking.prefill``), its prompt is first
sent to that prefill endpoint as vLLM's proxy sends it (``kvgate.wire.disaggregation``); the
``kv_transfer_params`` it answers with go into the decode hop, which the caller sends down the
ranking as any request. A prefill endpoint that cannot be reached, times out or answers 5xx is
retried on another prefill endpoint of the pool (least in flight, within the retry budget);
when none answers with KV, the decode endpoint prefills the prompt itself: slower, not failed.
The client sees one request: one admission, one limit reservation, one set of metrics; with
tracing, each hop has its own client span.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson

from gateway.request.attempt import CANCELLED, CONNECT_FAILED, TIMED_OUT, Attempt
from gateway.request.upstream import RETRYABLE, UpstreamCall, send_traced
from gateway.routing.endpoint_picker import EndpointState, Ranking
from kvgate.wire.disaggregation import decode_params, prefill_body
from kvgate.wire.http.client import UpstreamConnectionError
from policies.schema import Pool

MAX_PREFILL_REPLY = 16 << 20  # bytes: a prefill hop answers one token and its KV's whereabouts


async def run_prefill(
    call: UpstreamCall,
    pool: Pool,
    path: str,
    body: Mapping[str, object],
    headers: bytes,
    first: EndpointState,
    ranking: Ranking,
) -> dict[str, object] | None:
    """The decode hop's ``kv_transfer_params``, or None: the decode endpoint prefills."""
    payload = orjson.dumps(prefill_body(body))
    tried: set[str] = set()
    endpoint: EndpointState | None = first
    for number in range(call.retries.attempts + 1):
        if endpoint is None or (number and not call.budget.try_spend()):
            break
        if number:
            call.metrics.retries.labels(pool.name).inc()
        tried.add(endpoint.address)
        params = await _prefill_on(
            call, path, headers, payload, endpoint, ranking if endpoint is first else None
        )
        if params is not None:
            call.metrics.prefill_hops.labels(pool.name, "ok").inc()
            return params
        endpoint = _another_prefiller(call.endpoints, tried)
    call.metrics.prefill_hops.labels(pool.name, "local").inc()
    return None


async def _prefill_on(
    call: UpstreamCall,
    path: str,
    headers: bytes,
    payload: bytes,
    endpoint: EndpointState,
    ranking: Ranking | None,
) -> dict[str, object] | None:
    attempt = Attempt(endpoint, ranking)
    try:
        if call.tracer is None:
            response = await call.pool.request(
                endpoint.address,
                "POST",
                path,
                headers,
                payload,
                first_byte=call.timeouts.first_byte,
            )
        else:
            response = await send_traced(call, endpoint, path, payload, headers, hop="prefill")
    except RETRYABLE as exc:
        timed_out = isinstance(exc, asyncio.TimeoutError)
        attempt.fail(TIMED_OUT if timed_out else CONNECT_FAILED)
        if ranking is not None and not timed_out:
            ranking.refused(endpoint)
        kind = "timeout" if timed_out else "connect"
        call.metrics.upstream_errors.labels(endpoint.address, kind).inc()
        return None
    except BaseException:
        attempt.fail(CANCELLED)  # the client went away: the prefill endpoint stops too
        raise
    try:
        attempt.answered(response)  # a 5xx counts against its breaker when closed
        if response.status != 200:
            call.metrics.upstream_errors.labels(endpoint.address, f"http_{response.status}").inc()
            return None
        data = response.read_now()
        if data is None:
            data = await response.read(call.timeouts.idle, MAX_PREFILL_REPLY)
        reply = orjson.loads(data)
    except (TimeoutError, UpstreamConnectionError, ValueError):
        attempt.break_off()
        return None
    finally:
        attempt.close()
    return decode_params(reply, endpoint.address)


def _another_prefiller(endpoints: list[EndpointState], tried: set[str]) -> EndpointState | None:
    """The pool's untried prefill endpoint with the fewest requests in flight whose breaker
    lets requests through."""
    best: EndpointState | None = None
    for endpoint in endpoints:
        if endpoint.endpoint.role != "prefill" or endpoint.address in tried:
            continue
        if not endpoint.breaker.available():
            continue
        if best is None or endpoint.in_flight < best.in_flight:
            best = endpoint
    return best
