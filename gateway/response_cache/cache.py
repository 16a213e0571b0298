"""Which requests the response cache answers, and how a kept answer is found and replayed.

A request on a route with ``cache:`` is looked up when its answer is deterministic
(``temperature`` 0, a fixed ``seed``, or an embedding) and the caller did not send
``Cache-Control: no-store`` (nothing looked up, nothing kept) or ``no-cache`` (nothing looked
up; the fresh answer is kept). Its key is a SHA-256 of the tenant (unless the route shares
answers across tenants), the path, the pool and the body with its keys sorted. Only a whole
200 answer is kept: a JSON body, or a stream that reached ``[DONE]``; a stream is replayed as
the same events in one body. The response says ``x-kvgate-cache: hit``, ``miss`` or
``bypass``, and a hit its ``age``. A hit spends no rate limit and reaches no engine.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.base.api import Api
from gateway.base.context import RequestContext
from gateway.response_cache.stores import KeptAnswer, MemoryAnswers, RedisAnswers
from kvgate.wire.http.messages import Response
from policies.cache_section import ResponseCacheStore, RouteCache
from policies.schema import Policy

HEADER = "x-kvgate-cache"
HIT, MISS, BYPASS = "hit", "miss", "bypass"
_JSON, _SSE = "application/json", "text/event-stream"


def deterministic(api: Api, body: Mapping[str, object]) -> bool:
    """Whether the same body always gets the same answer: an embedding, a greedy request
    (``temperature`` 0) or a seeded one (the other sampling parameters are in the key)."""
    if api.deterministic:
        return True
    temperature = body.get("temperature")
    if type(temperature) in (int, float) and temperature == 0:
        return True
    return type(body.get("seed")) is int


def directives(headers: Mapping[str, str]) -> frozenset[str]:
    """The request's ``Cache-Control`` directives, lower case."""
    value = headers.get("cache-control")
    if not value:
        return frozenset()
    return frozenset(part.strip().lower() for part in value.split(","))


def cache_key(tenant: str, path: str, pool: str, body: Mapping[str, object]) -> str:
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(b"\0".join((tenant.encode(), path.encode(), pool.encode())))
    digest.update(b"\0" + canonical)
    return digest.hexdigest()


def replayed(answer: KeptAnswer, headers: Mapping[str, str] | None) -> Response:
    """A kept answer as a request's response, with its ``age`` and ``headers``."""
    age = str(max(0, int(time.time() - answer.stored_at)))
    content_type = _SSE if answer.stream else _JSON
    return Response(answer.body, headers={**(headers or {}), "age": age}, content_type=content_type)


class Keep:
    """Where the answer to one missed request is kept, if it turns out whole: under the key of
    the pool that served it (a fallback's answer is not the primary's)."""

    __slots__ = ("body", "cache", "copy", "path", "pool", "tenant", "ttl")

    def __init__(
        self,
        cache: ResponseCache,
        tenant: str,
        path: str,
        body: Mapping[str, object],
        pool: str,
        ttl: float,
    ) -> None:
        self.cache = cache
        self.tenant = tenant
        self.path = path
        self.body = body
        self.pool = pool  # the pool the answer was looked up for
        self.ttl = ttl
        self.copy: list[bytes] = []  # a stream's bytes as the client got them

    def answer(
        self, ctx: RequestContext, status: int, content_type: str | None, data: bytes
    ) -> None:
        """Keep a whole answer (a 200 JSON body only)."""
        if status == 200 and content_type == _JSON:
            self.cache.put(self._key(ctx), data, False, self.ttl)

    def stream(self, ctx: RequestContext, copied: bool) -> None:
        """Keep the stream copied into ``copy``, if it ended whole (no error) as a 200 and was
        ``copied`` whole (not dropped for its size as it was written)."""
        if ctx.status == 200 and not ctx.error and copied:
            self.cache.put(self._key(ctx), b"".join(self.copy), True, self.ttl)

    def _key(self, ctx: RequestContext) -> str:
        return cache_key(self.tenant, self.path, ctx.pool or self.pool, self.body)


