"""Read model-server metrics (vLLM names, or SGLang's) from Prometheus text, fast.

Only the handful of series the picker needs are parsed; everything else is skipped by name.
"""

from __future__ import annotations

import time
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
    metrics = EndpointMetrics(scraped_at=time.monotonic())
    newest_lora = -1.0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value_text = line.rpartition(" ")
        name, _, label_text = head.partition("{")
        try:
            value = float(value_text)
        except ValueError:
            continue
        if name == names.waiting:
            metrics.waiting = int(value)
        elif name == names.running:
            metrics.running = int(value)
        elif name == names.kv_usage:
            metrics.kv_usage = value
        elif name == names.cache_info:
            labels = _labels(label_text.rstrip("}"))
            metrics.block_size = int(labels.get(names.block_size_label, "0") or 0)
            metrics.num_gpu_blocks = int(labels.get(names.num_blocks_label, "0") or 0)
        elif name == names.lora_info and value > newest_lora:
            newest_lora = value  # the newest series is the current one
            labels = _labels(label_text.rstrip("}"))
            metrics.running_loras = frozenset(
                filter(None, labels.get("running_lora_adapters", "").split(","))
            )
            metrics.waiting_loras = frozenset(
                filter(None, labels.get("waiting_lora_adapters", "").split(","))
            )
            metrics.max_loras = int(labels.get("max_lora", "0") or 0)
    return metrics
