"""Saturation: an endpoint is saturated when its waiting queue or KV usage is at a threshold,
or its metrics are stale (GIE's utilization detector: 5 waiting, 80% KV, 200 ms)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from epp.framework import Endpoint


@dataclass(frozen=True)
class SaturationThresholds:
    queue_depth: int = 5
    kv_usage: float = 0.8
    max_metrics_age: float = 0.2  # seconds


class SaturationDetector:
    def __init__(self, thresholds: SaturationThresholds | None = None) -> None:
        self.thresholds = thresholds or SaturationThresholds()

    def is_saturated(self, endpoint: Endpoint, now: float | None = None) -> bool:
        t, m = self.thresholds, endpoint.metrics
        return (
            m.age(now) > t.max_metrics_age or m.waiting >= t.queue_depth or m.kv_usage >= t.kv_usage
        )

    def all_saturated(self, endpoints: Iterable[Endpoint]) -> bool:
        """The capacity gate's question: may the pool take another request now?"""
        now = time.monotonic()
        return all(self.is_saturated(e, now) for e in endpoints)