@dataclass(frozen=True, slots=True)
class Lookup:
    """The response cache's verdict on a request (``hit``, ``miss`` or ``bypass``), with the
    kept answer of a hit, and where a miss's answer is kept."""

    verdict: str
    answer: KeptAnswer | None = None
    keep: Keep | None = None


class ResponseCache:
    """Kept answers of the routes with ``cache:``, in memory and (``store: redis``) in Redis;
    ``update`` takes a reloaded policy's settings (answers kept are kept while the store's
    settings stay)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.settings = ResponseCacheStore()
        self.memory = MemoryAnswers(self.settings.max_bytes)
        self.redis: RedisAnswers | None = None
        self._retired: list[RedisAnswers] = []
        self._declare(registry)

    def _declare(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter(
            "kvgate_response_cache_lookups",
            "Requests of routes with a response cache, by model and result (hit, miss, bypass).",
            ["model", "result"],
            registry=registry,
        )
        self.kept = Counter(
            "kvgate_response_cache_kept",
            "Answers kept, and their bytes.",
            ["unit"],
            registry=registry,
        )
        self.evicted = Counter(
            "kvgate_response_cache_evictions",
            "Answers pushed out of memory for room.",
            registry=registry,
        )
        self.store_errors = Counter(
            "kvgate_response_cache_store_errors",
            "Redis calls of the response cache that failed or timed out (answered from memory).",
            registry=registry,
        )
        self.size = Gauge(
            "kvgate_response_cache_bytes",
            "Bytes of answers kept in memory.",
            registry=registry,
            multiprocess_mode="livesum",
        )

    def update(self, policy: Policy) -> None:
        settings = policy.response_cache
        if settings == self.settings:
            return
        if settings.max_bytes != self.settings.max_bytes:
            self.memory = MemoryAnswers(settings.max_bytes)
        redis = self.redis
        if redis is not None and (redis.url, redis.timeout) != (settings.url, settings.timeout):
            self._retired.append(redis)
            self.redis = None
        if settings.url and self.redis is None:
            self.redis = RedisAnswers(settings.url, settings.timeout, self.store_errors.inc)
        self.settings = settings

    async def look_up(
        self,
        route: RouteCache,
        api: Api,
        body: Mapping[str, object],
        headers: Mapping[str, str],
        pool: str,
        tenant: str,
        model: str,
    ) -> Lookup:
        """The verdict on a request of ``tenant`` for ``model``: its kept answer (a hit), else
        where to keep its answer (a miss), or neither (bypassed)."""
        said = directives(headers)
        if not api.cacheable or "no-store" in said or not deterministic(api, body):
            return self._counted(model, Lookup(BYPASS))
        if route.across_tenants:
            tenant = "*"
        if "no-cache" not in said:
            answer = await self._get(cache_key(tenant, api.path, pool, body))
            if answer is not None:
                return self._counted(model, Lookup(HIT, answer))
        keep = Keep(self, tenant, api.path, body, pool, route.ttl)
        return self._counted(model, Lookup(MISS, keep=keep))

    async def _get(self, key: str) -> KeptAnswer | None:
        answer = self.memory.get(key)
        if answer is None and self.redis is not None:
            answer = await self.redis.get(key)
            if answer is not None:
                self.memory.put(key, answer)
        return answer

    def put(self, key: str, data: bytes, stream: bool, ttl: float) -> None:
        if len(data) > self.settings.max_entry or ttl <= 0:
            return
        now = time.time()
        answer = KeptAnswer(data, stream, now, now + ttl)
        evictions = self.memory.evictions
        self.memory.put(key, answer)
        if self.redis is not None:
            self.redis.put(key, answer)
        self.kept.labels("answers").inc()
        self.kept.labels("bytes").inc(len(data))
        self.evicted.inc(self.memory.evictions - evictions)
        self.size.set(self.memory.bytes)

    def _counted(self, model: str, lookup: Lookup) -> Lookup:
        self.lookups.labels(model, lookup.verdict).inc()
        return lookup

    async def close(self) -> None:
        for store in (*self._retired, *([self.redis] if self.redis else [])):
            await store.close()
        self._retired.clear()
