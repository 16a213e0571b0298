"""Capacities measured from the engines' decode speed, for pools whose policy says
``capacity: measured`` (mixed hardware whose relative speed nobody wrote down).

Between two scrapes of an endpoint, the growth of its inter-token latency histogram
(``vllm:inter_token_latency_seconds``: how many gaps between a request's output tokens, and
their seconds in all) gives the mean gap of the tokens made meanwhile; its inverse is the
endpoint's decode speed, in tokens a second per running request. Each endpoint's speed is
smoothed over its scrapes (exponentially, ``SMOOTHING`` the weight of the newest); an
endpoint's capacity is its speed over the mean speed of the pool's measured endpoints, within
``BOUNDS``. An interval in which no token was made says nothing and is skipped, as is a
histogram that went back (a restarted engine). Until an endpoint has been measured it keeps
capacity 1.

A request's tokens also come slower as its endpoint's batch grows, so under load the measure
drifts from the hardware's ratio toward equal speed per request; at light load, where batches
are alike, it reads the hardware's ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import Endpoint

SMOOTHING = 0.3
BOUNDS = (0.1, 10.0)


class DecodeSpeeds:
    """Each endpoint's smoothed decode speed per running request, and the capacities they give."""

    def __init__(self) -> None:
        # address -> (token gaps, their seconds) at its last scrape
        self._last: dict[str, tuple[float, float]] = {}
        self.speeds: dict[str, float] = {}  # address -> output tokens a second per request

    def observe(self, endpoint: Endpoint, pool: Sequence[Endpoint]) -> None:
        """Take ``endpoint``'s latest metrics; set the capacity of each of ``pool``'s endpoints."""
        m = endpoint.metrics
        last = self._last.get(endpoint.address)
        self._last[endpoint.address] = (m.token_gaps, m.token_gap_seconds)
        if last is None:
            return
        gaps, seconds = m.token_gaps - last[0], m.token_gap_seconds - last[1]
        if gaps <= 0 or seconds <= 0:
            return
        speed = gaps / seconds
        old = self.speeds.get(endpoint.address)
        self.speeds[endpoint.address] = speed if old is None else old + SMOOTHING * (speed - old)
        self.apply(pool)

    def apply(self, pool: Sequence[Endpoint]) -> None:
        """Each of ``pool``'s endpoints' capacity: its speed over the measured ones' mean."""
        measured = [self.speeds[e.address] for e in pool if e.address in self.speeds]
        if not measured:
            return
        mean = sum(measured) / len(measured)
        low, high = BOUNDS
        for e in pool:
            speed = self.speeds.get(e.address)
            e.capacity = 1.0 if speed is None else min(max(speed / mean, low), high)
