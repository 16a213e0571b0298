"""A pool's ``capacity: measured`` against real engines: two simulated backends whose costs
differ 3x behind a real gateway; the picker reads their inter-token latency histograms from the
scrapes and gives the fast one about three times the capacity of the slow one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from bench.capacity import FAST, SLOW
from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape


async def test_the_faster_engine_is_measured_about_three_times_the_capacity(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    fast, slow = (start_backend("--cost", cost).removeprefix("http://") for cost in (FAST, SLOW))
    url, _ = start_gateway(f"""
pools: {{p: {{capacity: measured, endpoints: [{fast}, {slow}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""")

    async def one(session: aiohttp.ClientSession, n: int) -> None:
        body = {"model": "kvgate-sim", "prompt": f"question {n} " * 20, "max_tokens": 48}
        async with session.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200
            await response.read()

    async with aiohttp.ClientSession() as session:
        for wave in range(6):  # a few at a time: both engines decode, at small batches
            await asyncio.gather(*(one(session, wave * 4 + n) for n in range(4)))
    capacity = {s.labels["endpoint"]: s.value for s in scrape(url)["kvgate_epp_endpoint_capacity"]}
    assert 2.4 <= capacity[fast] / capacity[slow] <= 3.6, capacity  # 2.9-3.0 measured
