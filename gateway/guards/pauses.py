"""Pausing a lighter class's streams so that a heavier class's requests need not wait.

When a request queues for a slot in a pool (``AdmissionQueue.enter``) and the pool runs streams
of a lighter class that may still be paused (the class's ``max_pauses``), the lightest, most
recently started of them is asked to pause for it: its relay stops at its next turn, hands its
slot to the waiting request (``Admitted.hand_over``), closes its upstream (the engine frees the
request's slot and blocks), and queues again in its own class, ahead of its tenant's newer
requests. Once admitted again it goes on from what the client already has, on any endpoint, in
the same response (``StreamResume.after_pause``): the client sees a gap, never an error.

A request that was served before the pause took effect (another slot came free) lets the stream
run on. Only streams that could be continued elsewhere are registered; a request that is not
streamed is never paused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from policies.schema import PriorityClass

if TYPE_CHECKING:
    from gateway.guards.admission import Admitted, Ticket


def _nothing() -> None:
    return None


class PausableStream:
    """A running stream the admission queue may pause (a plain slots class: one per stream)."""

    __slots__ = (
        "admitted",
        "interrupt",
        "pauses",
        "spec",
        "started",
        "taking_turn",
        "tenant",
        "wanted_by",
    )

    def __init__(self, admitted: Admitted, spec: PriorityClass, tenant: str) -> None:
        self.admitted = admitted
        self.spec = spec
        self.tenant = tenant
        self.started = time.monotonic()
        self.pauses = 0
        self.taking_turn = False  # paused, waiting for a slot again
        self.wanted_by: Ticket | None = None  # the queued request it is to pause for
        self.interrupt: Callable[[], None] = _nothing  # wakes its relay (set by the relay)

    @property
    def wanted(self) -> bool:
        """Whether the stream is to pause now: the request it is to pause for still waits."""
        ticket = self.wanted_by
        return ticket is not None and not ticket.future.done()

    @property
    def may_pause(self) -> bool:
        return self.pauses < self.spec.max_pauses and not self.taking_turn and not self.wanted

    def decline(self) -> None:
        """The stream cannot stop here (what it sent cannot be continued): it runs to its end,
        and the request it was to pause for waits for the next slot."""
        self.wanted_by = None
        self.pauses = self.spec.max_pauses

    async def take_turn(self) -> float:
        """Pause: hand the slot over, then wait for one in the stream's own class, ahead of its
        tenant's newer requests; the seconds it waited."""
        ticket, self.wanted_by = self.wanted_by, None
        self.pauses += 1
        admitted = self.admitted
        queue = admitted.hand_over(ticket)
        waited = admitted.waited
        self.taking_turn = True
        try:
            await admitted.requeue(queue, self.spec.name, self.tenant)
        finally:
            self.taking_turn = False
        self.started = time.monotonic()
        return admitted.waited - waited


class PausableStreams:
    """The streams of each pool that may be paused, and the choice of which one."""

    def __init__(self) -> None:
        self.pools: dict[str, list[PausableStream]] = {}

    def add(self, pool: str, stream: PausableStream) -> None:
        self.pools.setdefault(pool, []).append(stream)

    def discard(self, pool: str, stream: PausableStream) -> None:
        streams = self.pools.get(pool)
        if streams is not None and stream in streams:
            streams.remove(stream)

    @contextmanager
    def running(
        self, pool: str, admitted: Admitted, spec: PriorityClass | None, tenant: str
    ) -> Iterator[PausableStream | None]:
        """A stream of ``pool`` of class ``spec`` (None: one that cannot be continued
        elsewhere), pausable while the block runs if its class allows; None if not."""
        if spec is None or not spec.max_pauses:
            yield None
            return
        stream = PausableStream(admitted, spec, tenant)
        self.add(pool, stream)
        try:
            yield stream
        finally:
            self.discard(pool, stream)

    def pause_for(self, pool: str, ticket: Ticket, weight: float) -> PausableStream | None:
        """Ask the lightest, most recently started stream of ``pool`` whose class weighs less
        than ``weight`` and that may still pause to pause for ``ticket``; the one asked."""
        chosen: PausableStream | None = None
        for stream in self.pools.get(pool, ()):
            if stream.spec.weight >= weight or not stream.may_pause:
                continue
            if chosen is None or (stream.spec.weight, -stream.started) < (
                chosen.spec.weight,
                -chosen.started,
            ):
                chosen = stream
        if chosen is not None:
            chosen.wanted_by = ticket
            chosen.interrupt()
        return chosen
