"""The serving metrics of a load test, under the names ``vllm bench serve`` saves them.

Definitions follow vLLM's benchmark (client side): TTFT from send to the first content chunk;
TPOT = (latency - TTFT) / (output tokens - 1) per request with more than one token; ITL every
gap between content chunks, pooled over the requests; E2EL the whole request. Throughputs
divide by the run's duration. A request is *good* when it meets every SLO given (``ttft``,
``tpot``, ``e2el``, in milliseconds); goodput is good requests per second (DistServe's).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from loadtest.reports.records import RequestRecord
from loadtest.reports.stats import summarize

METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_NAMES = ("ttft", "tpot", "e2el")


def metric_values(records: list[RequestRecord], metric: str) -> list[float]:
    """Seconds: one value per successful request (``itl``: one per gap)."""
    ok = [r for r in records if r.ok]
    if metric == "ttft":
        return [r.ttft for r in ok]
    if metric == "e2el":
        return [r.latency for r in ok]
    if metric == "itl":
        return [gap for r in ok for gap in r.itls]
    if metric == "tpot":
        return [t for r in ok if (t := r.tpot) is not None]
    raise ValueError(f"unknown metric {metric!r}")


def is_good(record: RequestRecord, slo_ms: Mapping[str, float]) -> bool:
    if not record.ok:
        return False
    measured = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.latency}
    return all(measured[name] * 1000 <= limit for name, limit in slo_ms.items())


def max_concurrency(records: list[RequestRecord]) -> int:
    """The most requests that were in flight at once."""
    events = sorted(
        [(r.start, 1) for r in records] + [(r.start + r.latency, -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    now = peak = 0
    for _, change in events:
        now += change
        peak = max(peak, now)
    return peak


def max_output_tokens_per_s(records: list[RequestRecord]) -> float:
    """The most content chunks that arrived within one wall-clock second of the run."""
    per_second: Counter[int] = Counter()
    for r in records:
        if not r.ok or not r.output_tokens:
            continue
        at = r.start + r.ttft
        per_second[math.floor(at)] += 1
        for gap in r.itls:
            at += gap
            per_second[math.floor(at)] += 1
    return float(max(per_second.values(), default=0))


def benchmark_result(
    records: list[RequestRecord], duration: float, slo_ms: Mapping[str, float] | None = None
) -> dict[str, object]:
    """vLLM's result keys (``duration``, ``completed``, ``request_throughput``,
    ``mean_ttft_ms``, ``p99_itl_ms`` ...) plus ``p90_*`` and the per-request lists."""
    for name in slo_ms or {}:
        if name not in SLO_NAMES:
            raise ValueError(f"unknown SLO {name!r}: one of {', '.join(SLO_NAMES)}")
    ok = [r for r in records if r.ok]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    per_s = 1 / duration if duration > 0 else 0.0
    result: dict[str, object] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) * per_s,
        "request_goodput": (
            sum(is_good(r, slo_ms) for r in records) * per_s if slo_ms is not None else None
        ),
        "output_throughput": total_output * per_s,
        "total_token_throughput": (total_input + total_output) * per_s,
        "max_output_tokens_per_s": max_output_tokens_per_s(records),
        "max_concurrent_requests": max_concurrency(records),
    }
    for metric in METRICS:
        summary = summarize(metric_values(records, metric), scale=1000)
        result[f"mean_{metric}_ms"] = summary.mean
        result[f"median_{metric}_ms"] = summary.median
        result[f"std_{metric}_ms"] = summary.std
        for name in ("p50", "p90", "p99"):
            result[f"{name}_{metric}_ms"] = getattr(summary, name)
    result.update(
        input_lens=[r.prompt_tokens for r in records],
        output_lens=[r.output_tokens for r in records],
        ttfts=[r.ttft for r in records],
        itls=[r.itls for r in records],
        latencies=[r.latency for r in records],
        start_times=[r.start for r in records],
        errors=[r.error for r in records],
    )
    return result


def errors_by_kind(records: list[RequestRecord]) -> dict[str, int]:
    return dict(Counter(r.error_kind for r in records if not r.ok))
