"""Usage owed to the shared buckets and not yet sent: settlements (real usage minus the
estimate), and what the fallback admitted while the store was away. Added up per bucket, sent
in one call, and put back when that call fails, so an outage loses none of it.

Bounded by the number of buckets: past ``max_buckets`` a new bucket's usage is dropped (and
counted) rather than growing without end while the store stays away.
"""

from __future__ import annotations

import logging

from gateway.guards.limits.buckets import BucketSpec

log = logging.getLogger("kvgate.gateway")


class PendingUsage:
    def __init__(self, max_buckets: int = 100_000) -> None:
        self.max_buckets = max_buckets
        self.dropped = 0  # usage of buckets past the bound, never sent
        self._owed: dict[str, BucketSpec] = {}

    def __len__(self) -> int:
        return len(self._owed)

    def add(self, specs: list[BucketSpec]) -> None:
        """Owe each spec's cost to its bucket (negative: a refund)."""
        for spec in specs:
            owed = self._owed.get(spec.key)
            if owed is not None:
                self._owed[spec.key] = owed.costing(owed.cost + spec.cost)
            elif len(self._owed) < self.max_buckets:
                self._owed[spec.key] = spec
            else:
                if not self.dropped:
                    log.warning("over %d buckets owe usage: dropping the rest", self.max_buckets)
                self.dropped += 1

    def drain(self) -> list[BucketSpec]:
        """Everything owed, for one call to the store (``add`` it back if that fails)."""
        owed, self._owed = self._owed, {}
        return [spec for spec in owed.values() if spec.cost != 0]
