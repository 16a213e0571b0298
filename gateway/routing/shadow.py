"""Shadow traffic: a sampled copy of a route's requests goes to a shadow pool in the background.

The copy is sent non-streaming, read fully, and compared with the primary response (status,
completion tokens, latency ratio, and optionally the exact text) once both are done; the result
goes to metrics and the log. It never reaches or delays the client: it runs in its own task,
at most ``max_in_flight`` at once (more are dropped and counted), and its failures are only
recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from opentelemetry import trace
from opentelemetry.propagate import inject

from gateway.base.metrics import GatewayMetrics
from gateway.routing.endpoint_picker import EndpointPicker, EndpointState, PickRequest
from kvgate.wire.http.client import MAX_UPSTREAM_BODY, UpstreamBodyTooLarge
from kvgate.wire.sse import usage_of
from policies.schema import Policy, Route, Shadow

log = logging.getLogger("kvgate.shadow")


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    latency: float
    completion_tokens: int | None
    text: str | None  # None when not captured (streams)


def text_of(body: bytes) -> str | None:
    try:
        choices = json.loads(body).get("choices") or []
    except (ValueError, AttributeError):
        return None
    parts = []
    for choice in choices:
        if isinstance(choice, dict):
            message = choice.get("message")
            parts.append(
                message.get("content") or ""
                if isinstance(message, dict)
                else choice.get("text") or ""
            )
    return "".join(str(p) for p in parts)


class ShadowMirror:
    """Sends sampled copies of requests to a shadow pool and compares the outcomes."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        tracer: trace.Tracer | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracer = tracer  # a span per copy, under the request's
        self.in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # told each comparison's (route, "match" or "mismatch"): the automatic canaries' gate
        self.on_result: Callable[[str, str], None] | None = None
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None  # opened by the first copy

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, ttl_dns_cache=60)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
            )
        return self._session

    def start(
        self,
        policy: Policy,
        picker: EndpointPicker,
        route: Route,
        path: str,
        body: dict[str, object],
        pick: PickRequest,
        tls: Mapping[str, tuple[ssl.SSLContext, str]] | None = None,
    ) -> asyncio.Task[Outcome | None] | None:
        """Send a copy to the route's shadow pool (if sampled); ``tls``: how its ``https://``
        endpoints are dialled, by address."""
        spec = route.shadow
        if spec is None or random.random() >= spec.sample:
            return None
        if self.in_flight.get(route.model, 0) >= spec.max_in_flight:
            self.metrics.child(self.metrics.shadow_results, route.model, "dropped").inc()
            return None
        self.in_flight[route.model] = self.in_flight.get(route.model, 0) + 1
        return asyncio.create_task(
            self._send(policy, picker, route, spec, path, dict(body), pick, tls or {})
        )

    def compare(self, route: Route, job: asyncio.Task[Outcome | None], primary: Outcome) -> None:
        task = asyncio.create_task(self._compare(route, job, primary))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(
        self,
        policy: Policy,
        picker: EndpointPicker,
        route: Route,
        spec: Shadow,
        path: str,
        body: dict[str, object],
        pick: PickRequest,
        tls: Mapping[str, tuple[ssl.SSLContext, str]],
    ) -> Outcome | None:
        try:
            pool = policy.pools[spec.pool]
            ranking = picker.rank(pool.name, pick)
            endpoint = ranking.next(set())
            if endpoint is None:
                return None
            body.update(stream=False, model=pool.model or body.get("model"))
            body.pop("stream_options", None)
            headers = {"x-kvgate-shadow": "1", "content-type": "application/json"}
            if pool.api_key:
                headers["authorization"] = f"Bearer {pool.api_key}"
            started = time.perf_counter()
            try:
                if self.tracer is None:
                    status, data = await self._post(endpoint, path, body, headers, policy, tls)
                else:
                    attributes = {"server.address": endpoint.address, "kvgate.pool": pool.name}
                    with self.tracer.start_as_current_span(
                        "shadow", kind=trace.SpanKind.CLIENT, attributes=attributes
                    ):
                        inject(headers)  # the copy's engine continues the request's trace
                        status, data = await self._post(endpoint, path, body, headers, policy, tls)
            except aiohttp.ClientConnectorError:
                ranking.refused(endpoint)  # it never took the copy
                raise
            usage = _usage_tokens(data)
            return Outcome(status, time.perf_counter() - started, usage, text_of(data))
        except (TimeoutError, aiohttp.ClientError, OSError, UpstreamBodyTooLarge) as exc:
            log.info("shadow request for %s failed: %s", route.model, exc)
            return None
        finally:
            self.in_flight[route.model] -= 1

    async def _post(
        self,
        endpoint: EndpointState,
        path: str,
        body: dict[str, object],
        headers: dict[str, str],
        policy: Policy,
        tls: Mapping[str, tuple[ssl.SSLContext, str]],
    ) -> tuple[int, bytes]:
        """The copy's status and body."""
        async with asyncio.timeout(policy.timeouts.first_byte):
            dialled = tls.get(endpoint.address)
            async with self._client().post(
                endpoint.url + path,
                json=body,
                headers=headers,
                ssl=True if dialled is None else dialled[0],
                server_hostname=None if dialled is None else dialled[1] or None,
            ) as response:
                return response.status, await _read_whole(response)

    async def _compare(
        self, route: Route, job: asyncio.Task[Outcome | None], primary: Outcome
    ) -> None:
        shadow = await job
        spec = route.shadow
        assert spec is not None
        if shadow is None:
            self.metrics.child(self.metrics.shadow_results, route.model, "error").inc()
            return
        mismatches = []
        if "status" in spec.compare and shadow.status != primary.status:
            mismatches.append("status")
        if (
            "tokens" in spec.compare
            and primary.completion_tokens is not None
            and shadow.completion_tokens != primary.completion_tokens
        ):
            mismatches.append("tokens")
        if "text" in spec.compare and primary.text is not None and shadow.text != primary.text:
            mismatches.append("text")
        if "latency" in spec.compare and primary.latency > 0:
            self.metrics.child(self.metrics.shadow_latency_ratio, route.model).observe(
                shadow.latency / primary.latency
            )
        result = "mismatch" if mismatches else "match"
        self.metrics.child(self.metrics.shadow_results, route.model, result).inc()
        if self.on_result is not None:
            self.on_result(route.model, result)
        log.info(
            json.dumps(
                {
                    "shadow": route.model,
                    "result": result,
                    "mismatches": mismatches,
                    "primary_status": primary.status,
                    "shadow_status": shadow.status,
                    "latency_ratio": round(shadow.latency / primary.latency, 3)
                    if primary.latency
                    else None,
                }
            )
        )

    async def close(self) -> None:
        """Wait for the comparisons under way, then close the copies' connections."""
        for task in list(self._tasks):
            await task
        if self._session is not None:
            await self._session.close()


def _usage_tokens(data: bytes) -> int | None:
    value = (usage_of(data) or {}).get("completion_tokens")
    return value if isinstance(value, int) else None


async def _read_whole(response: aiohttp.ClientResponse) -> bytes:
    """The shadow's answer, read whole up to the gateway's limit for bodies it reads whole
    (``UpstreamBodyTooLarge`` past it: the copy counts as failed)."""
    parts: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        size += len(chunk)
        if size > MAX_UPSTREAM_BODY:
            raise UpstreamBodyTooLarge(
                f"the shadow's response body is over {MAX_UPSTREAM_BODY} bytes"
            )
        parts.append(chunk)
    return b"".join(parts)
