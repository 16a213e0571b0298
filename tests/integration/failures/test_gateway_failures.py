"""Failure semantics with real processes: dead pools, retries, broken and stalled streams,
client disconnects and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess, free_port
from tests.http_servers import serving, stalled_sse
from tests.integration.metrics_util import value

STREAM = {"model": "kvgate-sim", "prompt": "long story", "max_tokens": 2000, "stream": True}


def policy(*endpoints: str, extra: str = "") -> str:
    return f"""
pools: {{p: {{endpoints: [{", ".join(endpoints)}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
timeouts: {{connect: 500ms, first_byte: 5s, idle: 1s}}
retries: {{attempts: 2, backoff: 1ms}}
listen: {{shutdown_grace: 20s}}
{extra}
"""


async def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        return response.status, await response.json()


async def test_dead_pool_is_a_clean_502(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    url, _ = start_gateway(policy(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"))
    status, body = await post(url, {"model": "kvgate-sim", "prompt": "x"})
    assert status == 502
    assert body["error"]["code"] == "upstream_error"  # type: ignore[index]


async def test_connect_errors_retry_on_a_live_endpoint(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    live = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(policy(f"127.0.0.1:{free_port()}", live))
    results = [
        await post(url, {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}) for _ in range(20)
    ]
    assert all(status == 200 for status, _ in results)


@pytest.fixture
async def failing_upstream() -> AsyncIterator[tuple[str, list[int]]]:
    """A real HTTP server that answers every request with a 503."""
    hits: list[int] = []

    async def fail(request: web.Request) -> web.Response:
        hits.append(1)
        return web.json_response({"error": "overloaded"}, status=503)

    app = web.Application()
    app.router.add_post("/v1/completions", fail)
    async with serving(app) as port:
        yield f"127.0.0.1:{port}", hits


async def test_5xx_before_first_byte_is_retried(
    failing_upstream: tuple[str, list[int]],
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    bad, hits = failing_upstream
    live = start_backend("--cost", "zero").removeprefix("http://")
    # the least-in-flight picker: the EPP would never pick an endpoint without metrics
    url, _ = start_gateway(policy(bad, live, extra="epp: {picker: least-in-flight}"))
    for _ in range(10):
        status, _ = await post(url, {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1})
        assert status == 200
    assert hits, "the failing endpoint was tried"
    only_bad, _ = start_gateway(policy(bad))
    status, body = await post(only_bad, {"model": "kvgate-sim", "prompt": "x"})
    assert status == 503 and body == {"error": "overloaded"}  # the last answer passes through


async def read_events(response: aiohttp.ClientResponse) -> list[str]:
    raw = (await response.read()).decode()
    return [e.strip() for e in raw.split("\n\n") if e.strip()]


async def test_upstream_killed_mid_stream_ends_with_an_error_event(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    from loadtest.harness.processes import backend_process

    port = free_port()
    backend = backend_process(port, "--cost", "0.01,0,0,0").start()
    try:
        url, _ = start_gateway(policy(f"127.0.0.1:{port}"))
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/v1/completions", json=STREAM)
            await response.content.readline()
            backend.kill()
            events = await read_events(response)
    finally:
        backend.stop()
    assert events[-1].startswith('data: {"error"')
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_stream_broken"
    assert "data: [DONE]" not in events


@pytest.fixture
async def stalling_upstream() -> AsyncIterator[str]:
    """Sends one SSE chunk, then nothing."""
    async with stalled_sse(b'data: {"choices":[{"index":0,"text":"a"}]}\n\n') as port:
        yield f"127.0.0.1:{port}"


async def test_stalled_stream_hits_the_idle_timeout(
    stalling_upstream: str, start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    url, _ = start_gateway(policy(stalling_upstream))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        response = await session.post(f"{url}/v1/completions", json=STREAM)
        events = await read_events(response)
    assert events[0].startswith('data: {"choices"')
    assert "stalled" in json.loads(events[-1][6:])["error"]["message"]


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_frees_the_backend_slot(
    stream: bool,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "0.01,0,0,0")
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    body = {**STREAM, "stream": stream}
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
        for _ in range(100):
            if value(backend, "vllm:num_requests_running") == 1:
                break
            await asyncio.sleep(0.05)
        assert value(backend, "vllm:num_requests_running") == 1
        if stream:
            response = await task
            await response.content.readline()
            response.close()
        else:
            task.cancel()
    for _ in range(100):
        if value(backend, "vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert value(backend, "vllm:num_requests_running") == 0
    assert value(backend, "vllm:kv_cache_usage_perc") == 0


async def test_sigterm_lets_streams_finish(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "0.01,0,0,0")
    url, gateway = start_gateway(policy(backend.removeprefix("http://")))
    body = {**STREAM, "max_tokens": 100}  # ~1 s of streaming
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{url}/v1/completions", json=body)
        await response.content.readline()
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        events = await read_events(response)
        assert events[-1] == "data: [DONE]"
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.post(f"{url}/v1/completions", json=body)
    assert gateway.proc.wait(timeout=10) == 0


async def test_a_stream_past_the_shutdown_grace_ends_with_an_error_event(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "0.01,0,0,0")
    url, gateway = start_gateway(
        policy(backend.removeprefix("http://"), extra="listen: {shutdown_grace: 500ms}").replace(
            "listen: {shutdown_grace: 20s}\n", ""
        )
    )
    body = {**STREAM, "max_tokens": 1000}  # ~10 s of streaming: outlasts the grace
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{url}/v1/completions", json=body, headers={"x-request-id": "cut-1"}
        )
        await response.content.readline()
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        events = await read_events(response)  # the chunked body ends properly
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "shutdown" and "data: [DONE]" not in events
    assert gateway.proc.wait(timeout=10) == 0
    assert gateway.log is not None
    log = await asyncio.to_thread(Path(gateway.log).read_text)
    entries = [json.loads(x) for x in log.splitlines() if x[:1] == "{"]
    line = next(e for e in entries if e.get("request_id") == "cut-1")
    assert (line["status"], line["error"]) == (200, "cut_by_shutdown")
