"""``response_cache:`` and a route's ``cache:``: defaults, the limits' Redis as the default
store, and the errors a wrong value gets."""

from __future__ import annotations

import pytest

from policies.cache_section import RouteCache
from policies.errors import PolicyError
from policies.loader import load_policy_text

POOLS = "pools: {a: {endpoints: [127.0.0.1:8001]}}\n"


def test_a_route_opts_in_with_the_stores_ttl_or_its_own() -> None:
    policy = load_policy_text(
        POOLS
        + "response_cache: {ttl: 1m, max_bytes: 8MiB}\n"
        + "routes:\n"
        + "  - {model: m, pool: a, cache: true}\n"
        + "  - {model: n, pool: a, cache: {ttl: 1h, across_tenants: true}}\n"
        + "  - {model: o, pool: a}\n"
    )
    caches = [route.cache for route in policy.routes]
    assert caches == [RouteCache(60.0), RouteCache(3600.0, True), None]
    assert (policy.response_cache.store, policy.response_cache.max_bytes) == ("memory", 8 << 20)


def test_the_redis_store_defaults_to_the_limits_redis() -> None:
    policy = load_policy_text(
        POOLS
        + "routes: [{model: m, pool: a, cache: true}]\n"
        + "limits: {store: {kind: redis, url: 'redis://127.0.0.1:6379/0'}}\n"
        + "response_cache: {store: redis}\n"
    )
    assert policy.response_cache.url == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("fragment", "error"),
    [
        (
            "response_cache: {store: redis}",
            "response_cache.url (line 3): is required for the redis store without limits.store.url",
        ),
        (
            "response_cache: {max_bytes: 1KiB, max_entry: 1MiB}",
            "response_cache.max_entry (line 3): must not be larger than max_bytes",
        ),
        (
            "response_cache: {store: disk}",
            "response_cache.store (line 3): must be one of memory, redis; got 'disk'",
        ),
    ],
)
def test_a_wrong_store_is_an_error_naming_its_field(fragment: str, error: str) -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy_text(POOLS + "routes: [{model: m, pool: a}]\n" + fragment)
    assert raised.value.errors == [error]


def test_a_wrong_route_cache_is_an_error_naming_its_field() -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy_text(POOLS + "routes:\n  - {model: m, pool: a, cache: yes please}\n")
    assert raised.value.errors == [
        "routes[0].cache (line 3): must be true, false or a mapping (ttl, across_tenants)"
    ]
