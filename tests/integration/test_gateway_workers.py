"""``--workers 2``: two processes share the port; /metrics sums over both."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape


async def test_two_workers_share_the_port_and_the_metrics(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, gateway = start_gateway(
        f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""",
        "--workers",
        "2",
    )
    body = {"model": "kvgate-sim", "prompt": "w", "max_tokens": 1}

    async def one() -> int:
        # a fresh connection each time, so the kernel spreads them over both workers
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(one() for _ in range(60)))
    assert statuses == [200] * 60
    total = 0.0
    for _ in range(40):  # a worker moves its batched samples into the shared files twice a second
        total = sum(
            s.value
            for s in scrape(url).get("kvgate_requests_total", [])
            if s.labels["route"] == "/v1/completions"
        )
        if total == 60:
            break
        await asyncio.sleep(0.1)
    assert total == 60
    children = await asyncio.create_subprocess_exec(
        "pgrep",
        "-P",
        str(gateway.proc.pid),  # type: ignore[union-attr]
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await children.communicate()
    assert len(out.split()) >= 2
