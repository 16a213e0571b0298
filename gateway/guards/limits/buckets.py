"""Token-bucket arithmetic and the in-memory store.

A bucket holds at most ``capacity`` units and refills at ``capacity / period`` per second (a
per-minute limit, ``period`` 60, with a burst of one minute's worth); a bucket whose ``period``
is infinite never refills (a spend budget, whose key names its calendar day or month). A take
of several buckets is all or nothing. A *forced* take (settling a response's real usage) always
applies, and may leave a bucket below zero: the debt blocks later requests until it is refilled.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class BucketSpec:
    key: str
    capacity: float  # units per period, also the burst
    cost: float  # units this request takes (negative: a refund)
    period: float = 60.0  # seconds an empty bucket takes to fill; math.inf: it never does
    ttl: int = 120  # seconds a shared store keeps a bucket nobody took from

    @property
    def rate(self) -> float:
        """Refill per second."""
        return self.capacity / self.period

    def costing(self, cost: float) -> BucketSpec:
        """This bucket, taking ``cost`` instead."""
        return replace(self, cost=cost)

    def wait(self, level: float) -> float:
        """Seconds until the bucket at ``level`` holds this spec's cost (``math.inf``: never)."""
        if level >= self.cost:
            return 0.0
        return (self.cost - level) / self.rate if self.rate > 0 else math.inf


@dataclass(frozen=True, slots=True)
class TakeResult:
    allowed: bool
    retry_after: float  # seconds until every bucket could pay (0 when allowed)
    remaining: tuple[float, ...]  # per bucket, after the take
    at: float = 0.0  # the store's clock when it took (orders answers that arrive out of order)


def refill(tokens: float, last: float, now: float, spec: BucketSpec) -> float:
    return min(spec.capacity, tokens + max(0.0, now - last) * spec.rate)


def reset_seconds(remaining: float, spec: BucketSpec) -> float:
    """Seconds until the bucket is full again (``math.inf``: it never refills)."""
    if spec.rate <= 0:
        return math.inf if remaining < spec.capacity else 0.0
    return max(0.0, (spec.capacity - remaining) / spec.rate)


class MemoryStore:
    """Buckets in this process; ``share`` divides every capacity (workers or replicas)."""

    def __init__(self, share: int = 1) -> None:
        self.share = max(1, share)
        # key -> (tokens, last refill): tokens of this share, not of the whole limit
        self.state: dict[str, tuple[float, float]] = {}

    async def take(self, specs: list[BucketSpec], *, force: bool = False) -> TakeResult:
        return self.take_now(specs, time.monotonic(), force=force)

    def take_now(self, specs: list[BucketSpec], now: float, *, force: bool = False) -> TakeResult:
        share = self.share
        scaled = specs if share == 1 else [replace(s, capacity=s.capacity / share) for s in specs]
        levels = []
        wait = 0.0
        for spec in scaled:
            tokens, last = self.state.get(spec.key, (spec.capacity, now))
            tokens = refill(tokens, last, now, spec)
            levels.append(tokens)
            if spec.cost > 0:
                wait = max(wait, spec.wait(tokens))
        allowed = force or wait == 0.0
        remaining = []
        for spec, tokens in zip(scaled, levels, strict=True):
            if allowed:
                tokens -= spec.cost
            self.state[spec.key] = (min(tokens, spec.capacity), now)
            remaining.append(tokens)
        return TakeResult(allowed, 0.0 if allowed else wait, tuple(remaining), now)
