"""Prometheus metrics with vLLM's names, labels and wire format.

Gauges and counters are read from the engine at scrape time (no cost per token); latency
histograms are observed by the engine loop through ``LatencyObserver``. Counters are
registered without ``_total`` and prometheus_client appends it on the wire, as in vLLM.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from backends.engine.engine import AsyncEngine
from backends.engine.sequence import Sequence, SequenceStatus

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
LORA_HISTORY = 32  # label sets of vllm:lora_requests_info kept, newest wins for readers


Metered = tuple[str, float]  # a metric's help text and value


class EngineCollector(Collector):
    """Reads the engine's state at scrape time under vLLM's metric names."""

    def __init__(self, engine: AsyncEngine, model_name: str, max_loras: int) -> None:
        self.engine = engine
        self.labels = {"model_name": model_name, "engine": "0"}
        self.max_loras = max_loras
        self._lora_seen: dict[tuple[str, str], float] = {}

    def describe(self) -> list[Metric]:
        """The families it serves (the registry maps ``?name[]=`` to them)."""
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        scheduler = self.engine.scheduler
        stats = scheduler.stats
        blocks = self.engine.block_manager
        names, values = list(self.labels), list(self.labels.values())
        gauges: dict[str, Metered] = {
            "vllm:num_requests_running": (
                "Number of requests in model execution batches.",
                scheduler.num_running,
            ),
            "vllm:num_requests_waiting": (
                "Number of requests waiting to be processed.",
                scheduler.num_waiting,
            ),
            "vllm:kv_cache_usage_perc": (
                "KV-cache usage. 1 means 100 percent usage.",
                blocks.usage,
            ),
        }
        tier_gauges, tier_counters = self._cache_tier_metrics()
        gauges.update(tier_gauges)
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, float(value))
            yield gauge
        counters: dict[str, Metered] = {
            "vllm:prefix_cache_queries": (
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_cache_queries,
            ),
            "vllm:prefix_cache_hits": (
                "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_cache_hits,
            ),
            "vllm:num_preemptions": (
                "Cumulative number of preemption from the engine.",
                stats.num_preemptions,
            ),
            "vllm:prompt_tokens": ("Number of prefill tokens processed.", stats.prompt_tokens),
            "vllm:generation_tokens": (
                "Number of generation tokens processed.",
                stats.generation_tokens,
            ),
        }
        counters.update(tier_counters)
        speculative = scheduler.config.speculative
        if speculative is not None:
            counters.update(self._speculation_counters())
        for name, (doc, value) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, float(value))
            yield counter
        if speculative is not None:
            yield self._accepted_per_position(names, values, speculative.num_speculative_tokens)
        yield self._cache_config_info()
        yield self._lora_info()

    def _cache_tier_metrics(self) -> tuple[dict[str, Metered], dict[str, Metered]]:
        """The host tier's and retention's gauges and counters, where the engine has them
        (``vllm:prefix_cache_hits`` counts the tokens both tiers served; these say which were
        the host tier's)."""
        blocks = self.engine.block_manager
        gauges: dict[str, Metered] = {}
        counters: dict[str, Metered] = {}
        if blocks.host is not None:
            gauges["kvgate:host_cache_blocks"] = (
                "Blocks the host tier holds (KV offloaded from the device).",
                len(blocks.host),
            )
            counters["kvgate:host_cache_hits"] = (
                "Prompt tokens restored from the host tier instead of computed.",
                blocks.restored_tokens,
            )
            counters["kvgate:host_cache_offloads"] = (
                "Blocks copied from the device to the host tier.",
                blocks.offloaded_blocks,
            )
        if blocks.retention is not None:
            blocks.release_expired()
            gauges["kvgate:kv_retained_blocks"] = (
                "Blocks kept cached for sessions in a pause (kv.retain hints).",
                len(blocks.retention),
            )
            counters["kvgate:kv_retained_hits"] = (
                "Prompt tokens found in blocks a kv.retain hint was keeping.",
                blocks.retained_hit_tokens,
            )
        return gauges, counters

    def _speculation_counters(self) -> dict[str, tuple[str, int]]:
        """vLLM's ``vllm:spec_decode_*`` counters (with ``--speculative-config``)."""
        stats = self.engine.scheduler.speculation
        return {
            "vllm:spec_decode_num_drafts": ("Number of spec decoding drafts.", stats.num_drafts),
            "vllm:spec_decode_num_draft_tokens": (
                "Number of draft tokens.",
                stats.num_draft_tokens,
            ),
            "vllm:spec_decode_num_accepted_tokens": (
                "Number of accepted tokens.",
                stats.num_accepted_tokens,
            ),
        }

    def _accepted_per_position(self, names: list[str], values: list[str], width: int) -> Metric:
        per_position = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=[*names, "position"],
        )
        accepted = self.engine.scheduler.speculation.accepted_per_position
        for position in range(width):
            count = accepted[position] if position < len(accepted) else 0
            per_position.add_metric([*values, str(position)], float(count))
        return per_position

    def _cache_config_info(self) -> Metric:
        blocks = self.engine.block_manager
        info = {
            "block_size": str(blocks.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(blocks.enable_prefix_caching),
            "num_cpu_blocks": "0",
            "num_gpu_blocks": str(blocks.num_blocks),
            "engine": "0",
        }
        gauge = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
        )
        gauge.add_metric(list(info.values()), 1.0)
        return gauge

    def _lora_info(self) -> Metric:
        """Like vLLM: one series per adapter set, valued with the time it was last current
        (restamped while the engine works, as vLLM does at each step)."""
        scheduler = self.engine.scheduler
        running = _adapter_names(scheduler.running)
        waiting = _adapter_names(entry[1] for entry in scheduler.waiting)
        key = (running, waiting)
        newest = next(reversed(self._lora_seen), None)
        if key != newest or scheduler.num_running or scheduler.num_waiting:
            # vLLM stamps the set at every engine step; an idle engine takes none, so the
            # text stays the same from scrape to scrape
            self._lora_seen.pop(key, None)
            self._lora_seen[key] = time.time()
        while len(self._lora_seen) > LORA_HISTORY:
            self._lora_seen.pop(next(iter(self._lora_seen)))
        gauge = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        for (run, wait), stamp in self._lora_seen.items():
            gauge.add_metric([str(self.max_loras), run, wait], stamp)
        return gauge


