"""Backend counters read from ``/metrics`` before and after a load test: what each backend
served, its prefix-cache hits and queries (tokens), and its preemptions. The names are vLLM's
(the reference backend exports the same)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "requests": "vllm:request_success",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "preemptions": "vllm:num_preemptions",
}


@dataclass(frozen=True)
class Counters:
    values: dict[str, float]
    error: str = ""  # why the scrape failed, if it did


async def scrape(session: aiohttp.ClientSession, base: str) -> Counters:
    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
            if response.status != 200:
                return Counters({}, f"HTTP {response.status}")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return Counters({}, f"{type(exc).__name__}: {exc}")
    totals = dict.fromkeys(COUNTERS, 0.0)
    by_family = {family: key for key, family in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        key = by_family.get(family.name)
        if key is not None:
            totals[key] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return Counters(totals)


async def scrape_all(backends: list[str]) -> list[Counters]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(scrape(session, b) for b in backends)))


def deltas(before: list[Counters], after: list[Counters], backends: list[str]) -> dict[str, object]:
    """Per backend, the counters' growth during the run; and the pooled hit rate."""
    rows: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for name, first, last in zip(backends, before, after, strict=True):
        if first.error or last.error:
            errors[name] = first.error or last.error
            continue
        rows[name] = {key: last.values[key] - first.values[key] for key in COUNTERS}
    hits = sum(r["prefix_cache_hits"] for r in rows.values())
    queries = sum(r["prefix_cache_queries"] for r in rows.values())
    served = [r["requests"] for r in rows.values()]
    mean = sum(served) / len(served) if served else 0.0
    return {
        "per_backend": rows,
        "scrape_errors": errors,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "preemptions": sum(r["preemptions"] for r in rows.values()),
        "load_spread": max(served) / mean if mean else None,
    }
