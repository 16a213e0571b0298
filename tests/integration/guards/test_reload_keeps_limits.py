"""Hot reload keeps every limit: requests admitted before a reload still
count against ``max_concurrency`` after it, and a changed limit applies to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving


class Counting:
    """An upstream that holds each request ``seconds`` and records the most at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.now = 0
        self.most = 0

    def app(self) -> web.Application:
        async def completions(request: web.Request) -> web.Response:
            await request.read()
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                await asyncio.sleep(self.seconds)
            finally:
                self.now -= 1
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return web.json_response({"choices": [{"text": "ok"}], "usage": usage})

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        return app


def policy(port: int, limit: int, note: str) -> str:
    return f"""# {note}
pools: {{p: {{max_concurrency: {limit}, endpoints: [127.0.0.1:{port}]}}}}
routes: [{{model: m, pool: p}}]
epp: {{picker: least-in-flight}}
"""


async def post(session: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


async def test_max_concurrency_holds_across_reloads(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    upstream = Counting(seconds=1.2)
    async with serving(upstream.app()) as port:
        url, gateway = start_gateway(policy(port, 4, "first"))
        policy_file = Path(gateway.args[gateway.args.index("--policy") + 1])
        async with aiohttp.ClientSession() as session:
            load = [asyncio.create_task(post(session, url)) for _ in range(12)]
            for turn in range(3):  # reloads while the first four are in flight
                await asyncio.sleep(0.4)
                await asyncio.to_thread(policy_file.write_text, policy(port, 4, f"reload {turn}"))
            await asyncio.sleep(1.2)
            await asyncio.to_thread(policy_file.write_text, policy(port, 2, "a lower limit"))
            statuses = await asyncio.gather(*load)
        assert statuses == [200] * 12
        assert upstream.most <= 4, upstream.most
