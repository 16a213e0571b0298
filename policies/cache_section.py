"""The response cache: ``response_cache:`` says where answers are kept, a route's ``cache:``
opts its model in.

An answer is kept only when it is deterministic (``temperature`` 0, or a fixed ``seed``), whole
and a 200, and is found again only by the same tenant (unless the route shares it across
tenants) sending the same body to the same path. ``store: redis`` keeps answers in Redis too
(``url``, by default the limits' store), so every replica finds them; each process keeps its
own ``max_bytes`` in memory either way, and answers from there while Redis is away.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields

DEFAULT_TTL = 300.0  # seconds


@dataclass(frozen=True)
class ResponseCacheStore:
    """Where kept answers live (``response_cache:``)."""

    store: str = "memory"  # memory | redis
    url: str | None = None  # the Redis store; None: the limits' store
    timeout: float = 0.05  # per Redis call; then the answer is looked for in memory only
    max_bytes: int = 64 << 20  # of answers in this process's memory
    max_entry: int = 1 << 20  # a larger answer is not kept
    ttl: float = DEFAULT_TTL  # of an answer, unless its route says otherwise


@dataclass(frozen=True)
class RouteCache:
    """A route's use of the cache (its ``cache:``)."""

    ttl: float = DEFAULT_TTL
    across_tenants: bool = False  # one tenant's kept answer may answer another's request


def load_cache_store(top: Fields, limits_url: str | None) -> ResponseCacheStore:
    """``response_cache:`` (``limits_url``: the limits' Redis, the default ``url``)."""
    f = top.sub("response_cache", {"store", "url", "timeout", "max_bytes", "max_entry", "ttl"})
    d = ResponseCacheStore()
    store = f.text("store", d.store, choices=("memory", "redis"))
    url = f.opt_str("url") or limits_url
    if store == "redis" and not url:
        f.error("response_cache.url", "is required for the redis store without limits.store.url")
    max_bytes = f.size("max_bytes", d.max_bytes)
    max_entry = f.size("max_entry", d.max_entry)
    if max_entry > max_bytes:
        f.error("response_cache.max_entry", "must not be larger than max_bytes")
    return ResponseCacheStore(
        store,
        url if store == "redis" else None,
        f.duration("timeout", d.timeout),
        max_bytes,
        max_entry,
        f.duration("ttl", d.ttl),
    )


def load_route_cache(route: Fields, path: str, default_ttl: float) -> RouteCache | None:
    """A route's ``cache:``: ``true``, ``false`` or ``{ttl, across_tenants}``."""
    raw = route.raw("cache")
    if raw is None or raw is False:
        return None
    if raw is True:
        return RouteCache(default_ttl)
    if not isinstance(raw, dict):
        route.error(f"{path}.cache", "must be true, false or a mapping (ttl, across_tenants)")
        return None
    c = route.sub("cache", {"ttl", "across_tenants"})
    return RouteCache(c.duration("ttl", default_ttl), c.flag("across_tenants", False))
