"""Which stream a queued request pauses, and how the paused one's slot moves: handed to the
request that asked, taken back when that one was served meanwhile, and asked for again ahead of
the tenant's newer requests."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.guards.admission import AdmissionQueue
from gateway.guards.admission_gate import ConcurrencyGate
from gateway.guards.pauses import PausableStream
from policies.schema import DEFAULT_CLASSES

CLASSES = {name: replace(spec, max_pauses=1) for name, spec in DEFAULT_CLASSES.items()}


def _running(q: AdmissionQueue, cls: str, started: float) -> PausableStream:
    admitted = q.try_enter("p")
    assert admitted is not None
    stream = PausableStream(admitted, CLASSES[cls], "t")
    stream.started = started
    q.streams.add("p", stream)
    return stream


def _wanted(stream: PausableStream) -> bool:
    return stream.wanted


async def test_the_lightest_most_recent_stream_is_paused_and_its_slot_handed_over() -> None:
    gate = ConcurrencyGate({"p": 3})
    q = AdmissionQueue(CLASSES, gate)
    old_batch, new_batch, standard = (
        _running(q, "batch", 1.0),
        _running(q, "batch", 2.0),
        _running(q, "standard", 3.0),
    )
    woken: list[str] = []
    new_batch.interrupt = lambda: woken.append("new")
    waiting = asyncio.create_task(q.enter("p", "interactive", "u"))
    await asyncio.sleep(0)
    assert woken == ["new"] and new_batch.wanted and not old_batch.wanted and not standard.wanted
    paused = asyncio.create_task(new_batch.take_turn())
    admitted = await asyncio.wait_for(waiting, 1)  # the batch stream's slot, handed over
    assert gate.in_flight["p"] == 3 and not paused.done()
    assert q.depth("p", "batch") == 1 and not new_batch.may_pause  # waiting: not asked again
    admitted.release()  # the slot goes to the paused stream
    assert await asyncio.wait_for(paused, 1) >= 0 and new_batch.admitted.pool == "p"
    assert new_batch.pauses == 1 and not new_batch.may_pause  # max_pauses: 1


async def test_nothing_lighter_or_nothing_left_to_pause_pauses_nothing() -> None:
    q = AdmissionQueue(CLASSES, ConcurrencyGate({"p": 1}))
    stream = _running(q, "interactive", 1.0)
    waiting = asyncio.create_task(q.enter("p", "batch", "u"))
    await asyncio.sleep(0)
    assert not stream.wanted  # a batch request never pauses an interactive stream
    stream.admitted.release()
    (await waiting).release()


async def test_a_request_served_before_the_pause_leaves_the_stream_its_slot_back() -> None:
    gate = ConcurrencyGate({"p": 2})
    q = AdmissionQueue(CLASSES, gate)
    stream, other = _running(q, "batch", 1.0), _running(q, "interactive", 0.5)
    waiting = asyncio.create_task(q.enter("p", "interactive", "u"))
    await asyncio.sleep(0)
    assert _wanted(stream)
    other.admitted.release()  # a slot came free: the waiting request took it
    (await waiting).release()
    assert not _wanted(stream)  # nobody waits for it any more: it runs on
    assert gate.in_flight["p"] == 1


async def test_a_stream_that_cannot_go_on_declines_and_is_not_asked_again() -> None:
    gate = ConcurrencyGate({"p": 1})
    q = AdmissionQueue(CLASSES, gate)
    stream = _running(q, "batch", 1.0)
    waiting = asyncio.create_task(q.enter("p", "interactive", "u"))
    await asyncio.sleep(0)
    assert _wanted(stream)
    stream.decline()  # what it sent cannot be continued elsewhere: it runs to its end
    assert not _wanted(stream) and not stream.may_pause
    assert not waiting.done() and q.depth("p", "interactive") == 1  # waits for the next slot
    stream.admitted.release()
    (await asyncio.wait_for(waiting, 1)).release()
    assert gate.in_flight["p"] == 0
