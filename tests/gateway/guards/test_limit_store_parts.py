"""The Redis limiter's parts, as units: the loop-aware deadline, the store's health, the fallback
buckets seeded from Redis's last levels, and the usage owed to Redis."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from gateway.guards.limits.buckets import BucketSpec, TakeResult
from gateway.guards.limits.fallback import FORGET_AFTER, FallbackBuckets
from gateway.guards.limits.loop_deadline import within
from gateway.guards.limits.pending_usage import PendingUsage
from kvgate.wire.store_health import StoreHealth

SPEC = BucketSpec("k", capacity=600, cost=1)  # 10 a second


def block_the_loop(seconds: float) -> None:
    """A slow turn of the event loop, as a busy gateway has."""
    time.sleep(seconds)


async def answer_after(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "answer"


async def test_an_answer_queued_behind_a_busy_loop_is_not_a_timeout() -> None:
    call = asyncio.ensure_future(within(answer_after(0.005), seconds=0.02, patience=0.5))
    await asyncio.sleep(0)  # the call is waiting
    block_the_loop(0.1)  # one slow turn of the loop: the answer and the deadline are both due
    assert await call == "answer"


async def test_a_peer_slow_while_the_loop_is_idle_times_out_on_time() -> None:
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        await within(answer_after(1.0), seconds=0.02, patience=0.5)
    assert time.perf_counter() - started < 0.2


async def test_patience_bounds_a_loop_that_stays_busy() -> None:
    async def busy_loop() -> None:
        while True:
            block_the_loop(0.03)  # every turn late by more than half the timeout
            await asyncio.sleep(0)

    hog = asyncio.create_task(busy_loop())
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        await within(answer_after(10.0), seconds=0.02, patience=0.2)
    hog.cancel()
    assert 0.2 <= time.perf_counter() - started < 0.5


async def test_a_cancelled_wait_cancels_the_call() -> None:
    inner = asyncio.ensure_future(answer_after(10.0))
    outer = asyncio.ensure_future(within(inner, seconds=1.0, patience=1.0))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert inner.cancelled()


def is_up(health: StoreHealth) -> bool:
    """Read afresh (each call above changes it)."""
    return health.up


def test_the_store_goes_down_only_after_consecutive_failures() -> None:
    health = StoreHealth("store", failures_to_down=3)
    assert [health.failed("x"), health.failed("x")] == [False, False]
    health.succeeded()  # a success in between starts the count over
    assert [health.failed("x"), health.failed("x"), health.failed("x")] == [False, False, True]
    assert not is_up(health) and health.failures == 5
    assert health.succeeded() and is_up(health)
    assert health.failed("start-up", conclusive=True) and not is_up(health)


def test_fallback_buckets_start_from_the_share_of_the_last_level() -> None:
    fallback = FallbackBuckets(share=2)
    fallback.observe([SPEC], TakeResult(True, 0.0, (40.0,), at=100.0), now=10.0)
    # half of 40 is this replica's; a second later 5 more (half of 10/s) have refilled
    result = fallback.take([BucketSpec("k", 600, 25)], now=11.0)
    assert result.allowed and result.remaining == pytest.approx((0.0,))
    assert not fallback.take([SPEC], now=11.0).allowed
    unseen = fallback.take([BucketSpec("other", 600, 300)], now=11.0)  # never reported: full
    assert unseen.allowed


def test_fallback_keeps_the_newest_answer_by_the_stores_clock() -> None:
    fallback = FallbackBuckets(share=1)
    fallback.observe([SPEC], TakeResult(True, 0.0, (10.0,), at=100.2), now=5.0)
    fallback.observe([SPEC], TakeResult(True, 0.0, (30.0,), at=100.1), now=5.0)  # arrived late
    assert fallback.seeds([SPEC], now=6.0) == [pytest.approx(20.0)]  # 10, and 1 s of refill
    assert fallback.seeds([BucketSpec("unseen", 600, 1)], now=6.0) == [None]


def test_fallback_keeps_the_lower_of_two_answers_from_one_tick_of_the_stores_clock() -> None:
    # two takes run within one microsecond: the later one left the lower level, whichever
    # answer arrives last
    fallback = FallbackBuckets(share=1)
    fallback.observe([SPEC], TakeResult(True, 0.0, (10.0,), at=100.2), now=5.0)
    fallback.observe([SPEC], TakeResult(True, 0.0, (11.0,), at=100.2), now=5.0)
    assert fallback.seeds([SPEC], now=5.0) == [pytest.approx(10.0)]


def test_an_answer_from_the_store_resets_the_local_bucket() -> None:
    fallback = FallbackBuckets(share=1)
    fallback.observe([SPEC], TakeResult(True, 0.0, (5.0,), at=1.0), now=0.0)
    assert fallback.take([BucketSpec("k", 600, 5)], now=0.0).allowed  # the local share spent
    fallback.observe([SPEC], TakeResult(True, 0.0, (300.0,), at=2.0), now=0.0)
    assert fallback.take([BucketSpec("k", 600, 200)], now=0.0).allowed  # from the new level


def test_pending_usage_adds_up_per_bucket_and_is_bounded() -> None:
    pending = PendingUsage(max_buckets=2)
    pending.add([BucketSpec("a", 600, 5), BucketSpec("b", 600, -3)])
    pending.add([BucketSpec("a", 600, 2), BucketSpec("c", 600, 1)])  # c is past the bound
    assert len(pending) == 2 and pending.dropped == 1
    assert sorted((s.key, s.cost) for s in pending.drain()) == [("a", 7), ("b", -3)]
    assert len(pending) == 0
    pending.add([BucketSpec("a", 600, 4), BucketSpec("a", 600, -4)])
    assert pending.drain() == []  # nothing owed in sum: nothing to send


def test_the_fallback_keeps_a_budgets_level_past_a_minute() -> None:
    """A budget never refills: the level Redis last reported holds however long it is away,
    where a rate limit's is forgotten (it has refilled)."""
    fallback = FallbackBuckets(share=1)
    budget = BucketSpec("budget:b:acme:2026-12", 1.0, 0.6, period=math.inf, ttl=86400)
    start = time.monotonic()
    fallback.observe([budget, SPEC], TakeResult(True, 0.0, (0.5, 100.0), at=1.0), now=start)
    later = start + FORGET_AFTER * 2
    other = BucketSpec("other", 600, 1)
    fallback.observe([other], TakeResult(True, 0.0, (100.0,), at=2.0), now=later)  # prunes
    assert fallback.seeds([SPEC, budget], now=later) == [None, 0.5]
    assert not fallback.take([budget], now=later).allowed  # 0.5 left, not a new 1.0
