"""The KV transfer's Prometheus metrics (on the backend's ``/metrics``)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PdMetrics:
    """Bytes and blocks moved, transfer times, held blocks and lapsed leases."""

    def __init__(self, registry: CollectorRegistry, held_blocks: Callable[[], int]) -> None:
        self.bytes = Counter(
            "kvgate:kv_transfer_bytes",
            "KV bytes moved between prefill and decode workers.",
            ["direction"],
            registry=registry,
        )
        self.blocks = Counter(
            "kvgate:kv_transfer_blocks",
            "KV blocks moved between prefill and decode workers.",
            ["direction"],
            registry=registry,
        )
        self.seconds = Histogram(
            "kvgate:kv_transfer_seconds",
            "Time to pull one request's KV blocks (decode side) or stream them (prefill side).",
            ["direction"],
            buckets=TRANSFER_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "kvgate:kv_transfer_failures",
            "Pulls that failed (the decode worker then computes the prompt itself).",
            ["reason"],
            registry=registry,
        )
        self.lease_expiries = Counter(
            "kvgate:kv_lease_expiries",
            "Held requests whose lease lapsed before a decode worker pulled them.",
            registry=registry,
        )
        self.prefill_hops = Counter(
            "kvgate:prefill_hops",
            "Prefill hops a decode worker ran for a prefiller header (llm-d's flow), by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.held = Gauge(
            "kvgate:kv_blocks_held",
            "KV blocks held for decode workers (prefill side).",
            registry=registry,
        )
        self.held.set_function(lambda: float(held_blocks()))

    def moved(self, direction: str, num_blocks: int, num_bytes: int, seconds: float) -> None:
        self.blocks.labels(direction).inc(num_blocks)
        self.bytes.labels(direction).inc(num_bytes)
        self.seconds.labels(direction).observe(seconds)
