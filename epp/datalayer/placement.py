"""What the picker placed on each endpoint lately, decayed with a half-life: the uncached prompt
tokens of its dispatches, and the requests of each LoRA adapter.

Unlike what a cache holds, which stops growing once the cache is full, placed content keeps
counting where new prefixes (new conversations, new system prompts) went, and so where their
later requests will go. The adapters placed on an endpoint are the ones it will keep serving
while those prefixes stay there: a new prefix of an adapter fits an endpoint that already
serves it, or one that serves fewer adapters than it can hold at once (``adapter_fits``).
"""

from __future__ import annotations

import math
import time

from epp.framework import Endpoint

HALF_LIFE = 60.0  # seconds
_RATE = math.log(2) / HALF_LIFE
# an adapter counts as served by an endpoint while its decayed request count is at least this
# (one request, for a half-life)
SERVED_REQUESTS = 0.5
# an endpoint sent more than this many times the pool's mean new content lately has no room
# for more (lora-mix's slow rounds had backends of 5-7 system prompts where the mean is 4:
# 1.25-1.75x)
CROWDED = 1.25


def add_placed(
    endpoint: Endpoint,
    tokens: int,
    adapter: str | None = None,
    now: float | None = None,
    age: float = 0.0,
) -> None:
    """A request with ``tokens`` uncached prompt tokens (of ``adapter``, if any) was sent to
    ``endpoint`` ``age`` seconds ago (just now, by default)."""
    now = time.monotonic() if now is None else now
    decay = _decay(endpoint, now)
    weight = math.exp(-_RATE * age) if age > 0 else 1.0
    endpoint.load.placed_tokens = endpoint.load.placed_tokens * decay + tokens * weight
    if endpoint.load.placed_adapters or adapter is not None:
        counts = {
            name: count * decay
            for name, count in endpoint.load.placed_adapters.items()
            if count * decay >= SERVED_REQUESTS / 4
        }
        if adapter is not None:
            counts[adapter] = counts.get(adapter, 0.0) + weight
        endpoint.load.placed_adapters = counts
    endpoint.load.placed_at = now


def placed(endpoint: Endpoint, now: float | None = None) -> float:
    """The decayed sum of the uncached prompt tokens sent to ``endpoint``."""
    if not endpoint.load.placed_tokens:
        return 0.0
    return endpoint.load.placed_tokens * _decay(endpoint, time.monotonic() if now is None else now)


def served_adapters(endpoint: Endpoint, now: float | None = None) -> set[str]:
    """The adapters ``endpoint`` serves: those the picker sent it lately, those its own
    metrics report running, and those the gateway loaded there."""
    decay = _decay(endpoint, time.monotonic() if now is None else now)
    served = {a for a, n in endpoint.load.placed_adapters.items() if n * decay >= SERVED_REQUESTS}
    return served.union(endpoint.metrics.running_loras, endpoint.adapters_loaded)


def adapter_fits(endpoint: Endpoint, adapter: str, now: float | None = None) -> bool:
    """Whether a new prefix of ``adapter`` fits ``endpoint`` without making it juggle more
    adapters than it holds at once (its ``max_loras``; unknown: it fits). Where the gateway
    loads adapters itself, what it loaded there and how many fit decide."""
    if endpoint.adapter_slots:
        loaded = endpoint.adapters_loaded
        return adapter in loaded or len(loaded) < endpoint.adapter_slots
    limit = endpoint.metrics.max_loras
    if not limit:
        return True
    served = served_adapters(endpoint, now)
    return adapter in served or len(served) < limit


def holding(endpoints: list[Endpoint], adapter: str) -> list[Endpoint]:
    """Where the gateway loads adapters itself: the endpoints that have ``adapter`` loaded (or
    loading). Its requests stay there (another load elsewhere costs a load and a slot), less
    only what their load scores take away."""
    return [e for e in endpoints if e.adapter_slots and adapter in e.adapters_loaded]


def room_among(fit: list[Endpoint], pool: list[Endpoint], now: float | None = None) -> bool:
    """Whether some endpoint of ``fit`` was sent at most ``CROWDED`` times the mean new
    content of ``pool`` lately. When none was, keeping a popular adapter's new prefixes on the
    few endpoints that serve it would overflow their caches (their prefixes evicted and
    computed again), which costs more than one more adapter elsewhere."""
    now = time.monotonic() if now is None else now
    mean = sum(placed(e, now) for e in pool) / len(pool) if pool else 0.0
    return any(placed(e, now) <= CROWDED * mean for e in fit)


def _decay(endpoint: Endpoint, now: float) -> float:
    return math.exp(-_RATE * max(0.0, now - endpoint.load.placed_at))
