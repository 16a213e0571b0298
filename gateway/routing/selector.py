"""Which pool serves a request of a route: its pool, a canary split or an A/B arm.

Canary: a weighted random choice per request. A/B: sticky — ``xxh64(test name, user id)``
modulo 10,000 falls into an arm's basis-point range, so a user always lands in the same arm;
the user id is the body's ``user`` field or a header, else the caller's key or tenant.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import xxhash

from gateway.base.identity import Identity
from policies.schema import AbTest, Route, WeightedPool


@dataclass(frozen=True, slots=True)
class Selection:
    pool: str
    ab_arm: str | None = None  # "test=arm" for A/B routes


def ab_bucket(test: str, user: str) -> int:
    """The user's fixed position in 0..9,999 for ``test``."""
    return xxhash.xxh64_intdigest(f"{test}\x00{user}".encode()) % 10_000


def ab_arm(test: AbTest, user: str) -> WeightedPool:
    position = ab_bucket(test.name, user)
    upper = 0.0
    for arm in test.arms:
        upper += arm.weight
        if position < upper:
            return arm
    return test.arms[-1]


def ab_user(
    test: AbTest, body: Mapping[str, object], headers: Mapping[str, str], identity: Identity | None
) -> str:
    if test.key == "user":
        user = body.get("user")
        if isinstance(user, str) and user:
            return user
    elif test.key.startswith("header:"):
        value = headers.get(test.key.removeprefix("header:"))
        if value:
            return value
    if identity is not None:
        return identity.principal or identity.tenant
    return ""


def select(
    route: Route,
    body: Mapping[str, object],
    headers: Mapping[str, str],
    identity: Identity | None,
    rng: random.Random = random._inst,
    canary: tuple[WeightedPool, ...] | None = None,
) -> Selection:
    """The pool for this request (``canary``: an automatic canary's weights now, instead of the
    route's)."""
    if route.ab_test is not None:
        arm = ab_arm(route.ab_test, ab_user(route.ab_test, body, headers, identity))
        return Selection(arm.pool, f"{route.ab_test.name}={arm.name}")
    if canary or route.canary:
        pools = canary or route.canary
        chosen = rng.choices(pools, weights=[p.weight for p in pools])[0]
        return _plain(chosen.pool)
    found = _PLAIN.get(route.pool)
    return found if found is not None else _plain(route.pool)


_PLAIN: dict[str, Selection] = {}


def _plain(pool: str) -> Selection:
    """The (immutable, shared) selection of ``pool`` without an A/B arm."""
    found = _PLAIN.get(pool)
    if found is None:
        found = _PLAIN[pool] = Selection(pool)
    return found
