"""Prometheus metrics of the endpoint picker."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from epp.datalayer.indexes.precise import KVEventHooks

PICK_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class EppMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        self._declare_picks(r)
        self._declare_index(r)
        self._declare_sources(r)

    def _declare_picks(self, r: CollectorRegistry) -> None:
        """What the picker decides: picks, refusals, the prefix index, work in flight."""
        self.pick_latency = Histogram(
            "kvgate_epp_pick_duration_seconds",
            "Time to schedule one request.",
            ["pool"],
            buckets=PICK_BUCKETS,
            registry=r,
        )
        self.ttft_prediction_error = Histogram(
            "kvgate_epp_ttft_prediction_error",
            "How far the latency model's predicted TTFT was from the actual one, as a share of "
            "the actual: |predicted - actual| / actual (a latency-scorer's model).",
            ["pool"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0),
            registry=r,
        )
        self.decisions = Counter(
            "kvgate_epp_decisions",
            "Picks by the scorer that decided them.",
            ["pool", "winner"],
            registry=r,
        )
        self.warm_diverted = Counter(
            "kvgate_epp_warm_diverted",
            "Picks that passed over an endpoint holding more of the prompt (by at least the "
            "prefix index's min_match_blocks) that the filters had kept: cold misses the "
            "scores chose, not overload.",
            ["pool"],
            registry=r,
        )
        self.cross_zone_picks = Counter(
            "kvgate_epp_cross_zone_picks",
            "Requests sent to an endpoint labelled with another zone than the picker's (epp.zone):"
            " where they went, the first choice skipped by a breaker or a refusal or not.",
            ["pool"],
            registry=r,
        )
        self.rejections = Counter(
            "kvgate_epp_rejections",
            "Requests the picker refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.tokens_in_flight = Gauge(
            "kvgate_epp_tokens_in_flight",
            "Tokens of work this picker sent to the endpoint that are not done: phase prefill, "
            "prompt tokens not cached there whose first token has not come back; phase decode, "
            "output tokens still owed (the requests' output limits).",
            ["endpoint", "phase"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def _declare_index(self, r: CollectorRegistry) -> None:
        """What the prefix index holds, and believes each cache holds."""
        self.index_blocks = Gauge(
            "kvgate_epp_prefix_index_blocks",
            "Prefix blocks the index holds, by endpoint.",
            ["endpoint"],
            registry=r,
            # every worker's index holds the same picks (they exchange them): one count, not N
            multiprocess_mode="livemax",
        )
        self.index_capacity = Gauge(
            "kvgate_epp_prefix_index_capacity_blocks",
            "Prefix blocks the index believes the endpoint's KV cache holds (its LRU's size): "
            "the scraped KV capacity in tokens, times the characters per token its answers "
            "showed, in index blocks.",
            ["endpoint"],
            registry=r,
            multiprocess_mode="livemax",
        )

        self.endpoint_capacity = Gauge(
            "kvgate_epp_endpoint_capacity",
            "The load the endpoint carries against one of capacity 1: the policy's, or measured "
            "from its decode speed (a pool's `capacity: measured`).",
            ["endpoint"],
            registry=r,
            multiprocess_mode="livemax",
        )

    def _declare_sources(self, r: CollectorRegistry) -> None:
        """Where its view comes from: scrapes, KV events, the picks replicas share, tokens
        seen in responses."""
        self.scrape_errors = Counter(
            "kvgate_epp_scrape_errors", "Failed metric scrapes.", ["endpoint"], registry=r
        )
        self.scrapes = Counter(
            "kvgate_epp_scrapes",
            "Successful metric scrapes (their rate follows the picks: epp.scrape_interval while "
            "loaded by others or near saturation and read, scrape_idle_interval to "
            "scrape_quiet_interval otherwise).",
            ["endpoint"],
            registry=r,
        )
        self.event_lag = Histogram(
            "kvgate_epp_kv_event_lag_seconds",
            "Delay between a KV event batch and its handling.",
            buckets=PICK_BUCKETS,
            registry=r,
        )
        self.kv_events_unusable = Counter(
            "kvgate_epp_kv_events_unusable",
            "KV-event messages or events that taught the precise index nothing, by reason: "
            "malformed or undecodable messages (an engine whose event format changed), "
            "unkeyed stores (blocks chained on a parent the index never saw).",
            ["endpoint", "reason"],
            registry=r,
        )
        self.kv_event_resets = Counter(
            "kvgate_epp_kv_event_resets",
            "Times the precise index forgot all it knew of an endpoint's cache, by reason: "
            "gap (event batches lost), restart (sequence numbers started again), cleared (the "
            "engine cleared its cache).",
            ["endpoint", "reason"],
            registry=r,
        )
        self.shared_view_up = Gauge(
            "kvgate_epp_shared_view_up",
            "1 while the picks shared with the other replicas (epp.replicas) flow, 0 while "
            "this replica routes on its own picks only (the store unreachable).",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.shared_picks = Counter(
            "kvgate_epp_shared_picks",
            "Picks shared with the other replicas, by event: sent, received (the others', "
            "caught up on at start included), dropped (not sent: the store was unreachable "
            "while more than the queue holds were made).",
            ["event"],
            registry=r,
        )
        self.tokens = Counter(
            "kvgate_epp_tokens",
            "Tokens seen in responses, by direction.",
            ["direction"],
            registry=r,
        )

    def child(self, metric: Counter | Histogram, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once: for what is counted on every request
        (prometheus_client's lookup takes a lock and builds a key each time)."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def scraped(self, endpoint: str) -> None:
        """Count a successful scrape of ``endpoint`` (several a second each: its counter is
        looked up once)."""
        self.child(self.scrapes, endpoint).inc()

    def shared_view(
        self, up: bool, counts: tuple[int, int, int], last: tuple[int, int, int]
    ) -> tuple[int, int, int]:
        """The shared view's state and its (sent, received, dropped) counts, counted since
        ``last``; returns what to pass as ``last`` next time."""
        self.shared_view_up.set(1 if up else 0)
        for event, now, before in zip(("sent", "received", "dropped"), counts, last, strict=True):
            if now > before:
                self.shared_picks.labels(event).inc(now - before)
        return counts

    def kv_event_hooks(self) -> KVEventHooks:
        """The precise index's hooks, counting into these metrics."""
        return KVEventHooks(
            lag=self.event_lag.observe,
            unusable=lambda endpoint, reason: self.kv_events_unusable.labels(
                endpoint, reason
            ).inc(),
            reset=lambda endpoint, reason: self.kv_event_resets.labels(endpoint, reason).inc(),
        )


def exposition(registry: CollectorRegistry) -> bytes:
    """``registry``'s samples in the text format; with ``--workers N`` (``PROMETHEUS_MULTIPROC_DIR``
    set) every worker's samples instead, as the workers write them to that directory."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)
