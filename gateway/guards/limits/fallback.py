"""The limits this replica enforces alone while the shared store cannot be reached.

Each bucket is this replica's share (``share``: workers times replicas) of the shared limit, and
starts from that share of the level the shared store last reported for it, refilled since: a
bucket the outage finds empty is not handed a full minute. A bucket the store answers for again
is forgotten, so the next outage starts from the store's newer level. A level of a bucket that
refills is forgotten a minute after it was reported (it has refilled by then); one that never
refills (a spend budget) is kept past its calendar period.

``seeds`` projects the last reported levels to now, for a shared store that lost its buckets (a
restarted Redis) to start from.
"""

from __future__ import annotations

import time

from gateway.guards.limits.buckets import BucketSpec, MemoryStore, TakeResult, refill

FORGET_AFTER = 60.0  # seconds: a level reported this long ago has refilled to full
FORGET_KEPT_AFTER = 32 * 86400.0  # seconds: past the calendar period of any budget


class FallbackBuckets:
    def __init__(self, share: int) -> None:
        self.memory = MemoryStore(share=share)
        # key -> (level, monotonic time here, the store's time): the newest answer the store
        # gave, by its clock (concurrent answers can arrive out of order)
        self._levels: dict[str, tuple[float, float, float]] = {}
        self._kept: set[str] = set()  # keys of buckets that never refill
        self._pruned_at = time.monotonic()

    def observe(self, specs: list[BucketSpec], result: TakeResult, now: float) -> None:
        """The shared store answered for these buckets with these levels."""
        state = self.memory.state
        levels = self._levels
        for spec, level in zip(specs, result.remaining, strict=True):
            seen = levels.get(spec.key)
            # the newest by the store's clock; within one tick of it, the lower level (a take
            # only lowers it, and no time passed to refill it)
            if seen is None or seen[2] < result.at or (seen[2] == result.at and level <= seen[0]):
                levels[spec.key] = (level, now, result.at)
                if seen is None and spec.rate <= 0:
                    self._kept.add(spec.key)
            if state:  # empty unless the store was away
                state.pop(spec.key, None)
        if now - self._pruned_at > FORGET_AFTER:
            self._prune(now)

    def seeds(self, specs: list[BucketSpec], now: float) -> list[float | None]:
        """Each bucket's level as last reported and refilled to now (None: never reported)."""
        seeds: list[float | None] = []
        for spec in specs:
            seen = self._levels.get(spec.key)
            seeds.append(None if seen is None else refill(seen[0], seen[1], now, spec))
        return seeds

    def take(self, specs: list[BucketSpec], now: float, *, force: bool = False) -> TakeResult:
        """Take from this replica's share, each bucket seeded as the module says."""
        state, share = self.memory.state, self.memory.share
        for spec in specs:
            seen = self._levels.get(spec.key)
            if spec.key not in state and seen is not None:
                state[spec.key] = (seen[0] / share, seen[1])
        return self.memory.take_now(specs, now, force=force)

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        kept = self._kept
        old = [
            key
            for key, (_, at, _) in self._levels.items()
            if now - at > (FORGET_KEPT_AFTER if key in kept else FORGET_AFTER)
        ]
        for key in old:
            del self._levels[key]
            kept.discard(key)
