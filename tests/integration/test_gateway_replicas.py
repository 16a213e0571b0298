"""Gateway replicas as separate processes sharing their picks through a real redis-server
(``epp.replicas``): a prefix placed through one replica is warm through the other; with Redis
gone every request is still served and ``/readyz`` says the view is local only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from loadtest.harness.redis_server import RedisServer

SYSTEM = "{}: the system prompt of one application, long enough to span many blocks. "


def _policy(backends: list[str], redis_url: str) -> str:
    endpoints = ", ".join(b.removeprefix("http://") for b in backends)
    return f"""
pools: {{p: {{endpoints: [{endpoints}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{replicas: {{store: '{redis_url}', key: 'test:replicas', timeout: 200ms}}}}
"""


async def _ask(
    session: aiohttp.ClientSession, url: str, question: str, app: int = 0
) -> tuple[int, float]:
    """Status and share of the prompt cached, of one chat request with ``app``'s system
    prompt."""
    system = SYSTEM.format(app) * 12
    body = {
        "model": "kvgate-sim",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        answer = await response.json()
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return response.status, cached / usage.get("prompt_tokens", 1)


async def _view(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(f"{url}/readyz") as response:
        return response.status, (await response.json()).get("view", "")


async def test_a_prefix_placed_through_one_replica_is_warm_through_the_other(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    redis_server: RedisServer,
) -> None:
    backends = [start_backend("--cost", "zero") for _ in range(4)]
    policy = _policy(backends, redis_server.url)
    first, _ = start_gateway(policy)
    second, _ = start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        assert await _view(session, first) == (200, "shared")
        for app in range(4):  # spread over the backends by the first replica
            assert (await _ask(session, first, "a first question?", app))[0] == 200
        await asyncio.sleep(0.3)  # the picks reach the other replica
        # asked in another order (alone, the second replica would place them as the first did)
        for app in reversed(range(4)):
            status, cached = await _ask(session, second, "a question from elsewhere?", app)
            assert status == 200 and cached > 0.8, (app, cached)


async def test_without_redis_every_request_is_served_on_a_local_view(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    redis_server: RedisServer,
) -> None:
    backends = [start_backend("--cost", "zero") for _ in range(2)]
    url, _ = start_gateway(_policy(backends, redis_server.url))
    async with aiohttp.ClientSession() as session:
        assert await _view(session, url) == (200, "shared")
        redis_server.stop()
        statuses = [(await _ask(session, url, f"question {n}?"))[0] for n in range(10)]
        assert statuses == [200] * 10
        for _ in range(50):
            if await _view(session, url) == (200, "local only"):
                break
            await asyncio.sleep(0.1)
        assert await _view(session, url) == (200, "local only")
        redis_server.start()
        for _ in range(50):
            if await _view(session, url) == (200, "shared"):
                break
            await asyncio.sleep(0.1)
        assert await _view(session, url) == (200, "shared")
