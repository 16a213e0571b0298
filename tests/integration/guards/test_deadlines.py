"""Deadlines through a real gateway: a request that cannot start in time gets a 429 in the
API's error shape with ``Retry-After`` (counted apart from other refusals), one that can is
served, and a malformed deadline is a 400."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape

BODY = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 40, "ignore_eos": True}


async def test_a_request_that_cannot_start_by_its_deadline_is_refused_early(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "0.02,0,0,0").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}], max_concurrency: 1}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""")
    async with aiohttp.ClientSession() as session:

        async def ask(deadline: str | None, max_tokens: int = 40) -> aiohttp.ClientResponse:
            headers = {} if deadline is None else {"x-kvgate-deadline-ms": deadline}
            body = {**BODY, "max_tokens": max_tokens}
            async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                await r.read()
                return r

        busy = asyncio.create_task(ask(None))  # ~0.8 s on the pool's one slot
        await asyncio.sleep(0.2)
        refused = await ask("100")
        served = await ask("5000", max_tokens=2)  # waits for the slot, then starts in time
        bad = await ask("soon")
        assert (await busy).status == 200
    assert refused.status == 429 and refused.headers["retry-after"] == "1"
    error = (await refused.json())["error"]
    assert error["code"] == "deadline_unmet" and error["type"] == "rate_limit_error"
    assert served.status == 200
    assert bad.status == 400 and "x-kvgate-deadline-ms" in (await bad.json())["error"]["message"]
    rejections = {s.labels["reason"]: s.value for s in scrape(url)["kvgate_queue_rejections_total"]}
    assert rejections == {"deadline": 1.0}
