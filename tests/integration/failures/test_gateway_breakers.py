"""A backend that dies is isolated by its breaker and readmitted once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess, backend_process, free_port
from tests.integration.metrics_util import scrape


async def post_many(url: str, count: int) -> list[int]:
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    statuses = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                statuses.append(response.status)
    return statuses


def breaker_state(url: str, address: str) -> float:
    return next(
        s.value for s in scrape(url)["kvgate_breaker_state"] if s.labels["endpoint"] == address
    )


def retries(url: str) -> float:
    return sum(s.value for s in scrape(url).get("kvgate_retries_total", []))


async def test_flapping_backend_is_isolated_and_readmitted(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    steady = start_backend("--cost", "zero").removeprefix("http://")
    flappy_port = free_port()
    flappy = f"127.0.0.1:{flappy_port}"
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{steady}, {flappy}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{picker: least-in-flight}}
breakers: {{consecutive_failures: 2, cool_down: 1s, half_open_probes: 1}}
retries: {{attempts: 2, backoff: 1ms}}
""")
    # the flappy backend is down: requests still succeed (retried on the steady one) ...
    assert await post_many(url, 20) == [200] * 20
    assert breaker_state(url, flappy) == 2  # ... and its breaker opened
    before = retries(url)
    assert await post_many(url, 20) == [200] * 20
    assert retries(url) == before  # isolated: nobody tries it any more
    with backend_process(flappy_port, "--cost", "zero"):
        await asyncio.sleep(1.2)  # past the cool-down: half-open
        assert await post_many(url, 20) == [200] * 20
        assert breaker_state(url, flappy) == 0  # the probe succeeded: readmitted
        served = scrape(f"http://{flappy}")["vllm:request_success_total"]
        assert sum(s.value for s in served) > 0
