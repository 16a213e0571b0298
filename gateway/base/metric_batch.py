"""Per-request metric updates added up in plain dicts, moved into prometheus_client in batches.

A prometheus_client update takes a lock and, with ``--workers N``, writes to a memory-mapped
file; a request makes about ten of them. Here a request costs a dict lookup and an addition per
update; ``flush`` moves the sums into the real metrics (one update per label set), before
every scrape of this worker and every ``FLUSH_INTERVAL`` seconds (so with several workers,
another worker's samples are at most that old).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from itertools import repeat
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

FLUSH_INTERVAL = 0.5


class BatchedCounter:
    """Increments of a Counter (or deltas of a Gauge) by label values."""

    __slots__ = ("metric", "pending")

    def __init__(self, metric: Counter | Gauge) -> None:
        self.metric = metric
        self.pending: dict[tuple[str, ...], float] = {}

    def add(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        pending = self.pending
        pending[labels] = pending.get(labels, 0.0) + amount

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        for labels, amount in pending.items():
            if amount:
                self.metric.labels(*labels).inc(amount)


class BatchedHistogram:
    """Observations of a Histogram by label values: counts per bucket and the sum."""

    __slots__ = ("bounds", "metric", "pending")

    def __init__(self, metric: Histogram, buckets: tuple[float, ...]) -> None:
        self.metric = metric
        self.bounds = [*buckets, float("inf")]
        self.pending: dict[tuple[str, ...], list[float]] = {}

    def observe_many(self, labels: tuple[str, ...], values: list[float]) -> None:
        """Observe each of ``values`` (bucketed in one pass, one lookup for all)."""
        entry = self.pending.get(labels)
        if entry is None:
            entry = self.pending[labels] = [0.0] * (len(self.bounds) + 1)
        for bucket, count in Tally(map(bisect_left, repeat(self.bounds), values)).items():
            entry[bucket] += count  # the first bucket with value <= bound
        entry[-1] += sum(values)

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        for labels, entry in pending.items():
            _add_observations(self.metric.labels(*labels), entry)


def _add_observations(child: Any, entry: list[float]) -> None:
    """Add bucket counts and a sum to a histogram child, as that many ``observe`` calls would.

    prometheus_client has no public call for this; ``tests/gateway/base/test_metric_batch.py``
    checks the result against plain ``observe`` calls, so a change of its internals shows.
    """
    child._sum.inc(entry[-1])
    for index, count in enumerate(entry[:-1]):
        if count:
            child._buckets[index].inc(count)
