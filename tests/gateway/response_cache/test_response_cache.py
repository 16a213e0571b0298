"""The response cache's rules (what is deterministic, what the caller's Cache-Control says,
what a key is made of) and its memory store (bounded by bytes, each answer until it expires)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from gateway.base.api import COMPLETIONS, EMBEDDINGS, RESPONSES, Api
from gateway.base.context import RequestContext
from gateway.base.identity import Identity
from gateway.response_cache.cache import (
    BYPASS,
    HEADER,
    HIT,
    MISS,
    Lookup,
    ResponseCache,
    cache_key,
    deterministic,
    directives,
    replayed,
)
from gateway.response_cache.stores import KeptAnswer, MemoryAnswers
from loadtest.harness.redis_server import RedisServer
from policies.cache_section import ResponseCacheStore, RouteCache
from policies.schema import EndpointSpec, Policy, Pool


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"temperature": 0.5, "seed": 3}, True),
        ({"temperature": 0.5}, False),
        ({}, False),  # the default temperature samples
        ({"temperature": False}, False),
        ({"seed": True}, False),
        ({"seed": "3"}, False),
    ],
)
def test_only_greedy_or_seeded_sampling_is_deterministic(
    body: dict[str, object], expected: bool
) -> None:
    assert deterministic(COMPLETIONS, body) is expected


def test_an_embedding_is_always_deterministic() -> None:
    assert deterministic(EMBEDDINGS, {"input": "x"})


def test_cache_control_directives_are_read_case_blind() -> None:
    assert directives({"cache-control": "No-Cache, max-age=0"}) == {"no-cache", "max-age=0"}
    assert directives({}) == frozenset()


def test_a_key_ignores_key_order_and_separates_tenants_paths_and_pools() -> None:
    body = {"model": "m", "prompt": "p", "temperature": 0, "stop": {"b": 1, "a": 2}}
    reordered = {"stop": {"a": 2, "b": 1}, "temperature": 0, "prompt": "p", "model": "m"}
    key = cache_key("acme", "/v1/completions", "pool", body)
    assert cache_key("acme", "/v1/completions", "pool", reordered) == key
    others = {
        cache_key("beta", "/v1/completions", "pool", body),
        cache_key("acme", "/v1/chat/completions", "pool", body),
        cache_key("acme", "/v1/completions", "other", body),
        cache_key("acme", "/v1/completions", "pool", {**body, "prompt": "q"}),
        cache_key("", "acme/v1/completions", "pool", body),  # fields do not run together
    }
    assert key not in others and len(others) == 5


def answer(size: int, ttl: float = 60.0) -> KeptAnswer:
    now = time.time()
    return KeptAnswer(b"x" * size, False, now, now + ttl)


def test_the_memory_store_pushes_out_the_least_recently_used_for_room() -> None:
    memory = MemoryAnswers(max_bytes=100)
    memory.put("a", answer(40))
    memory.put("b", answer(40))
    assert memory.get("a") is not None  # b is now the least recently used
    memory.put("c", answer(40))
    assert (memory.get("b"), memory.evictions, memory.bytes) == (None, 1, 80)
    assert memory.get("a") is not None and memory.get("c") is not None


def test_an_answer_is_gone_when_it_expires() -> None:
    memory = MemoryAnswers(max_bytes=100)
    memory.put("short", answer(10, ttl=0.05))
    memory.put("gone", answer(10, ttl=-1.0))
    assert memory.get("short") is not None and memory.get("gone") is None
    time.sleep(0.1)
    assert memory.get("short") is None and memory.evictions == 0


def test_an_answer_goes_to_redis_and_back_whole() -> None:
    kept = KeptAnswer(b"data: {}\n\ndata: [DONE]\n\n", True, 1.5, 2.5)
    assert KeptAnswer.decode(kept.encode()) == kept
    assert KeptAnswer.decode(b"short") is None


def cache_for(registry: CollectorRegistry | None = None, **settings: object) -> ResponseCache:
    cache = ResponseCache(registry or CollectorRegistry())
    pools = {"p": Pool("p", (EndpointSpec("127.0.0.1:1"),))}
    store = ResponseCacheStore(**settings)  # type: ignore[arg-type]
    cache.update(Policy(pools=pools, routes=(), response_cache=store))
    return cache


def context(tenant: str = "acme") -> RequestContext:
    ctx = RequestContext("req-1", "/v1/completions")
    ctx.identity = Identity(tenant)
    ctx.model = "m"
    return ctx


GREEDY = {"model": "m", "prompt": "p", "temperature": 0}


async def look_up(
    cache: ResponseCache,
    tenant: str = "acme",
    pool: str = "p",
    api: Api = COMPLETIONS,
    headers: dict[str, str] | None = None,
    body: dict[str, object] | None = None,
) -> Lookup:
    return await cache.look_up(RouteCache(), api, body or GREEDY, headers or {}, pool, tenant, "m")


async def test_a_kept_answer_is_replayed_with_its_age_and_verdicts() -> None:
    registry = CollectorRegistry()
    cache = cache_for(registry)
    missed = await look_up(cache)
    assert (missed.verdict, missed.answer) == (MISS, None) and missed.keep is not None
    missed.keep.answer(context(), 200, "application/json", b'{"answer": 1}')
    found = await look_up(cache)
    assert (found.verdict, found.keep) == (HIT, None) and found.answer is not None
    hit = replayed(found.answer, {HEADER: HIT})
    assert (hit.body, hit.status) == (b'{"answer": 1}', 200)
    assert dict(hit.headers) == {HEADER: HIT, "age": "0", "content-type": "application/json"}
    assert (await look_up(cache, "beta")).verdict == MISS  # another tenant's
    lookups = "kvgate_response_cache_lookups_total"
    assert registry.get_sample_value(lookups, {"model": "m", "result": "hit"}) == 1
    assert registry.get_sample_value(lookups, {"model": "m", "result": "miss"}) == 2


async def test_only_whole_200_answers_within_the_entry_size_are_kept() -> None:
    cache = cache_for(max_entry=10)
    for status, content_type, data in [
        (400, "application/json", b"{}"),
        (200, "text/plain", b"x"),
        (200, "application/json", b"x" * 11),
    ]:
        keep = (await look_up(cache)).keep
        assert keep is not None
        keep.answer(context(), status, content_type, data)
    ctx = context()
    ctx.status, ctx.error = 200, "upstream_stream_broken"
    keep = (await look_up(cache)).keep
    assert keep is not None
    keep.copy.append(b"data: {}\n\n")
    keep.stream(ctx, copied=True)
    ctx = context()
    ctx.status = 200
    keep = (await look_up(cache)).keep
    assert keep is not None
    keep.stream(ctx, copied=False)  # dropped as it was written: over max_entry
    assert cache.memory.bytes == 0


async def test_an_answer_is_kept_under_the_pool_that_served_it() -> None:
    cache = cache_for()
    ctx = context()
    keep = (await look_up(cache, pool="primary")).keep
    assert keep is not None
    ctx.pool = "fallback"  # the primary was saturated: a fallback model answered
    keep.answer(ctx, 200, "application/json", b'{"from": "fallback"}')
    primary = await look_up(cache, pool="primary")
    assert primary.answer is None  # the primary's requests never get the fallback's answer
    fallback = await look_up(cache, pool="fallback")
    assert fallback.answer is not None and fallback.answer.body == b'{"from": "fallback"}'


async def test_the_callers_directives_and_other_paths_bypass() -> None:
    cache = cache_for()
    for api, headers in [
        (RESPONSES, {}),
        (COMPLETIONS, {"cache-control": "no-store"}),
    ]:
        assert await look_up(cache, api=api, headers=headers) == Lookup(BYPASS)


async def test_answers_in_redis_are_found_by_another_cache(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    first = cache_for(store="redis", url=redis_server.url)
    second = cache_for(registry, store="redis", url=redis_server.url)
    keep = (await look_up(first)).keep
    assert keep is not None
    keep.answer(context(), 200, "application/json", b'{"shared": true}')
    await asyncio.sleep(0.2)  # the write is in the background
    hit = (await look_up(second)).answer
    assert hit is not None and hit.body == b'{"shared": true}'
    redis_server.stop()
    missed = await look_up(second, body={**GREEDY, "n": 1})
    assert missed.answer is None and missed.verdict == MISS
    assert registry.get_sample_value("kvgate_response_cache_store_errors_total") == 1
    await first.close()
    await second.close()
