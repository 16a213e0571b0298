"""The gateway's prefill hop (prefill/decode pools): what is sent, the retries on other prefill
endpoints, and the local fallback. A real prefill worker and scripted loopback upstreams."""

from __future__ import annotations

import asyncio

from epp.metrics import EppMetrics
from gateway.base.metrics import GatewayMetrics
from gateway.request.disaggregation import run_prefill
from gateway.request.runtime import Runtime, RuntimeParts, build_runtime
from kvgate.wire.disaggregation import prefill_body
from kvgate.wire.http.connection_pool import ConnectionPool
from loadtest.harness.processes import free_port
from policies.loader import load_policy_text
from tests.backends.pd.servers import ServerFactory, start_worker
from tests.gateway.request.test_attempt import ERROR, OK, InOrder, upstream
from tests.http_servers import started

BODY = {"model": "kvgate-sim", "prompt": "a prompt " * 60, "max_tokens": 30, "stream": True,
        "stream_options": {"include_usage": True}, "min_tokens": 2}  # fmt: skip


def pd_runtime(prefillers: list[str], extra: str = "") -> Runtime:
    endpoints = ", ".join(f"{{address: {a}, role: prefill}}" for a in prefillers)
    policy = load_policy_text(f"""
pools: {{p: {{pd: {{min_uncached_tokens: 8}}, endpoints: [{endpoints}, {{address: 127.0.0.9:1, role: decode}}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
retries: {{attempts: 3, backoff: 1ms, max_backoff: 1ms, min_retries_per_second: 100}}
breakers: {{consecutive_failures: 1}}
{extra}
""")
    parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
    ordered = InOrder()
    runtime = build_runtime(policy, parts, picker=ordered)
    ordered.pools = runtime.endpoints
    return runtime


async def hop(runtime: Runtime, first: str) -> dict[str, object] | None:
    call = runtime.calls["p"]
    states = {s.address: s for s in runtime.endpoints["p"]}
    ranking = call.picker.rank("p", None)  # type: ignore[arg-type]
    pool = runtime.policy.pools["p"]
    return await run_prefill(call, pool, "/v1/completions", BODY, b"", states[first], ranking)


def test_the_prefill_body_is_vllms_proxys() -> None:
    body = prefill_body({**BODY, "max_completion_tokens": 50})
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1
    assert body["stream"] is False and "stream_options" not in body and "min_tokens" not in body
    assert body["kv_transfer_params"] == {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None,
    }  # fmt: skip
    assert body["prompt"] == BODY["prompt"]


async def test_failed_prefill_endpoints_are_retried_on_the_others(
    aiohttp_server: ServerFactory,
) -> None:
    worker = await start_worker(aiohttp_server, "--role", "prefill", "--cost", "zero")
    live = worker.url.removeprefix("http://")
    dead = f"127.0.0.1:{free_port()}"
    async with upstream(ERROR) as failing:
        runtime = pd_runtime([dead, failing, live])
        params = await hop(runtime, dead)
    assert params is not None and params["do_remote_prefill"] is True
    assert params["remote_host"] == "127.0.0.1" and isinstance(params["remote_port"], int)
    states = {s.address: s for s in runtime.endpoints["p"]}
    assert not states[dead].breaker.closed and not states[failing].breaker.closed
    assert all(s.in_flight == 0 for s in states.values())
    metrics = runtime.calls["p"].metrics
    assert metrics.retries.labels("p")._value.get() == 2
    assert metrics.prefill_hops.labels("p", "ok")._value.get() == 1
    assert worker.blocks_in_use > 0  # held for the decode hop (its lease frees them)
    assert worker.state.pd is not None and worker.state.pd.held is not None
    worker.state.pd.held.release_all()


async def test_with_no_prefill_endpoint_answering_with_kv_the_decode_endpoint_prefills() -> None:
    async with upstream(OK) as monolithic, upstream(ERROR) as failing:  # OK: a body with no KV
        runtime = pd_runtime([monolithic, failing])
        assert await hop(runtime, monolithic) is None
        metrics = runtime.calls["p"].metrics
        assert metrics.prefill_hops.labels("p", "local")._value.get() == 1
        assert metrics.upstream_errors.labels(failing, "http_500")._value.get() == 1


async def test_a_cancelled_prefill_hop_stops_there_and_records_no_verdict() -> None:
    up, server = await started(lambda n: None, silent=True)
    try:
        runtime = pd_runtime([f"127.0.0.1:{up.port}"])
        task = asyncio.create_task(hop(runtime, f"127.0.0.1:{up.port}"))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        state = runtime.endpoints["p"][0]
        assert state.in_flight == 0 and state.breaker.closed
        assert up.requests == 1
    finally:
        server.close()


async def test_a_prefill_endpoint_that_does_not_answer_in_time_is_retried_on_another(
    aiohttp_server: ServerFactory,
) -> None:
    worker = await start_worker(aiohttp_server, "--role", "prefill", "--cost", "zero")
    up, server = await started(lambda n: None, silent=True)
    try:
        stalled = f"127.0.0.1:{up.port}"
        runtime = pd_runtime(
            [stalled, worker.url.removeprefix("http://")], "timeouts: {first_byte: 200ms}"
        )
        params = await hop(runtime, stalled)
    finally:
        server.close()
    assert params is not None and params["do_remote_prefill"] is True
    metrics = runtime.calls["p"].metrics
    assert metrics.upstream_errors.labels(stalled, "timeout")._value.get() == 1
    assert worker.state.pd is not None and worker.state.pd.held is not None
    worker.state.pd.held.release_all()
