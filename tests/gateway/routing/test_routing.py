"""Canary splits, sticky A/B assignment, and route validation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.base.identity import Identity
from gateway.routing.selector import ab_bucket, select
from policies.errors import PolicyError
from policies.loader import load_policy_text

POLICY = """
pools:
  a: {endpoints: [127.0.0.1:1]}
  b: {endpoints: [127.0.0.1:2]}
routes:
  - {model: canary, canary: [{pool: a, weight: 95}, {pool: b, weight: 5}]}
  - model: ab
    ab_test: {name: exp, key: user, arms: [{name: control, pool: a, weight: 2500}, {name: treat, pool: b, weight: 7500}]}
  - {model: hdr, ab_test: {name: h, key: "header:x-user", arms: [{pool: a, weight: 5000}, {pool: b, weight: 5000}]}}
"""


@pytest.fixture(scope="module")
def routes() -> dict[str, object]:
    policy = load_policy_text(POLICY)
    return {r.model: r for r in policy.routes}


def test_canary_split_within_two_percent(routes: dict[str, object]) -> None:
    rng = random.Random(7)
    picks = Counter(select(routes["canary"], {}, {}, None, rng).pool for _ in range(10_000))  # type: ignore[arg-type]
    assert abs(picks["b"] / 10_000 - 0.05) <= 0.02
    assert abs(picks["a"] / 10_000 - 0.95) <= 0.02


def test_ab_assignment_is_sticky_and_splits_within_one_percent(routes: dict[str, object]) -> None:
    arms: Counter[str | None] = Counter()
    for user in range(100_000):
        body = {"user": f"user-{user}"}
        first = select(routes["ab"], body, {}, None)  # type: ignore[arg-type]
        arms[first.ab_arm] += 1
        if user % 1000 == 0:
            assert select(routes["ab"], body, {}, None) == first  # type: ignore[arg-type]
    assert abs(arms["exp=treat"] / 100_000 - 0.75) <= 0.01
    assert abs(arms["exp=control"] / 100_000 - 0.25) <= 0.01


def test_ab_key_from_header_or_caller(routes: dict[str, object]) -> None:
    by_header = {select(routes["hdr"], {}, {"x-user": "u1"}, None).ab_arm for _ in range(5)}  # type: ignore[arg-type]
    assert len(by_header) == 1
    caller = Identity("acme", principal="acme-key")
    no_user = {select(routes["ab"], {}, {}, caller).ab_arm for _ in range(5)}  # type: ignore[arg-type]
    assert len(no_user) == 1  # falls back to the caller's key: still sticky
    assert 0 <= ab_bucket("exp", "x") < 10_000


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("{model: m}", "needs exactly one of pool, canary, ab_test"),
        ("{model: m, pool: a, canary: [{pool: b, weight: 1}]}", "needs exactly one of"),
        ("{model: m, canary: [{pool: nope, weight: 1}]}", "unknown pool 'nope'"),
        (
            "{model: m, ab_test: {name: t, arms: [{pool: a, weight: 50}, {pool: b, weight: 40}]}}",
            "must sum to 10000",
        ),
        (
            "{model: m, ab_test: {name: t, key: cookie, arms: [{pool: a, weight: 10000}]}}",
            "must be 'user' or 'header:<name>'",
        ),
        ("{model: m, pool: a, fallback: [other]}", "'other' is not another routed model"),
        ("{model: m, pool: a, shadow: {pool: b, sample: 2}}", "must be at most 1.0"),
        (
            "{model: m, pool: a, shadow: {pool: b, sample: 0.1, compare: [vibes]}}",
            "unknown comparison 'vibes'",
        ),
    ],
)
def test_route_validation(route: str, expected: str) -> None:
    text = (
        "pools: {a: {endpoints: [127.0.0.1:1]}, b: {endpoints: [127.0.0.1:2]}}\nroutes:\n  - "
        + route
        + "\n"
    )
    with pytest.raises(PolicyError) as err:
        load_policy_text(text)
    assert any(expected in e for e in err.value.errors), err.value.errors
