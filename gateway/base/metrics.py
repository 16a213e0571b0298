"""The gateway's Prometheus metrics.

With ``--workers N`` every worker writes its samples to ``PROMETHEUS_MULTIPROC_DIR`` (set by the
parent before the workers start) and ``/metrics`` on any worker reports the sum over all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.metrics import exposition
from gateway.base.build_info import request_path_compiled, version
from gateway.base.finished_requests import FinishedRequests, RequestTotals, TotalsKey
from gateway.base.metric_batch import BatchedCounter, BatchedHistogram

if TYPE_CHECKING:
    from gateway.base.context import RequestContext

log = logging.getLogger("kvgate.gateway")
BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}  # kvgate_breaker_state's values

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class GatewayMetrics:
    """The metrics, with label children cached (``labels()`` locks and hashes every call)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._declare_traffic(r)
        self._declare_upstream(r)
        self._declare_admission(r)
        self._declare_policy(r)
        self._children: dict[tuple[object, ...], Any] = {}
        # the per-request updates: each finished request is added up at once (FinishedRequests)
        # and the sums go into batches (gateway.base.metric_batch) and on into prometheus_client
        # when flushed, twice a second and before every scrape
        self._finished = FinishedRequests()
        self.requests_batch = BatchedCounter(self.requests)
        self.latency_batch = BatchedHistogram(self.latency, LATENCY_BUCKETS)
        self.ttft_batch = BatchedHistogram(self.ttft, LATENCY_BUCKETS)
        self.tpot_batch = BatchedHistogram(self.tpot, TPOT_BUCKETS)
        self.tokens_batch = BatchedCounter(self.tokens)
        self.queue_wait_batch = BatchedHistogram(self.queue_wait, LATENCY_BUCKETS)
        self._batches = (
            self.requests_batch,
            self.latency_batch,
            self.ttft_batch,
            self.tpot_batch,
            self.tokens_batch,
            self.queue_wait_batch,
        )
        # requests in flight per pool, read when flushing (set by the application)
        self.in_flight_source: Callable[[], dict[str, int]] | None = None
        # given each flush's finished requests (the SLO tracker; set by the application)
        self.finished_sink: Callable[[dict[TotalsKey, RequestTotals]], None] | None = None

    def _declare_traffic(self, r: CollectorRegistry) -> None:
        """What requests do: answers, latencies, tokens, requests in flight."""
        self.requests = Counter(
            "kvgate_requests",
            "Requests answered, by route, model and status.",
            ["route", "model", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "kvgate_request_duration_seconds",
            "Time from request to the end of the response.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_time_to_first_byte_seconds",
            "Time from request to the first response byte (first token when streaming).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "kvgate_time_per_output_token_seconds",
            "Seconds per output token after the first, of streams of two tokens or more.",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "kvgate_tokens",
            "Tokens by model and direction (prompt, completion).",
            ["model", "direction"],
            registry=r,
        )
        self.spend = Counter(
            "kvgate_spend",
            "What answered requests cost at the policy's prices (spend.currency), by tenant, "
            "key (its name, or a JWT's subject), model and route.",
            ["tenant", "key", "model", "route"],
            registry=r,
        )
        self.in_flight = Gauge(
            "kvgate_in_flight_requests",
            "Requests being served.",
            ["pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.build_info = Gauge(
            "kvgate_build_info",
            "Always 1: kvgate's version, and whether the request path runs compiled (mypyc).",
            ["version", "compiled"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build_info.labels(version(), str(request_path_compiled()).lower()).set(1)

    def _declare_upstream(self, r: CollectorRegistry) -> None:
        """What happens upstream: errors, retries, resumed streams, prefill hops, breakers."""
        self.upstream_errors = Counter(
            "kvgate_upstream_errors",
            "Failed upstream attempts by endpoint and kind.",
            ["endpoint", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "kvgate_retries", "Upstream attempts retried on another endpoint.", ["pool"], registry=r
        )
        self.stream_resumes = Counter(
            "kvgate_stream_resumes",
            "Streams whose engine failed mid-answer, by outcome: resumed (continued on another "
            "endpoint), finished (the answer was complete: its end sent), gave_up (no resumes "
            "left, or not resumable), failed (no endpoint could continue it).",
            ["pool", "outcome"],
            registry=r,
        )
        self.prefill_hops = Counter(
            "kvgate_prefill_hops",
            "Prefill hops of prefill/decode pools: 'ok', or 'local' when no prefill endpoint "
            "answered with KV and the decode endpoint prefilled the prompt itself.",
            ["pool", "outcome"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "kvgate_breaker_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open.",
            ["endpoint"],
            registry=r,
            multiprocess_mode="max",
        )
        self.breaker_transitions = Counter(
            "kvgate_breaker_transitions",
            "Breaker state changes, by endpoint and new state.",
            ["endpoint", "state"],
            registry=r,
        )
        self.retry_budget_exhausted = Counter(
            "kvgate_retry_budget_exhausted",
            "Retries skipped because the pool's budget was spent.",
            ["pool"],
            registry=r,
        )
        self.adapter_changes = Counter(
            "kvgate_adapter_changes",
            "LoRA adapters the gateway placed on its pools' endpoints: loaded, unloaded (to make "
            "room), failed (the engine refused the load), lost (the engine no longer had it).",
            ["pool", "outcome"],
            registry=r,
        )

    def _declare_admission(self, r: CollectorRegistry) -> None:
        """Who waited, was refused or paused for whom."""
        self.stream_pauses = Counter(
            "kvgate_stream_pauses",
            "Streams paused for a heavier class's requests, by class and outcome: resumed "
            "(went on once admitted again), failed (no endpoint could continue it).",
            ["pool", "class", "outcome"],
            registry=r,
        )
        self.paused_seconds = Counter(
            "kvgate_stream_paused_seconds",
            "Seconds paused streams waited to be admitted again, by class.",
            ["pool", "class"],
            registry=r,
        )
        self.queue_rejections = Counter(
            "kvgate_queue_rejections",
            "Requests refused (full; deadline: it could not start in time) or given up "
            "(expired) by class.",
            ["class", "reason"],
            registry=r,
        )

    def _declare_policy(self, r: CollectorRegistry) -> None:
        """What the policy decides: admission queues, A/B tests, shadows, fallbacks, reloads."""
        self.queue_wait = Histogram(
            "kvgate_queue_wait_seconds",
            "Time requests waited in the admission queue.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ab_requests = Counter(
            "kvgate_ab_requests",
            "Requests of A/B tests by test, arm and status.",
            ["test", "arm", "status"],
            registry=r,
        )
        self.shadow_results = Counter(
            "kvgate_shadow_results",
            "Shadow copies by route and outcome (match, mismatch, error, dropped).",
            ["route", "result"],
            registry=r,
        )
        self.shadow_latency_ratio = Histogram(
            "kvgate_shadow_latency_ratio",
            "Shadow latency / primary latency.",
            ["route"],
            buckets=(0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 10.0),
            registry=r,
        )
        self.fallbacks = Counter(
            "kvgate_fallbacks",
            "Requests sent to a fallback model, by route and reason.",
            ["route", "reason"],
            registry=r,
        )
        self.admin_actions = Counter(
            "kvgate_admin_actions",
            "State-changing admin API calls by action and result (applied, rejected, denied, "
            "unauthenticated, not_found, error): the audit log's lines, counted.",
            ["action", "result"],
            registry=r,
        )
        self.reloads = Counter(
            "kvgate_policy_reloads",
            "Policy reloads by result (applied, rejected).",
            ["result"],
            registry=r,
        )

    def finished(self, ctx: RequestContext) -> None:
        """Count a finished request (its route, model, status, timings, tokens, queue wait)."""
        self._finished.add(ctx)

    def flush(self) -> None:
        """Move the finished requests and batched updates into the metrics."""
        totals = self._finished.drain_into(
            self.requests_batch,
            self.latency_batch,
            self.ttft_batch,
            self.tpot_batch,
            self.tokens_batch,
            self.queue_wait_batch,
        )
        if self.finished_sink is not None:
            self.finished_sink(totals)
        for batch in self._batches:
            batch.flush()
        if self.in_flight_source is not None:
            for pool, count in self.in_flight_source().items():
                self.child(self.in_flight, pool).set(count)

    def breaker_changed(self, address: str, state: str) -> None:
        """The breaker of the endpoint at ``address`` moved to ``state`` (closed, half_open,
        open)."""
        self.breaker_state.labels(address).set(BREAKER_LEVELS[state])
        self.breaker_transitions.labels(address, state).inc()
        log.warning("breaker of %s is now %s", address, state)

    def child(self, metric: Counter | Gauge | Histogram, *labels: str) -> Any:
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def exposition(self) -> bytes:
        self.flush()
        return exposition(self.registry)
