"""The limiter's store state follows real outcomes, not the clock: /readyz
and the limiter's metrics say "down" while Redis is down, and "ok" once a call succeeds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess, free_port
from loadtest.harness.redis_server import RedisServer
from tests.integration.metrics_util import scrape


async def get(url: str, path: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}{path}") as response:
        return response.status, await response.json(content_type=None)


async def post(url: str) -> int:
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        await response.read()
        return response.status


def limiter_metrics(url: str) -> tuple[str, float]:
    families = scrape(url)
    state = next(s.labels["state"] for s in families["kvgate_limiter_state"] if s.value == 1)
    fallback = sum(s.value for s in families["kvgate_limiter_fallback_decisions_total"])
    return state, fallback


async def test_readiness_and_metrics_follow_the_store(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    port = free_port()  # Redis is not there yet
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
limits:
  store: {{kind: redis, url: "redis://127.0.0.1:{port}/0", timeout: 50ms, on_failure: fail_closed}}
  rules: [{{name: r, match: {{tenant: "*"}}, requests_per_min: 1000}}]
""")
    assert await post(url) == 503  # fail_closed: refused
    for _ in range(3):  # well past the 1 s retry window, with no request to probe it
        await asyncio.sleep(0.6)
        code, body = await get(url, "/readyz")
        assert (code, body["limiter"]) == (503, "down"), body
    assert limiter_metrics(url)[0] == "down"
    redis = RedisServer(port).start()
    try:
        for _ in range(40):  # the next request past the window probes Redis and finds it
            if await post(url) == 200:
                break
            await asyncio.sleep(0.1)
        code, body = await get(url, "/readyz")
        assert (code, body["limiter"]) == (200, "ok"), body
        assert limiter_metrics(url)[0] == "ok"
    finally:
        redis.stop()
