"""Read model-server metrics (vLLM names, or SGLang's) from Prometheus text, fast.

Only the handful of series the picker needs are parsed; everything else is skipped by name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from epp.framework import EndpointMetrics


@dataclass(frozen=True)
class MetricNames:
    waiting: str
    running: str
    kv_usage: str
    cache_info: str
    lora_info: str | None
    block_size_label: str
    num_blocks_label: str


VLLM = MetricNames(
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
    "block_size",
    "num_gpu_blocks",
)
SGLANG = MetricNames(
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:token_usage",
    "sglang:cache_config_info",
    None,
    "page_size",
    "num_pages",
)
NAMES = {"vllm": VLLM, "kvgate": VLLM, "sglang": SGLANG}


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    rest = text
    while rest:
        key, _, rest = rest.partition('="')
        value, _, rest = rest.partition('"')
        labels[key.strip().lstrip(",").strip()] = value
        rest = rest.lstrip(",").strip()
    return labels


def parse_metrics(text: str, names: MetricNames = VLLM) -> EndpointMetrics:
    """The picker's view of one scrape. Only the lines of the wanted series are read: each is
    found with ``str.find`` (a model server exposes hundreds of lines the picker never uses)."""
    metrics = EndpointMetrics(scraped_at=time.monotonic())
    text = "\n" + text  # every sample line now starts after a newline
    for _, value in _samples(text, names.waiting):
        metrics.waiting = int(value)
    for _, value in _samples(text, names.running):
        metrics.running = int(value)
    for _, value in _samples(text, names.kv_usage):
        metrics.kv_usage = value
    for label_text, _ in _samples(text, names.cache_info):
        labels = _labels(label_text)
        metrics.block_size = int(labels.get(names.block_size_label, "0") or 0)
        metrics.num_gpu_blocks = int(labels.get(names.num_blocks_label, "0") or 0)
    if names.lora_info is None:
        return metrics
    newest_lora = -1.0
    for label_text, value in _samples(text, names.lora_info):
        if value <= newest_lora:
            continue
        newest_lora = value  # the newest series is the current one
        labels = _labels(label_text)
        metrics.running_loras = frozenset(
            filter(None, labels.get("running_lora_adapters", "").split(","))
        )
        metrics.waiting_loras = frozenset(
            filter(None, labels.get("waiting_lora_adapters", "").split(","))
        )
        metrics.max_loras = int(labels.get("max_lora", "0") or 0)
    return metrics


def _samples(text: str, name: str) -> Iterator[tuple[str, float]]:
    """(label text without braces, value) of every sample line of series ``name`` in
    ``text`` (which starts with a newline); comment lines and longer names are skipped."""
    needle = "\n" + name
    at = text.find(needle)
    while at >= 0:
        start = at + 1
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        after = line[len(name) : len(name) + 1]
        if after in ("{", " "):
            head, _, value_text = line.rpartition(" ")
            try:
                value = float(value_text)
            except ValueError:
                value = None
            if value is not None:
                labels = head[len(name) :].strip()
                yield (labels[1:].rstrip("}") if labels.startswith("{") else ""), value
        at = text.find(needle, start)
