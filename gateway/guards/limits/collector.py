"""The rate limiter's state as metrics, read at scrape time: the store's health, the fallback's
decisions, the usage owed to the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.guards.limits.limiter import Limiter

LIMITER_STATES = ("ok", "degraded", "down")


class LimiterCollector(Collector):
    """The rate limiter's store state and fallback counts, read at scrape time (this worker's
    limiter of the current policy)."""

    def __init__(self, limiter: Callable[[], Limiter]) -> None:
        self.limiter = limiter

    def collect(self) -> Iterator[Metric]:
        limiter = self.limiter()
        state = GaugeMetricFamily(
            "kvgate_limiter_state",
            "1 for the limiter's state: ok, degraded (Redis down, enforcing this replica's "
            "share locally) or down (fail_closed, refusing).",
            labels=["state"],
        )
        for name in LIMITER_STATES:
            state.add_metric([name], 1.0 if limiter.status == name else 0.0)
        yield state
        errors = CounterMetricFamily(
            "kvgate_limiter_store_errors", "Calls to the limit store that failed or timed out."
        )
        errors.add_metric([], float(limiter.store_errors))
        yield errors
        fallback = CounterMetricFamily(
            "kvgate_limiter_fallback_decisions",
            "Requests the local fallback buckets decided while the store could not be reached.",
        )
        fallback.add_metric([], float(limiter.fallback_decisions))
        yield fallback
        pending = GaugeMetricFamily(
            "kvgate_limiter_pending_buckets",
            "Buckets whose usage (settlements, fallback admissions) waits to be sent to the store.",
        )
        pending.add_metric([], float(len(limiter.pending)))
        yield pending
        dropped = CounterMetricFamily(
            "kvgate_limiter_usage_dropped",
            "Usage never sent to the store: buckets past the pending bound.",
        )
        dropped.add_metric([], float(limiter.pending.dropped))
        yield dropped
