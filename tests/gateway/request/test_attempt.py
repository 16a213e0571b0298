"""One owner per try: the ``Attempt`` keeps the in-flight count, the breaker's verdict and the
response; retries walk one ranking; the prefix index learns only what an upstream took.

Real loopback servers (scripted with asyncio streams) and the real connection pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from epp.metrics import EppMetrics
from gateway.base.metrics import GatewayMetrics
from gateway.request.attempt import BROKEN, Attempt
from gateway.request.runtime import Runtime, RuntimeParts, build_runtime
from gateway.request.upstream import open_upstream
from gateway.routing.embedded_epp import EmbeddedEpp
from gateway.routing.endpoint_picker import EndpointState, PickRequest, Ranking
from kvgate.wire.http.connection_pool import ConnectionPool
from loadtest.harness.processes import free_port
from policies.loader import load_policy_text
from tests.http_servers import started

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
ERROR = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\n\r\n{}"


def is_closed(state: EndpointState) -> bool:
    """Whether the endpoint's breaker is closed (read afresh: the attempt changes it)."""
    return state.breaker.closed


@asynccontextmanager
async def upstream(answer: bytes | None) -> AsyncIterator[str]:
    """A loopback server answering every request with ``answer`` (None: never answers)."""
    up, server = await started(lambda _: answer, silent=answer is None)
    try:
        yield f"127.0.0.1:{up.port}"
    finally:
        server.close()


class InOrder:
    """A picker that ranks a pool's endpoints in policy order and counts its rankings."""

    def __init__(self) -> None:
        self.pools: dict[str, list[EndpointState]] = {}
        self.rankings = 0
        self.handed_out: list[str] = []
        self.refused: list[str] = []
        self.finished: list[str] = []  # the tries the ranking was told are over
        self.started: list[str] = []  # the tries whose first token came back

    def prompt_token_ids(self, pool: str, request: PickRequest) -> list[int] | None:
        return None

    def rank(self, pool: str, request: PickRequest) -> Ranking:
        self.rankings += 1
        return _Listed(self, list(self.pools[pool]))


class _Listed:
    def __init__(self, owner: InOrder, endpoints: list[EndpointState]) -> None:
        self.owner, self.endpoints = owner, endpoints

    def next(self, exclude: set[str]) -> EndpointState | None:
        while self.endpoints:
            endpoint = self.endpoints.pop(0)
            if endpoint.address not in exclude:
                self.owner.handed_out.append(endpoint.address)
                return endpoint
        return None

    def refused(self, endpoint: EndpointState) -> None:
        self.owner.refused.append(endpoint.address)

    def started(self, endpoint: EndpointState) -> None:
        self.owner.started.append(endpoint.address)

    def finished(self, endpoint: EndpointState, prompt_tokens: int | None = None) -> None:
        self.owner.finished.append(endpoint.address)

    def prefill(self) -> EndpointState | None:
        return None


def runtime_for(addresses: list[str]) -> Runtime:
    policy = load_policy_text(f"""
pools: {{p: {{endpoints: [{", ".join(addresses)}]}}}}
routes: [{{model: m, pool: p}}]
retries: {{attempts: 3, backoff: 1ms, max_backoff: 1ms}}
breakers: {{consecutive_failures: 1}}
""")
    parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
    ordered = InOrder()
    runtime = build_runtime(policy, parts, picker=ordered)
    ordered.pools = runtime.endpoints
    return runtime


async def send(runtime: Runtime, prompt: str = "x") -> Attempt:
    pool = runtime.policy.pools["p"]
    pick = PickRequest("m", {"model": "m", "prompt": prompt}, {}, None, "r1")
    call = runtime.calls["p"]
    return await open_upstream(call, pool, "/v1/completions", b"{}", b"", pick)


async def test_every_exit_path_lowers_the_in_flight_count_once() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with upstream(ERROR) as failing, upstream(OK) as ok:
        runtime = runtime_for([dead, failing, ok])
        picker = runtime.picker
        assert isinstance(picker, InOrder)
        attempt = await send(runtime)
        states = {s.address: s for s in runtime.endpoints["p"]}
        assert attempt.endpoint is states[ok] and attempt.response is not None
        assert [states[a].in_flight for a in (dead, failing, ok)] == [0, 0, 1]
        assert picker.rankings == 1  # the retries walked one ranking
        assert picker.handed_out == [dead, failing, ok]
        assert picker.refused == [dead]  # the dead endpoint never took the request
        assert not states[dead].breaker.closed and not states[failing].breaker.closed
        assert states[ok].breaker.closed
        assert picker.finished == [dead, failing]  # the tries that ended told the ranking
        attempt.close()
        attempt.close()  # idempotent
        assert states[ok].in_flight == 0
        assert picker.finished == [dead, failing, ok]


