"""Saturation: an endpoint is saturated when its waiting queue (at a threshold times its
capacity) or KV usage is at a threshold, or its metrics are stale (GIE's utilization detector:
5 waiting, 80% KV, 200 ms by default; the policy's ``epp.saturation``).

The queue counts the requests this picker sent since the last scrape too (those not over yet:
one that is over queues nowhere), so a burst that arrives between two scrapes cannot pile onto
one endpoint (the hot-spotting that users of GIE, llm-d and SGLang report when one prefix is
hot), while a steady stream of short requests does not add up to a queue between scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from epp.framework import Endpoint
from policies.schema import Saturation


class SaturationDetector:
    """Applies the policy's ``epp.saturation`` thresholds; one instance per EPP service, shared
    by the saturation filter, the gateway's admission gate and ext_proc's shedding."""

    def __init__(self, thresholds: Saturation | None = None) -> None:
        self.thresholds = thresholds or Saturation()

    def unsaturated(self, endpoints: list[Endpoint], now: float) -> list[Endpoint]:
        """The endpoints that are not saturated: fresh metrics (scraped at most
        ``max_metrics_age`` ago, plus the scraper's grace for an idle endpoint), a queue
        (waiting, and dispatched since and not over) under ``queue_depth`` and KV usage under
        ``kv_usage``.
        Written as one comprehension: it runs for every endpoint of every pick."""
        t = self.thresholds
        oldest, depth, kv = now - t.max_metrics_age, t.queue_depth, t.kv_usage
        return [
            e
            for e in endpoints
            if (m := e.metrics).scraped_at
            and m.scraped_at >= oldest - e.metrics_grace
            and m.waiting + e.load.dispatched < depth * e.capacity
            and m.kv_usage < kv
        ]

    def all_saturated(self, endpoints: Iterable[Endpoint]) -> bool:
        """The capacity gate's question: may the pool take another request now?"""
        return not self.unsaturated(list(endpoints), time.monotonic())
