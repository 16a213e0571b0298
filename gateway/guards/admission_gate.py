"""Admission gates: may a pool take another request now (its concurrency limit, its engines'
saturation)? The admission queue asks before it dispatches, and is told when room may have
come back. Not an endpoint's capacity, which is its relative speed (``EndpointSpec.capacity``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from epp.framework import Endpoint
from epp.scheduling.saturation import SaturationDetector


class AdmissionGate(Protocol):
    """Whether a pool may take another request now; told of each dispatch and release."""

    def has_room(self, pool: str) -> bool:
        """True if one more request may be dispatched to ``pool`` now."""
        ...

    def acquire(self, pool: str) -> None:
        """A request was dispatched to ``pool``."""
        ...

    def release(self, pool: str) -> None:
        """A request of ``pool`` finished."""
        ...


class ConcurrencyGate:
    """At most ``limits[pool]`` requests in flight per pool (pools without a limit: no cap).

    ``carried``: the in-flight counts of the gate this one replaces (a reload): requests
    admitted before it release against this gate, and a changed limit applies to them."""

    def __init__(
        self, limits: dict[str, int | None], carried: dict[str, int] | None = None
    ) -> None:
        self.limits = limits
        self.in_flight = {pool: (carried or {}).get(pool, 0) for pool in limits}

    def has_room(self, pool: str) -> bool:
        limit = self.limits.get(pool)
        return limit is None or self.in_flight.get(pool, 0) < limit

    def acquire(self, pool: str) -> None:
        self.in_flight[pool] = self.in_flight.get(pool, 0) + 1

    def release(self, pool: str) -> None:
        self.in_flight[pool] = max(0, self.in_flight.get(pool, 0) - 1)


class SaturationGate:
    """No capacity while every live scraped endpoint of the pool is saturated (the EPP's view).

    Endpoints never scraped are unknown, not saturated: a pool whose servers expose no metrics
    is never held back by this gate. Endpoints whose scrapes keep failing are dead, not
    saturated: a pool with none alive is not held back either (its requests fail at once).
    ``on_read`` is told each time the gate holds a pool back (the scraper then keeps that
    pool's metrics fresh, as it does for picks).
    """

    def __init__(
        self,
        endpoints: Callable[[str], list[Endpoint]],
        detector: SaturationDetector,
        on_read: Callable[[], None] = lambda: None,
    ) -> None:
        self.endpoints = endpoints
        self.detector = detector
        self.on_read = on_read

    def has_room(self, pool: str) -> bool:
        known = [e for e in self.endpoints(pool) if e.metrics.scraped_at and e.healthy]
        if not known or not self.detector.all_saturated(known):
            return True
        self.on_read()
        return False

    def acquire(self, pool: str) -> None:
        return None

    def release(self, pool: str) -> None:
        return None


def in_flight_counts(gate: AdmissionGate | None) -> dict[str, int]:
    """The per-pool in-flight counts that ``gate`` (or a gate it combines) keeps."""
    if isinstance(gate, ConcurrencyGate):
        return dict(gate.in_flight)
    if isinstance(gate, AllGates):
        counts: dict[str, int] = {}
        for inner in gate.gates:
            counts.update(in_flight_counts(inner))
        return counts
    return {}


class AllGates:
    """Capacity only when every gate agrees."""

    def __init__(self, *gates: AdmissionGate) -> None:
        self.gates = gates

    def has_room(self, pool: str) -> bool:
        return all(g.has_room(pool) for g in self.gates)

    def acquire(self, pool: str) -> None:
        for gate in self.gates:
            gate.acquire(pool)

    def release(self, pool: str) -> None:
        for gate in self.gates:
            gate.release(pool)
