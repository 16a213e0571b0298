"""Token-bucket arithmetic and the in-memory store.

A bucket holds at most ``capacity`` units and refills at ``capacity / 60`` per second (a
per-minute limit with a burst of one minute's worth). A take of several buckets is all or
nothing. A *forced* take (settling a response's real usage) always applies, and may leave a
bucket below zero: the debt blocks later requests until it is refilled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BucketSpec:
    key: str
    capacity: float  # units per minute, also the burst
    cost: float  # units this request takes (negative: a refund)

    @property
    def rate(self) -> float:
        """Refill per second."""
        return self.capacity / 60.0


@dataclass(frozen=True, slots=True)
class TakeResult:
    allowed: bool
    retry_after: float  # seconds until every bucket could pay (0 when allowed)
    remaining: tuple[float, ...]  # per bucket, after the take
    at: float = 0.0  # the store's clock when it took (orders answers that arrive out of order)


def refill(tokens: float, last: float, now: float, spec: BucketSpec) -> float:
    return min(spec.capacity, tokens + max(0.0, now - last) * spec.rate)


def reset_seconds(remaining: float, spec: BucketSpec) -> float:
    """Seconds until the bucket is full again."""
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
        scaled = [BucketSpec(s.key, s.capacity / self.share, s.cost) for s in specs]
        levels = []
        wait = 0.0
        for spec in scaled:
            tokens, last = self.state.get(spec.key, (spec.capacity, now))
            tokens = refill(tokens, last, now, spec)
            levels.append(tokens)
            if spec.cost > 0 and tokens < spec.cost:
                wait = max(wait, (spec.cost - tokens) / spec.rate)
        allowed = force or wait == 0.0
        remaining = []
        for spec, tokens in zip(scaled, levels, strict=True):
            if allowed:
                tokens -= spec.cost
            self.state[spec.key] = (min(tokens, spec.capacity), now)
            remaining.append(tokens)
        return TakeResult(allowed, 0.0 if allowed else wait, tuple(remaining), now)
