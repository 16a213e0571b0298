"""Deadlines in the admission queue: earliest first within a tenant, refused as they arrive when
the class's expected wait runs past them, refused when they come while the request waits; and
where a deadline comes from (the client's header, the class's duration or TTFT objective)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from multidict import CIMultiDict

from gateway.base.errors import BadRequest, DeadlineUnmet, Expired
from gateway.guards.admission import WAIT_SAMPLES, AdmissionQueue, Admitted
from gateway.guards.admission_gate import ConcurrencyGate
from gateway.guards.deadlines import DEADLINE_HEADER, deadline, requested_deadline
from policies.loader import load_policy_text
from policies.schema import DEFAULT_CLASSES, PriorityClass

CLASSES = dict(DEFAULT_CLASSES)


async def test_a_tenants_requests_start_earliest_deadline_first() -> None:
    q = AdmissionQueue(CLASSES, ConcurrencyGate({"p": 1}))
    held = q.try_enter("p")
    assert held is not None
    now, order = time.monotonic(), []

    async def one(name: str, within: float) -> None:
        admitted = await q.enter("p", "standard", "t", deadline=now + within)
        order.append(name)
        admitted.release()

    tasks = [
        asyncio.create_task(one(name, within))
        for name, within in (("late", 30.0), ("none", math.inf), ("soon", 10.0), ("mid", 20.0))
    ]
    await asyncio.sleep(0)
    held.release()
    await asyncio.gather(*tasks)
    assert order == ["soon", "mid", "late", "none"]


async def test_a_request_still_queued_at_its_deadline_is_refused_not_served_late() -> None:
    q = AdmissionQueue(CLASSES, ConcurrencyGate({"p": 1}))
    held = q.try_enter("p")
    assert held is not None
    with pytest.raises(DeadlineUnmet) as refused:
        await q.enter("p", "standard", "t", deadline=time.monotonic() + 0.05)
    assert refused.value.status == 429 and refused.value.headers["retry-after"] == "1"
    assert q.depth("p", "standard") == 0
    short = PriorityClass("standard", 3, max_wait=0.05)  # max_wait first: given up, as before
    q.update({**CLASSES, "standard": short}, q.gate)
    with pytest.raises(Expired):
        await q.enter("p", "standard", "t", deadline=time.monotonic() + 5)
    held.release()


async def test_a_request_whose_expected_wait_runs_past_its_deadline_is_refused_at_once() -> None:
    q = AdmissionQueue(CLASSES, ConcurrencyGate({"p": 1}))
    held = q.try_enter("p")
    assert held is not None
    waiting = [asyncio.create_task(q.enter("p", "standard", "t")) for _ in range(WAIT_SAMPLES + 4)]
    await asyncio.sleep(0)
    for _ in range(WAIT_SAMPLES):  # one leaves every 20 ms: the queue learns its pace
        await asyncio.sleep(0.02)
        held.release()
        held = await waiting.pop(0)
    began = time.monotonic()
    with pytest.raises(DeadlineUnmet) as refused:  # 4 ahead at ~20 ms: ~100 ms > 30 ms
        await q.enter("p", "standard", "u", deadline=began + 0.03)
    assert time.monotonic() - began < 0.01 and refused.value.headers["retry-after"] == "1"
    assert "expected wait" in refused.value.message
    fits = asyncio.create_task(q.enter("p", "standard", "u", deadline=began + 5))

    async def served(task: asyncio.Task[Admitted]) -> None:
        (await task).release()

    held.release()
    await asyncio.gather(*[served(task) for task in [*waiting, fits]])


def test_the_clients_deadline_header_is_whole_milliseconds_within_a_day() -> None:
    assert requested_deadline(CIMultiDict()) is None
    assert requested_deadline(CIMultiDict({DEADLINE_HEADER: "250"})) == 0.25
    for bad in ("0", "-5", "1.5", "soon", str(86_400_001)):
        with pytest.raises(BadRequest, match=DEADLINE_HEADER):
            requested_deadline(CIMultiDict({DEADLINE_HEADER: bad}))


def test_a_deadline_comes_from_the_client_else_the_class_else_its_ttft_objective() -> None:
    policy = load_policy_text("""
pools: {p: {endpoints: ["127.0.0.1:1"]}}
routes: [{model: m, pool: p}]
classes:
  interactive: {weight: 6, deadline: objective}
  standard: {weight: 3, deadline: 2s}
  batch: {weight: 1}
slos:
  objectives:
    - {route: m, class: interactive, ttft_p95: 400ms}
    - {route: "*", ttft_p99: 3s}
""")
    classes, slos, now = policy.classes, policy.slos, time.perf_counter()

    def within(requested: float | None, cls: str) -> float:
        return deadline(requested, classes[cls], slos, "m", now) - time.monotonic()

    assert within(0.1, "batch") == pytest.approx(0.1, abs=0.01)  # the client's, first
    assert within(None, "standard") == pytest.approx(2.0, abs=0.01)
    assert within(None, "interactive") == pytest.approx(0.4, abs=0.01)  # the tightest
    assert within(None, "batch") == math.inf


def test_a_class_deadline_that_is_not_a_positive_duration_is_refused() -> None:
    with pytest.raises(ValueError, match=r"classes\.standard\.deadline"):
        load_policy_text("""
pools: {p: {endpoints: ["127.0.0.1:1"]}}
routes: [{model: m, pool: p}]
classes: {standard: {weight: 3, deadline: 0s}}
""")
