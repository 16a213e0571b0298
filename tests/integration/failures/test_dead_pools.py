"""Nothing hangs when backends die: a pool whose endpoints are all
unreachable answers at once (and its fallbacks serve) instead of queueing its requests until
their class's ``max_wait``; ``/readyz`` names the routes with no live endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess, backend_process, free_port


async def timed_post(url: str, model: str) -> tuple[int, float]:
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        await response.read()
        return response.status, time.monotonic() - started


async def readyz(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as response:
        return response.status, await response.json()


async def test_a_pool_whose_backends_died_answers_at_once(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    live = start_backend("--cost", "zero").removeprefix("http://")
    port = free_port()
    doomed = backend_process(port, "--cost", "zero").start()
    try:
        url, _ = start_gateway(f"""
pools:
  doomed: {{model: kvgate-sim, endpoints: [127.0.0.1:{port}]}}
  spare: {{model: kvgate-sim, endpoints: [{live}]}}
routes:
  - {{model: kvgate-sim, pool: doomed}}
  - {{model: with-fallback, pool: doomed, fallback: [kvgate-sim-spare]}}
  - {{model: kvgate-sim-spare, pool: spare}}
""")
        assert (await timed_post(url, "kvgate-sim"))[0] == 200  # scraped and serving
        assert (await readyz(url))[1]["status"] == "ready"
    finally:
        doomed.stop()
    await asyncio.sleep(2.0)  # the picker's scrapes fail; its last metrics go stale
    status, seconds = await timed_post(url, "kvgate-sim")
    assert status in (502, 503) and seconds < 3.0, (status, seconds)  # not queued for 30 s
    status, seconds = await timed_post(url, "with-fallback")
    assert status == 200 and seconds < 3.0, (status, seconds)
    code, body = await readyz(url)
    assert code == 200 and body["status"] == "degraded", body
    assert body["dead_pools"] == ["doomed"] and body["routes"] == ["kvgate-sim", "with-fallback"]


async def test_readiness_can_require_every_pool_alive(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    url, _ = start_gateway(f"""
listen: {{ready_with_dead_pools: false}}
pools: {{gone: {{endpoints: [127.0.0.1:{free_port()}]}}}}
routes: [{{model: m, pool: gone}}]
""")
    for _ in range(40):  # never scraped successfully: unhealthy after three failures
        code, body = await readyz(url)
        if code == 503:
            break
        await asyncio.sleep(0.1)
    assert code == 503 and body["status"] == "not ready" and body["dead_pools"] == ["gone"]
