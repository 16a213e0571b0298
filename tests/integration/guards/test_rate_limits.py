"""Rate limits with real processes: gateway replicas sharing one redis-server, Redis killed
and restarted mid-test, fail-open and fail-closed."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable

import aiohttp
import pytest
import redis

from gateway.guards.limits.buckets import BucketSpec
from gateway.guards.limits.redis_store import RedisStore
from loadtest.harness.processes import KvgateProcess
from loadtest.harness.redis_server import RedisServer

LIMIT = 300  # requests per minute, shared: refills 5 per second


def policy(
    backend: str, url: str, on_failure: str = "fail_open", replicas: int = 3, timeout: str = "50ms"
) -> str:
    return f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
limits:
  store: {{kind: redis, url: "{url}", timeout: {timeout}, on_failure: {on_failure}, replicas: {replicas}}}
  rules: [{{name: per-tenant, match: {{tenant: "*"}}, requests_per_min: {LIMIT}}}]
"""


async def burst(
    urls: list[str], total: int, concurrency: int = 30
) -> tuple[list[int], list[float], float]:
    statuses: list[int] = []
    latencies: list[float] = []
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    queue = list(range(total))
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                t0 = time.perf_counter()
                async with session.post(
                    f"{urls[i % len(urls)]}/v1/completions", json=body
                ) as response:
                    await response.read()
                    statuses.append(response.status)
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, latencies, time.perf_counter() - started


async def test_replicas_share_one_limit(
    redis_server: RedisServer,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    # a generous timeout: three replicas, a backend and the client share two cores here
    gateways = [start_gateway(policy(backend, redis_server.url, timeout="1s"))[0] for _ in range(3)]
    statuses, _, elapsed = await burst(gateways, 600)
    admitted = statuses.count(200)
    assert set(statuses) <= {200, 429}
    refill = LIMIT / 60 * elapsed
    assert LIMIT * 0.99 <= admitted <= LIMIT + refill + LIMIT * 0.01, (admitted, elapsed)


async def test_limited_responses_carry_openai_headers(
    redis_server: RedisServer,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(policy(backend, redis_server.url))
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["x-ratelimit-limit-requests"] == str(LIMIT)
            assert int(response.headers["x-ratelimit-remaining-requests"]) == LIMIT - 1
            assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        limited = None
        for _ in range(10):  # refill (5/s) may outpace a slow burst: keep going until refused
            await burst([url], 100)
            response = await session.post(f"{url}/v1/completions", json=body)
            if response.status == 429:
                limited = response
                break
            response.release()
        assert limited is not None, "the limit never refused a request"
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert (await limited.json())["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize("on_failure", ["fail_open", "fail_closed"])
async def test_redis_outage_and_recovery(
    on_failure: str,
    redis_server: RedisServer,
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(
        # a roomy timeout: a Redis call timing out under this machine's load would send the
        # recovery burst to the local share, which the outage already spent
        policy(backend, redis_server.url, on_failure, replicas=3, timeout="1s")
    )
    started = time.monotonic()
    statuses, _, _ = await burst([url], 20)
    assert statuses == [200] * 20
    redis_server.stop()
    statuses, latencies, _ = await burst([url], 60, concurrency=10)
    assert max(latencies) < 1.5, max(
        latencies
    )  # refused connections fail fast; then local decisions
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as ready:
        readiness = await ready.json()
    if on_failure == "fail_open":
        # this replica's share of what is left of the minute: about 300/3, minus nothing shared
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 20
        assert ready.status == 200 and readiness["limiter"] == "degraded"
    else:
        assert set(statuses) == {503}
        assert ready.status == 503 and readiness["limiter"] == "down"
    admitted_while_away = statuses.count(200)
    redis_server.start()
    await asyncio.sleep(1.2)  # the store is retried after a failure back-off of 1 s
    statuses, _, _ = await burst([url], 40, concurrency=1)
    assert statuses == [200] * 40, sorted(Counter(statuses).items())
    # shared limiting resumed in the restarted Redis, which lost its buckets: the bucket starts
    # from the level the gateway last saw, and what was admitted while Redis was away is owed
    await asyncio.sleep(0.5)  # the owed usage is sent every 0.1 s
    client = redis.Redis.from_url(redis_server.url)
    tokens = float(client.hget("kvgate:rl:per-tenant:req:tenant=anonymous", "tokens") or -1)
    client.close()
    spent = 20 + admitted_while_away + 40
    refill = LIMIT / 60 * (time.monotonic() - started)
    assert LIMIT - spent - 1 <= tokens <= LIMIT - spent + refill + 1, (tokens, spent, refill)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as ready:
        assert ready.status == 200 and (await ready.json())["limiter"] == "ok"


async def test_the_stores_clock_orders_every_answer(redis_server: RedisServer) -> None:
    """The fallback keeps the level of the newest answer by Redis's clock. Answers read to
    100 µs tied when Redis ran them back to back, and a tie let an older, higher level replace
    the newest one (a restarted Redis was then seeded several requests too high)."""
    store = RedisStore(redis_server.url, timeout=5.0)
    await store.start()
    spec = BucketSpec("clock", capacity=LIMIT, cost=1)
    answers = await asyncio.gather(*(store.take([spec], [None]) for _ in range(100)))
    await store.close()
    # by the store's clock (within one microsecond, the lower level is the later take), the
    # answers are one chain of takes: each the one before, refilled for the time between, less 1
    by_time = sorted(answers, key=lambda answer: (answer.at, -answer.remaining[0]))
    chain = [(answer.at, answer.remaining[0]) for answer in by_time]
    for (at, level), (later_at, later_level) in itertools.pairwise(chain):
        expected = min(spec.capacity, level + (later_at - at) * spec.rate) - 1
        assert later_level == pytest.approx(expected, abs=1e-3), chain
