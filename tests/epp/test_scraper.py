"""The metrics scraper against real HTTP endpoints: fresh metrics, failures, health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from epp.datastore import Datastore
from epp.scraper import MetricsScraper
from loadtest.harness.processes import free_port
from policies.loader import load_policy_text
from tests.http_servers import serving


@pytest.fixture
async def metrics_server() -> AsyncIterator[int]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_waiting{model_name="m"} 4.0\n'
                                 'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n')  # fmt: skip

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as port:
        yield port


async def test_scrapes_live_endpoints_and_marks_dead_ones_unhealthy(metrics_server: int) -> None:
    dead = free_port()
    policy = load_policy_text(f"pools: {{p: {{endpoints: [127.0.0.1:{metrics_server}, 127.0.0.1:{dead}]}}}}\n"
                              "routes: [{model: m, pool: p}]\n")  # fmt: skip
    datastore = Datastore(policy)
    scraper = MetricsScraper(datastore, interval=0.01)
    await scraper.start()
    try:
        await asyncio.sleep(0.5)
    finally:
        await scraper.stop()
    live, gone = datastore.endpoints("p")
    assert (live.metrics.waiting, live.metrics.kv_usage) == (4, 0.25) and live.healthy
    assert live.metrics.age() < 0.5
    assert not gone.healthy and gone.metrics.scraped_at == 0.0 and scraper.errors >= 3
