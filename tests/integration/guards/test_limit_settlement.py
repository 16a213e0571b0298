"""Settling token usage with a real redis-server: deltas of many requests are added up per
bucket and sent together, off the request path, and none is lost."""

from __future__ import annotations

import asyncio

import pytest

from gateway.base.identity import Identity
from gateway.guards.limits.buckets import BucketSpec
from gateway.guards.limits.limiter import SETTLE_EVERY, Limiter, RateLimited
from loadtest.harness.redis_server import RedisServer
from policies.schema import LimitRule, Limits, LimitStore

ACME = Identity("acme", principal="acme-key")


async def test_settlements_are_batched_and_all_applied(redis_server: RedisServer) -> None:
    store = LimitStore(kind="redis", url=redis_server.url, timeout=1.0)
    rule = LimitRule("r", {}, tokens_per_min=1000)
    lim = Limiter(Limits(rules=(rule,), store=store))
    body = {"prompt": "x" * 40, "max_tokens": 190}  # estimate 200 each
    reservations = [await lim.reserve(ACME, "m", "/", body) for _ in range(5)]  # 1000 taken
    with pytest.raises(RateLimited):
        await lim.reserve(ACME, "m", "/", body)
    calls = 0
    settle = lim._settle

    async def counting(specs: list[BucketSpec]) -> None:
        nonlocal calls
        calls += 1
        await settle(specs)

    lim._settle = counting  # type: ignore[method-assign]
    for reservation in reservations:
        lim.settle(reservation, actual_tokens=20)  # 180 back, five times
    await asyncio.sleep(SETTLE_EVERY * 3)
    assert calls == 1  # one script call for the five requests
    # 900 refunded (plus a little refill): four more requests of 200 fit, not five
    admitted = 0
    for _ in range(5):
        try:
            await lim.reserve(ACME, "m", "/", body)
            admitted += 1
        except RateLimited:
            break
    assert admitted == 4
    await lim.close()