def _adapter_names(seqs: Iterator[Sequence] | list[Sequence]) -> str:
    names = {s.lora_name for s in seqs if s.lora_name and s.status is not SequenceStatus.FINISHED}
    return ",".join(sorted(names))


class BucketCounter:
    """A histogram's counts, lock-free (one event loop writes it), exported at scrape time."""

    __slots__ = ("bounds", "counts", "doc", "name", "sum")

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.doc = doc
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, labels: dict[str, str]) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(labels))
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        family.add_metric(list(labels.values()), buckets, self.sum)
        return family


class ServerMetrics(Collector):
    """The registry a backend serves at ``/metrics``; also the engine's latency observer."""

    def __init__(self, engine: AsyncEngine, model_name: str, max_loras: int) -> None:
        self.registry = CollectorRegistry()
        self.engine_collector = EngineCollector(engine, model_name, max_loras)
        self.labels = self.engine_collector.labels
        self.ttft = BucketCounter(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = BucketCounter(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = BucketCounter(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        self.finished: dict[str, int] = {}
        self.tokenize_seconds = 0.0  # reading requests: rendering and tokenizing their prompts
        self.registry.register(self.engine_collector)
        self.registry.register(self)

    def describe(self) -> list[Metric]:
        """The families it serves (the registry maps ``?name[]=`` to them)."""
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        for histogram in (self.ttft, self.itl, self.e2e):
            yield histogram.family(self.labels)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self.labels, "finished_reason"],
        )
        for reason, count in sorted(self.finished.items()):
            success.add_metric([*self.labels.values(), reason], float(count))
        yield success
        tokenize = CounterMetricFamily(
            "kvgate:request_tokenize_seconds",
            "CPU seconds spent reading requests: rendering and tokenizing their prompts.",
            labels=list(self.labels),
        )
        tokenize.add_metric(list(self.labels.values()), self.tokenize_seconds)
        yield tokenize

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def on_finished(self, seq: Sequence, e2e_seconds: float) -> None:
        self.e2e.observe(e2e_seconds)
        reason = seq.finish_reason.value if seq.finish_reason else "abort"
        self.finished[reason] = self.finished.get(reason, 0) + 1