async def test_a_response_that_breaks_counts_against_the_breaker_on_close() -> None:
    async with upstream(OK) as ok:
        runtime = runtime_for([ok])
        attempt = await send(runtime)
        state = attempt.endpoint
        assert is_closed(state)
        attempt.break_off()
        attempt.close()
        assert attempt.outcome is BROKEN and not is_closed(state) and state.in_flight == 0


async def test_a_cancelled_try_records_no_verdict() -> None:
    async with upstream(None) as silent:
        runtime = runtime_for([silent])
        task = asyncio.create_task(send(runtime))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        state = runtime.endpoints["p"][0]
        assert state.in_flight == 0 and state.breaker.closed


async def test_only_the_endpoint_that_took_the_request_learns_its_prefix() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with upstream(OK) as live:
        policy = load_policy_text(f"""
pools: {{p: {{endpoints: [{dead}, {live}]}}}}
routes: [{{model: m, pool: p}}]
retries: {{attempts: 2, backoff: 1ms, max_backoff: 1ms}}
""")
        parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
        runtime = build_runtime(policy, parts)
        embedded = runtime.embedded
        assert isinstance(embedded, EmbeddedEpp) and embedded.service.prefix is not None
        service, index = embedded.service, embedded.service.prefix
        shared = "a shared system prompt " * 8
        warm = service.scheduling_request("p", "w", "m", {"prompt": shared}, {})
        index.learn(warm, service.datastore.endpoints("p")[0])  # the dead one holds the head
        before = index.blocks_of(dead)
        attempt = await send(runtime, shared + "and a question that adds blocks " * 4)
        assert attempt.endpoint.address == live and attempt.response is not None
        attempt.close()
        assert index.blocks_of(dead) == before  # it ranked first, but took nothing
        dead_state = service.datastore.endpoints("p")[0]
        assert dead_state.load.dispatched == 0  # the refused dispatch was taken back
        assert index.blocks_of(live) > 0
        decisions = [
            sample.value
            for metric in service.metrics.decisions.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        ]
        assert sum(decisions) == 1  # one scheduling cycle, though two endpoints were tried


async def test_an_embedded_picker_reads_the_attempts_in_flight_count() -> None:
    async with upstream(OK) as live:
        policy = load_policy_text(f"""
pools: {{p: {{endpoints: [{live}]}}}}
routes: [{{model: m, pool: p}}]
""")
        parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
        runtime = build_runtime(policy, parts)
        assert isinstance(runtime.embedded, EmbeddedEpp)
        picked = runtime.embedded.service.datastore.endpoints("p")[0]
        state = runtime.endpoints["p"][0]
        attempts = [await send(runtime), await send(runtime)]
        assert picked.load.requests is state.requests  # one count per request, not one each
        assert (state.in_flight, picked.in_flight) == (2, 2)
        for attempt in attempts:
            attempt.close()
        assert (state.in_flight, picked.in_flight, picked.load.dispatched) == (0, 0, 0)


async def test_an_endpoint_where_the_adapter_could_not_be_loaded_is_refused() -> None:
    dead = f"127.0.0.1:{free_port()}"  # the adapter's load cannot reach it
    async with upstream(OK) as ok:  # loads (200) and answers
        policy = load_policy_text(f"""
pools: {{p: {{endpoints: [{dead}, {ok}], adapters: {{sql: /m/sql}}}}}}
routes: [{{model: sql, pool: p}}]
retries: {{attempts: 3, backoff: 1ms, max_backoff: 1ms}}
""")
        parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
        ordered = InOrder()
        runtime = build_runtime(policy, parts, picker=ordered)
        ordered.pools = runtime.endpoints
        pick = PickRequest("sql", {"model": "sql", "prompt": "x"}, {}, None, "r1")
        attempt = await open_upstream(
            runtime.calls["p"],
            policy.pools["p"],
            "/v1/completions",
            b"{}",
            b"",
            pick,
        )
        assert attempt.endpoint.address == ok and attempt.response is not None
        assert ordered.refused == [dead]  # the request never went there: nothing to learn
        attempt.close()
