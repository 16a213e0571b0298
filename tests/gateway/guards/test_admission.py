"""The weighted-fair admission queue: class shares, tenant fairness, bounds, cancellation."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.base.errors import Expired, QueueFull
from gateway.guards.admission import AdmissionQueue
from gateway.guards.admission_gate import ConcurrencyGate
from policies.schema import DEFAULT_CLASSES, PriorityClass

CLASSES = dict(DEFAULT_CLASSES)


def queue(concurrency: int = 1, classes: dict[str, PriorityClass] | None = None) -> AdmissionQueue:
    return AdmissionQueue(classes or CLASSES, ConcurrencyGate({"p": concurrency}))


async def serve(q: AdmissionQueue, waiters: list[tuple[str, str]]) -> list[tuple[str, str]]:
    served: list[tuple[str, str]] = []

    async def one(cls: str, tenant: str) -> None:
        admitted = await q.enter("p", cls, tenant)
        served.append((cls, tenant))
        await asyncio.sleep(0)
        admitted.release()

    tasks = [asyncio.create_task(one(c, t)) for c, t in waiters]
    await asyncio.gather(*tasks)
    return served


async def test_class_shares_follow_the_weights() -> None:
    waiters = [(cls, "t") for cls in ("interactive", "standard", "batch") for _ in range(700)]
    served = await serve(queue(), waiters)
    head = Counter(cls for cls, _ in served[1:1001])  # all three backlogged throughout
    for cls, share in (("interactive", 0.6), ("standard", 0.3), ("batch", 0.1)):
        assert abs(head[cls] / 1000 - share) <= 0.05 * share, head


async def test_tenants_share_a_class_equally_even_if_one_sends_ten_times_more() -> None:
    waiters = [("standard", "big")] * 1000 + [("standard", "small")] * 100
    served = await serve(queue(), waiters)
    head = Counter(tenant for _, tenant in served[1:201])
    assert head["big"] == head["small"] == 100


async def test_bounded_depth_and_wait() -> None:
    tight = {"standard": PriorityClass("standard", 1, max_queue=2, max_wait=0.1)}
    q = queue(classes=tight)
    await q.enter("p", "standard", "t")  # takes the only slot
    waiting = [asyncio.create_task(q.enter("p", "standard", "t")) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as full:
        await q.enter("p", "standard", "t")
    assert full.value.status == 429 and full.value.headers["retry-after"] == "1"
    for task in waiting:
        with pytest.raises(Expired) as expired:
            await task
        assert expired.value.status == 503
    assert q.depth("p", "standard") == 0


async def test_a_client_that_leaves_leaves_the_queue() -> None:
    q = queue()
    first = await q.enter("p", "standard", "t")
    task = asyncio.create_task(q.enter("p", "standard", "t"))
    await asyncio.sleep(0.01)
    assert q.depth("p", "standard") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.depth("p", "standard") == 0
    first.release()
    first.release()  # a second release gives nothing back twice
    again = await asyncio.wait_for(q.enter("p", "standard", "t"), 0.5)
    assert again.waited == 0.0  # the slot is free
    assert q.try_enter("p") is None  # ... and taken once only


async def test_unknown_class_falls_back_to_standard() -> None:
    assert queue().class_of("gold").name == "standard"


def test_an_objective_may_make_a_request_lighter_never_heavier() -> None:
    q = queue()
    assert q.classify("standard", "batch").name == "batch"
    assert q.classify("standard", "interactive").name == "standard"
    assert q.classify(None, None).name == "standard"
    assert q.classify("interactive", "unknown").name == "interactive"
