"""Read model-server metrics (vLLM names, or SGLang's) from Prometheus text, fast.

Only the lines of the handful of series the picker needs are parsed: each is found with
``str.find`` (a model server exposes hundreds of lines the picker never uses), then parsed as
the text exposition format defines a sample line: ``name{label="value",...} value
[timestamp]``, label values with ``\\"``, ``\\\\`` and ``\\n`` escapes, values such as ``NaN``
and ``+Inf``. A server with several engines (vLLM with data parallelism) exposes one series
per engine (label ``engine``); they combine per metric, so a saturated engine stays visible:

- waiting and running requests: summed over the engines;
- KV-cache usage: the highest engine's;
- ``cache_config_info``: the block size of any engine, the KV blocks summed;
- LoRA residency: each engine's newest ``lora_requests_info`` series, adapters united, the
  largest ``max_lora``;
- the inter-token latency histogram's count and sum (for a measured capacity): summed.

vLLM's older ``vllm:gpu_cache_usage_perc`` is read when ``vllm:kv_cache_usage_perc`` is absent.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from epp.framework import EndpointMetrics


@dataclass(frozen=True)
class MetricNames:
    """The series the picker reads from one kind of model server."""

    waiting: str
    running: str
    kv_usage: str
    cache_info: str
    lora_info: str | None
    block_size_label: str
    num_blocks_label: str
    kv_usage_fallback: str | None = None  # read when ``kv_usage`` is absent
    token_gaps: str | None = None  # the inter-token latency histogram (measured capacity)

    def series(self) -> tuple[str, ...]:
        """Every series name the picker reads, for a scrape that asks for only those."""
        names = (self.waiting, self.running, self.kv_usage, self.cache_info)
        optional = (self.kv_usage_fallback, self.lora_info)
        gaps = (self.token_gaps + "_sum", self.token_gaps + "_count") if self.token_gaps else ()
        return names + tuple(name for name in optional if name is not None) + gaps


VLLM = MetricNames(
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
    "block_size",
    "num_gpu_blocks",
    "vllm:gpu_cache_usage_perc",
    "vllm:inter_token_latency_seconds",
)
SGLANG = MetricNames(
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:token_usage",
    "sglang:cache_config_info",
    None,
    "page_size",
    "num_pages",
    token_gaps="sglang:inter_token_latency_seconds",
)
NAMES = {"vllm": VLLM, "kvgate": VLLM, "sglang": SGLANG}


def names_for(engine: str, overrides: dict[str, str] | None = None) -> MetricNames:
    """The names for ``engine`` (vllm | kvgate | sglang), with per-pool ``overrides`` of
    ``waiting``, ``running``, ``kv_usage`` and ``lora_info`` (as GIE's flags allow)."""
    names = NAMES.get(engine, VLLM)
    if not overrides:
        return names
    changes: dict[str, object] = dict(overrides)
    if "kv_usage" in overrides:
        changes["kv_usage_fallback"] = None
    return replace(names, **changes)  # type: ignore[arg-type]


_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)', re.S)
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_labels(text: str) -> dict[str, str]:
    """The labels of ``{...}``'s inside (without braces), escapes resolved; ``ValueError``
    when it is not well formed."""
    labels: dict[str, str] = {}
    at = 0
    for match in _LABEL.finditer(text):
        if match.start() != at:
            break
        value = match.group(2)
        if "\\" in value:
            value = _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)
        labels[match.group(1)] = value
        at = match.end()
    if text[at:].strip():
        raise ValueError(f"malformed labels: {text[at:]!r}")
    return labels


@functools.lru_cache(maxsize=256)
def _labels_of(text: str) -> Mapping[str, str]:
    """``parse_labels``, remembered: an info series repeats the same label text scrape after
    scrape (vLLM's ``cache_config_info`` has some twenty labels)."""
    return parse_labels(text)


def _value(text: str) -> float | None:
    """The sample value of what follows the name and labels (a timestamp may follow it)."""
    parts = text.split()
    if not parts:
        return None
    try:
        return float(parts[0])  # float() reads NaN, +Inf and -Inf as the format spells them
    except ValueError:
        return None


def samples(text: str, name: str) -> Iterator[tuple[str, float]]:
    """(label text without braces, value) of every sample line of series ``name`` in
    ``text`` (which starts with a newline); comments, longer names and malformed lines are
    skipped."""
    needle = "\n" + name
    at = text.find(needle)
    width = len(name)
    while at >= 0:
        start = at + 1
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        after = line[width : width + 1]
        labels = ""
        value: float | None = None
        if after == "{":
            close = line.rfind("}")  # the last one: a value or timestamp never holds a brace
            if close > width:
                labels, value = line[width + 1 : close], _value(line[close + 1 :])
        elif after in (" ", "\t"):
            value = _value(line[width:])
        if value is not None:
            yield labels, value
        at = text.find(needle, start)


def parse_metrics(text: str, names: MetricNames = VLLM) -> EndpointMetrics:
    """The picker's view of one scrape, engines combined as the module says."""
    metrics = EndpointMetrics(scraped_at=time.monotonic())
    text = "\n" + text  # every sample line now starts after a newline
    metrics.waiting = int(sum(_finite(v) for _, v in samples(text, names.waiting)))
    metrics.running = int(sum(_finite(v) for _, v in samples(text, names.running)))
    usage = [_finite(v) for _, v in samples(text, names.kv_usage)]
    if not usage and names.kv_usage_fallback:
        usage = [_finite(v) for _, v in samples(text, names.kv_usage_fallback)]
    metrics.kv_usage = max(usage, default=0.0)
    _cache_config(metrics, text, names)
    if names.lora_info is not None:
        _lora_info(metrics, text, names.lora_info)
    if names.token_gaps is not None:
        gaps = names.token_gaps
        metrics.token_gaps = sum(_finite(v) for _, v in samples(text, gaps + "_count"))
        metrics.token_gap_seconds = sum(_finite(v) for _, v in samples(text, gaps + "_sum"))
    return metrics


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _cache_config(metrics: EndpointMetrics, text: str, names: MetricNames) -> None:
    blocks: dict[str, int] = {}
    for label_text, _ in samples(text, names.cache_info):
        try:
            labels = _labels_of(label_text)
            block_size = int(labels.get(names.block_size_label, "0") or 0)
            num_blocks = int(labels.get(names.num_blocks_label, "0") or 0)
        except ValueError:
            continue
        metrics.block_size = metrics.block_size or block_size
        blocks[labels.get("engine", "")] = num_blocks
    metrics.num_gpu_blocks = sum(blocks.values())


def _lora_info(metrics: EndpointMetrics, text: str, name: str) -> None:
    newest: dict[str, tuple[float, Mapping[str, str]]] = {}  # engine -> (value: a time, labels)
    for label_text, value in samples(text, name):
        try:
            labels = _labels_of(label_text)
        except ValueError:
            continue
        engine = labels.get("engine", "")
        if engine not in newest or value > newest[engine][0]:
            newest[engine] = (value, labels)
    running: set[str] = set()
    waiting: set[str] = set()
    max_loras = 0
    for _, labels in newest.values():
        try:
            max_loras = max(max_loras, int(labels.get("max_lora", "0") or 0))
        except ValueError:
            continue
        running.update(filter(None, labels.get("running_lora_adapters", "").split(",")))
        waiting.update(filter(None, labels.get("waiting_lora_adapters", "").split(",")))
    metrics.running_loras = frozenset(running)
    metrics.waiting_loras = frozenset(waiting)
    metrics.max_loras = max_loras
