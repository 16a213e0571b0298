"""The scraper's rest: a wait that a ring or its timeout ends."""

from __future__ import annotations

import asyncio

from epp.datalayer.doorbell import Doorbell


async def test_a_ring_wakes_every_waiter_at_once() -> None:
    bell = Doorbell()
    waits = [asyncio.create_task(bell.wait(5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    bell.ring()
    assert await asyncio.gather(*waits) == [True, True, True]
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_wait_nobody_rings_ends_with_false_at_its_timeout() -> None:
    bell = Doorbell()
    started = asyncio.get_running_loop().time()
    assert await bell.wait(0.05) is False
    assert 0.04 <= asyncio.get_running_loop().time() - started < 1.0
    bell.ring()  # nobody waits: nothing to wake, nothing left behind
    assert await bell.wait(0.02) is False  # an earlier ring is not remembered


async def test_a_timed_out_or_cancelled_waiter_is_not_woken_later() -> None:
    bell = Doorbell()
    assert await bell.wait(0.01) is False
    cancelled = asyncio.create_task(bell.wait(5.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    waiting = asyncio.create_task(bell.wait(5.0))
    await asyncio.sleep(0)
    bell.ring()
    assert await waiting is True and cancelled.cancelled()
