"""Priority weighted-fair admission queue, gated by pool capacity.

Under saturation each priority class is served in proportion to its weight (start-time fair
queueing): a class's next request starts at ``S = max(V, F_class)`` and finishes at
``S + 1 / weight``; the smallest start goes first and sets ``V``, so a class that was idle
cannot bank credit. Inside a class, tenants take turns (round robin over tenants with
queued requests), so a tenant sending ten times more gets the same share as the others.
A full class queue refuses at once (``QueueFull``, 429); a request that waits longer than its
class's ``max_wait`` is given up (``Expired``, 503); a client that goes away leaves the queue.
A request that queues may pause a lighter class's stream and take its slot
(``gateway.guards.pauses``). A request with a deadline (``gateway.guards.deadlines``) goes ahead
of its tenant's requests with later ones, and is refused (``DeadlineUnmet``, 429) as it arrives
when the class's expected wait runs past it, or when the deadline comes while it waits.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.base.errors import DeadlineUnmet, Expired, QueueFull
from gateway.guards.admission_gate import AdmissionGate
from gateway.guards.pauses import PausableStreams
from policies.schema import DEFAULT_CLASS, PriorityClass

POLL_INTERVAL = 0.02  # re-check gates that change without a release (metrics, saturation)
WAIT_SAMPLES = 8  # dispatches a pool's queue needs before its expected wait is trusted


@dataclass(eq=False)
class Ticket:
    pool: str
    cls: str
    tenant: str
    future: asyncio.Future[None]
    deadline: float = math.inf  # time.monotonic() by which it must start
    queued_at: float = field(default_factory=time.monotonic)


@dataclass
class _ClassQueue:
    spec: PriorityClass
    tenants: OrderedDict[str, deque[Ticket]] = field(default_factory=OrderedDict)
    size: int = 0
    finish: float = 0.0

    def push(self, ticket: Ticket, first: bool = False) -> None:
        """Queue ``ticket`` ahead of its tenant's requests with later deadlines (or of all of
        them: ``first``)."""
        queue = self.tenants.setdefault(ticket.tenant, deque())
        if first:
            queue.appendleft(ticket)
        elif not queue or queue[-1].deadline <= ticket.deadline:
            queue.append(ticket)
        else:
            at = len(queue) - 1
            while at > 0 and queue[at - 1].deadline > ticket.deadline:
                at -= 1
            queue.insert(at, ticket)
        self.size += 1

    def pop(self) -> Ticket:
        tenant, queue = next(iter(self.tenants.items()))
        ticket = queue.popleft()
        self.tenants.move_to_end(tenant)  # the next tenant's turn
        if not queue:
            del self.tenants[tenant]
        self.size -= 1
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        queue = self.tenants.get(ticket.tenant)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        if not queue:
            del self.tenants[ticket.tenant]
        self.size -= 1
        return True


class PoolQueue:
    def __init__(self, pool: str, classes: dict[str, PriorityClass]) -> None:
        self.pool = pool
        self.classes = {name: _ClassQueue(spec) for name, spec in classes.items()}
        self.virtual = 0.0
        self.interval = 0.0  # seconds between dispatches while requests wait (moving average)
        self.samples = 0
        self.last_dispatch = 0.0  # when the last one left, or requests began to wait

    def dispatched(self, now: float) -> None:
        """A waiting request left the queue at ``now``: the interval since the last one."""
        interval = now - self.last_dispatch
        self.interval = interval if not self.samples else 0.8 * self.interval + 0.2 * interval
        self.samples += 1
        self.last_dispatch = now

    def expected_wait(self, queue: _ClassQueue) -> float | None:
        """Seconds a request that joins ``queue`` now can expect to wait (its class's share of
        the dispatches, behind every request queued in it); None before ``WAIT_SAMPLES``."""
        if self.samples < WAIT_SAMPLES:
            return None
        weights = sum([q.spec.weight for q in self.classes.values() if q.size or q is queue])
        return (queue.size + 1) * self.interval * weights / queue.spec.weight

    @property
    def empty(self) -> bool:
        for queue in self.classes.values():  # noqa: SIM110 (asked twice per request: no generator)
            if queue.size:
                return False
        return True

    def next_ticket(self) -> Ticket | None:
        """Start-time fair queueing over classes: smallest start tag, then smallest finish."""
        best: tuple[float, float, _ClassQueue] | None = None
        for queue in self.classes.values():
            if queue.size:
                start = max(self.virtual, queue.finish)
                finish = start + 1.0 / queue.spec.weight
                if best is None or (start, finish) < best[:2]:
                    best = (start, finish, queue)
        if best is None:
            return None
        start, finish, queue = best
        self.virtual, queue.finish = start, finish
        return queue.pop()


class AdmissionQueue:
    """Per-pool queues of waiting requests, served weighted-fair by priority class while the pool's
    capacity gate is closed."""

    def __init__(self, classes: dict[str, PriorityClass], gate: AdmissionGate) -> None:
        self.classes = classes
        self.gate = gate
        self.pools: dict[str, PoolQueue] = {}
        self.streams = PausableStreams()
        self._pollers: dict[str, asyncio.Task[None]] = {}

    def update(self, classes: dict[str, PriorityClass], gate: AdmissionGate) -> None:
        """A reloaded policy: new weights and bounds apply to the next dispatch; queued
        requests stay queued (in the default class if theirs was removed)."""
        self.classes = classes
        self.gate = gate
        for queue in self.pools.values():
            old = queue.classes
            queue.classes = {
                name: old.get(name) or _ClassQueue(spec) for name, spec in classes.items()
            }
            for name, class_queue in queue.classes.items():
                class_queue.spec = classes[name]
            fallback = queue.classes.get(DEFAULT_CLASS) or next(iter(queue.classes.values()))
            for name, class_queue in old.items():
                if name not in classes:
                    while class_queue.size:
                        fallback.push(class_queue.pop())
        for pool in self.pools:
            self._dispatch(pool)

    def class_of(self, name: str | None) -> PriorityClass:
        return (
            self.classes.get(name or DEFAULT_CLASS)
            or self.classes.get(DEFAULT_CLASS)
            or next(iter(self.classes.values()))
        )

    def depth(self, pool: str, cls: str) -> int:
        queue = self.pools.get(pool)
        return queue.classes[cls].size if queue and cls in queue.classes else 0

    def classify(self, identity_class: str | None, objective_class: str | None) -> PriorityClass:
        """A request's class: its identity's, or its objective's when that one is lighter (an
        objective never makes a request heavier)."""
        cls = self.class_of(identity_class)
        if objective_class:
            lighter = self.classes.get(objective_class)
            if lighter is not None and lighter.weight <= cls.weight:
                return lighter
        return cls

    def try_enter(self, pool: str) -> Admitted | None:
        """A slot in ``pool`` now if nobody is queued and there is capacity (the common case,
        without a coroutine), else None."""
        queue = self.pools.get(pool)
        if (queue is None or queue.empty) and self.gate.has_room(pool):
            self.gate.acquire(pool)
            return Admitted(self, pool, 0.0)
        return None

    async def enter(
        self,
        pool: str,
        cls_name: str | None,
        tenant: str,
        first: bool = False,
        deadline: float = math.inf,
    ) -> Admitted:
        """A slot in ``pool``, waiting in ``cls_name``'s queue (tenants taking turns; ahead of
        the tenant's other requests if ``first``, else of those with later deadlines) while
        there is none, until ``deadline`` (``time.monotonic()``) at the latest; a lighter
        class's stream may be paused for it."""
        spec = self.class_of(cls_name)
        admitted = self.try_enter(pool)
        if admitted is not None:
            return admitted
        queue = self.pools.get(pool)
        if queue is None:
            queue = self.pools[pool] = PoolQueue(pool, self.classes)
        if queue.empty:
            queue.last_dispatch = time.monotonic()  # requests begin to wait
        class_queue = self._room_in(queue, spec, deadline)
        future = asyncio.get_running_loop().create_future()
        ticket = Ticket(pool, spec.name, tenant, future, deadline)
        class_queue.push(ticket, first)
        if self.streams.pools.get(pool):
            self.streams.pause_for(pool, ticket, spec.weight)
        self._ensure_poller(pool)
        patience = min(spec.max_wait, deadline - ticket.queued_at)
        try:
            async with asyncio.timeout(patience):
                await ticket.future
        except TimeoutError as exc:
            class_queue.remove(ticket)
            if patience < spec.max_wait:
                raise DeadlineUnmet(
                    f"Not started by its deadline ({patience:.3g}s) in the {spec.name} queue.",
                    headers={"retry-after": "1"},
                ) from exc
            raise Expired(
                f"Waited {spec.max_wait:g}s in the {spec.name} queue; the pool is saturated."
            ) from exc
        except asyncio.CancelledError:
            if not class_queue.remove(ticket) and ticket.future.done():
                self.done(pool)  # dispatched just as the client left: give the slot back
            raise
        return Admitted(self, pool, time.monotonic() - ticket.queued_at)

    @staticmethod
    def _room_in(queue: PoolQueue, spec: PriorityClass, deadline: float) -> _ClassQueue:
        """``spec``'s queue of ``queue``, if a request may join it: QueueFull when it is full,
        DeadlineUnmet when the expected wait runs past ``deadline``."""
        class_queue = queue.classes[spec.name]
        if class_queue.size >= spec.max_queue:
            raise QueueFull(
                f"The {spec.name} queue is full; retry later.", headers={"retry-after": "1"}
            )
        if deadline != math.inf:
            wait = queue.expected_wait(class_queue)
            if wait is not None and time.monotonic() + wait > deadline:
                raise DeadlineUnmet(
                    f"The {spec.name} queue's expected wait ({wait:.3g}s) runs past the "
                    "request's deadline; retry later.",
                    headers={"retry-after": str(max(1, math.ceil(wait)))},
                )
        return class_queue

    def done(self, pool: str) -> None:
        """A slot of ``pool`` came back (``Admitted.release``): it may go to the next in line."""
        self.gate.release(pool)
        queue = self.pools.get(pool)
        if queue is not None and not queue.empty:
            self._dispatch(pool)

    def hand_over(self, pool: str, ticket: Ticket | None) -> None:
        """A slot of ``pool`` goes straight to ``ticket`` if it still waits (the gates keep
        their counts), else back to the pool (``done``)."""
        queue = self.pools.get(pool)
        if ticket is None or ticket.future.done() or queue is None:
            self.done(pool)
            return
        class_queue = queue.classes.get(ticket.cls)
        if class_queue is not None:
            class_queue.remove(ticket)
        ticket.future.set_result(None)

    def _dispatch(self, pool: str) -> None:
        queue = self.pools.get(pool)
        while queue is not None and not queue.empty and self.gate.has_room(pool):
            ticket = queue.next_ticket()
            if ticket is None:
                return
            if ticket.future.done():  # cancelled meanwhile
                continue
            self.gate.acquire(pool)
            queue.dispatched(time.monotonic())
            ticket.future.set_result(None)

    def _ensure_poller(self, pool: str) -> None:
        task = self._pollers.get(pool)
        if task is None or task.done():
            self._pollers[pool] = asyncio.create_task(self._poll(pool))

    async def _poll(self, pool: str) -> None:
        queue = self.pools[pool]
        while not queue.empty:
            self._dispatch(pool)
            await asyncio.sleep(POLL_INTERVAL)


