"""The Redis limiter with a real redis-server: a busy event loop is
not an outage, the first requests after start are not refused, a restarted Redis is found
again with fresh connections, and through an outage under load nothing hangs, no usage is
lost, and two replicas' admissions converge back on the shared limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from bench.limiter import drive
from bench.limiter import policy as bench_policy
from gateway.base.identity import Identity
from gateway.guards.limits.limiter import Limiter
from loadtest.harness.processes import KvgateProcess
from loadtest.harness.redis_server import RedisServer
from policies.schema import LimitRule, Limits, LimitStore

ACME = Identity("acme", principal="acme-key")


def block_the_loop(seconds: float) -> None:
    """A slow turn of the gateway's event loop, as a loaded gateway has."""
    time.sleep(seconds)


async def test_a_busy_event_loop_is_not_a_redis_outage(redis_server: RedisServer) -> None:
    store = LimitStore(kind="redis", url=redis_server.url, timeout=0.02, on_failure="fail_closed")
    limiter = Limiter(Limits(rules=(LimitRule("r", {}, requests_per_min=600),), store=store))
    await limiter.start()
    for _ in range(10):
        call = asyncio.ensure_future(limiter.reserve(ACME, "m", "/", {}))
        await asyncio.sleep(0)  # the call is on its way to Redis
        block_the_loop(0.06)  # three times the timeout, with Redis's answer waiting
        assert await call is not None  # admitted by Redis, not refused (fail_closed)
    assert limiter.status == "ok" and limiter.store_errors == 0
    await limiter.close()


def gateway_policy(backend: str, url: str) -> str:
    return f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
limits:
  store: {{kind: redis, url: "{url}", timeout: 20ms, on_failure: fail_closed}}
  rules: [{{name: r, match: {{tenant: "*"}}, requests_per_min: 100000}}]
"""


async def statuses(url: str, count: int) -> list[int]:
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                return response.status

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def test_the_first_requests_and_those_after_a_restart_are_admitted(
    redis_server: RedisServer,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(gateway_policy(backend, redis_server.url))
    # fail_closed refuses whatever the store does not answer: the connections are warm
    assert await statuses(url, 16) == [200] * 16
    redis_server.stop()
    assert set(await statuses(url, 8)) == {503}
    redis_server.start()
    async with aiohttp.ClientSession() as session:
        for _ in range(40):  # the probe finds Redis again, without a request to try it
            async with session.get(f"{url}/readyz") as ready:
                if ready.status == 200:
                    break
            await asyncio.sleep(0.1)
        assert ready.status == 200
    for _ in range(3):  # no pooled connection is stale: none fails
        assert await statuses(url, 16) == [200] * 16


async def test_two_replicas_through_an_outage_under_load(
    redis_server: RedisServer,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    urls = [start_gateway(bench_policy(backend, redis_server.url))[0] for _ in range(2)]
    # Redis killed 2.5 s in, for 5 s, and restarted empty
    result = await drive(urls, 10.0, 12, redis_server, outage=(2.5, 5.0))
    for tally in result.tallies.values():
        assert set(tally.statuses) <= {200, 429}, tally.statuses
        assert tally.slowest < 1.0  # nothing waits on the dead Redis
    # every admission is counted once in Redis: the restarted Redis neither hands out a fresh
    # minute nor forgets what the replicas admitted alone (before: about 2x the limit)
    assert 0.93 <= result.request_ratio <= 1.05, result
    assert 0.93 <= result.token_ratio <= 1.05, result
