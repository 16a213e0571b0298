"""Metrics-parse cost per scrape: the picker's parser against prometheus_client's full parser
on the same vLLM-like exposition text (2 engines, ~300 sample lines). Run by `make bench-epp`.

The two are interleaved in rounds and the median of each is reported (the machine is shared).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.metrics_parser import parse_metrics

FAMILIES = 36  # histograms and counters a vLLM server exposes besides the picker's series


def scrape_text(engines: int = 2) -> str:
    """A vLLM-like /metrics body: the picker's gauges per engine among many other series."""
    lines: list[str] = []
    for engine in range(engines):
        labels = f'engine="{engine}",model_name="tiny-llama"'
        lines += [
            f"vllm:num_requests_waiting{{{labels}}} {engine * 3}.0",
            f"vllm:num_requests_running{{{labels}}} 4.0",
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.{engine + 4}",
            f'vllm:cache_config_info{{block_size="128",{labels},num_gpu_blocks="512"}} 1.0',
            f'vllm:lora_requests_info{{{labels},max_lora="2",running_lora_adapters="a",'
            f'waiting_lora_adapters=""}} 1.7e9',
        ]
        for family in range(FAMILIES):
            name = f"vllm:series_{family}_seconds"
            lines.append(f"# HELP {name} Something vLLM measures.")
            lines.append(f"# TYPE {name} histogram")
            for bound in ("0.01", "0.1", "1.0", "+Inf"):
                lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {family}.0')
            lines += [f"{name}_sum{{{labels}}} 1.5", f"{name}_count{{{labels}}} {family}.0"]
    return "\n".join(lines) + "\n"


def _full_parse(text: str) -> None:
    for family in text_string_to_metric_families(text):
        for _ in family.samples:
            pass


def per_parse_us(parse: Callable[[str], object], text: str, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        parse(text)
    return (time.perf_counter() - started) / repeats * 1e6


def compare(rounds: int = 7, repeats: int = 200) -> tuple[float, float, int]:
    """(picker µs, prometheus_client µs) per scrape, medians over interleaved rounds; lines."""
    text = scrape_text()
    ours, full = [], []
    for _ in range(rounds):
        ours.append(per_parse_us(parse_metrics, text, repeats))
        full.append(per_parse_us(_full_parse, text, max(1, repeats // 10)))
    return statistics.median(ours), statistics.median(full), text.count("\n")


if __name__ == "__main__":
    mine, theirs, lines = compare()
    print(f"{lines} lines: picker {mine:.1f} µs, prometheus_client {theirs:.1f} µs per scrape")