class Admitted:
    """A request's slot in a pool, from its admission (``AdmissionQueue.try_enter`` or
    ``enter``) to its release: the one owner of both, as ``Attempt`` is of a try (a plain
    slots class: one is made per request)."""

    __slots__ = ("_queue", "pool", "waited")

    def __init__(self, queue: AdmissionQueue, pool: str, waited: float) -> None:
        self._queue: AdmissionQueue | None = queue
        self.pool = pool
        self.waited = waited  # seconds spent queued

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        queue = self._queue
        if queue is not None:
            self._queue = None
            queue.done(self.pool)

    def hand_over(self, ticket: Ticket | None) -> AdmissionQueue:
        """Give the slot to ``ticket`` if it still waits, else back (``requeue`` gets one
        again); the queue it came from."""
        queue = self._queue
        assert queue is not None, "a released slot cannot be handed over"
        self._queue = None
        queue.hand_over(self.pool, ticket)
        return queue

    async def requeue(self, queue: AdmissionQueue, cls: str, tenant: str) -> None:
        """Wait in ``cls``'s queue of ``queue``, ahead of the tenant's other requests, for a
        slot that this one then holds."""
        again = await queue.enter(self.pool, cls, tenant, first=True)
        again._queue = None  # this one holds it now
        self._queue = queue
        self.waited += again.waited


class QueueCollector(Collector):
    """Admission queue depth by pool and class, read at scrape time (this worker's queue)."""

    def __init__(self, admission: AdmissionQueue) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kvgate_queue_depth", "Requests waiting for capacity.", labels=["pool", "class"]
        )
        for pool, queue in self.admission.pools.items():
            for name, class_queue in queue.classes.items():
                gauge.add_metric([pool, name], float(class_queue.size))
        yield gauge
