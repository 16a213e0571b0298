"""Token buckets, rule matching, reservations and settlement, and the Redis failure policy."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.base.errors import BadRequest
from gateway.base.identity import Identity
from gateway.guards.limits.buckets import BucketSpec, MemoryStore
from gateway.guards.limits.limiter import (
    Limiter,
    LimiterUnavailable,
    NeverFits,
    RateLimited,
    duration,
)
from kvgate.wire.store_health import FAILURES_TO_DOWN
from loadtest.harness.processes import free_port
from policies.schema import LimitRule, Limits, LimitStore

ACME = Identity("acme", principal="acme-key")


def test_bucket_refills_at_capacity_per_minute() -> None:
    store = MemoryStore()
    spec = BucketSpec("k", capacity=60, cost=30)
    assert store.take_now([spec], 0.0).allowed
    assert store.take_now([spec], 0.0).allowed
    denied = store.take_now([spec], 0.0)
    assert not denied.allowed and denied.retry_after == pytest.approx(30.0)
    assert store.take_now([spec], 30.0).allowed  # 30 s at 1 unit/s


def test_multi_bucket_take_is_all_or_nothing() -> None:
    store = MemoryStore()
    small, big = BucketSpec("a", 10, 8), BucketSpec("b", 100, 8)
    assert store.take_now([small, big], 0.0).allowed
    result = store.take_now([small, big], 0.0)
    assert not result.allowed and result.remaining == (2.0, 92.0)  # b was not charged


def test_forced_take_goes_into_debt_and_refunds() -> None:
    store = MemoryStore()
    assert store.take_now([BucketSpec("t", 60, 50)], 0.0).allowed
    assert store.take_now([BucketSpec("t", 60, 40)], 0.0, force=True).remaining == (-30.0,)
    assert not store.take_now([BucketSpec("t", 60, 1)], 0.0).allowed
    assert store.take_now([BucketSpec("t", 60, -40)], 0.0, force=True).remaining == (10.0,)


def test_share_divides_capacity() -> None:
    store = MemoryStore(share=4)
    spec = BucketSpec("k", capacity=40, cost=1)
    assert sum(store.take_now([spec], 0.0).allowed for _ in range(20)) == 10


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.25, "250ms"), (1, "1s"), (59.6, "1m0s"), (360, "6m0s")]
)
def test_reset_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def limiter(*rules: LimitRule, store: LimitStore | None = None) -> Limiter:
    return Limiter(Limits(store or LimitStore(), rules, default_max_tokens=100))


@pytest.mark.parametrize(
    ("match", "identity", "model", "expected_key"),
    [
        ({"tenant": "*"}, ACME, "m", "tenant=acme"),
        ({"tenant": "acme", "model": "*"}, ACME, "llama", "model=llama|tenant=acme"),
        ({"tenant": "other"}, ACME, "m", None),
        ({}, ACME, "m", ""),
        ({"api_key": "*"}, ACME, "m", "api_key=acme-key"),
        ({"route": "/v1/completions"}, ACME, "m", "route=/v1/completions"),
    ],
)
def test_rule_matching(
    match: dict[str, str], identity: Identity, model: str, expected_key: str | None
) -> None:
    found = limiter(LimitRule("r", match, 10)).matching(identity, model, "/v1/completions")
    assert [key for _, key in found] == ([] if expected_key is None else [expected_key])


def test_estimate_counts_prompt_and_max_tokens() -> None:
    lim = limiter(LimitRule("r", {}, 10))
    assert lim.estimate({"prompt": "x" * 400, "max_tokens": 50}) == 150
    assert lim.estimate({"prompt": "x" * 400}) == 200  # default_max_tokens
    assert lim.estimate({"prompt": "x" * 400, "max_tokens": 50, "n": 4}) == 300  # 4 samples
    assert lim.estimate({"prompt": "x" * 400, "max_tokens": 50, "n": True}) == 150
    assert (
        lim.estimate({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5})
        > 5
    )


async def test_a_request_larger_than_its_bucket_is_refused_at_once() -> None:
    lim = limiter(LimitRule("tpm", {"tenant": "*"}, tokens_per_min=200_000))
    for max_tokens in (1_000_000, 2**53):
        with pytest.raises(NeverFits) as err:
            await lim.reserve(
                ACME, "m", "/v1/completions", {"prompt": "x", "max_tokens": max_tokens}
            )
        assert err.value.status == 429 and "retry-after" not in err.value.headers
        assert err.value.headers["x-should-retry"] == "false"
        assert "Limit 200000, Requested" in err.value.message
    fits = await lim.reserve(ACME, "m", "/v1/completions", {"prompt": "x", "max_tokens": 1000})
    assert fits is not None


async def test_the_estimate_is_capped_at_the_models_context_length() -> None:
    lim = limiter(LimitRule("tpm", {"tenant": "*"}, tokens_per_min=200_000))
    body = {"prompt": "x" * 400, "max_tokens": 1_000_000}
    assert lim.estimate(body, context_length=8192) == 8192  # no request can use more
    assert lim.estimate({"prompt": "x" * 400, "max_tokens": 10}, context_length=8192) == 110
    reservation = await lim.reserve(ACME, "m", "/v1/completions", body, context_length=8192)
    assert reservation is not None and reservation.estimate == 8192
    with pytest.raises(NeverFits):  # a context longer than the bucket still never fits
        await lim.reserve(ACME, "m", "/v1/completions", body, context_length=300_000)


@pytest.mark.parametrize("value", [1e9, 10.5, 0, -3, True, "100"])
def test_an_output_limit_must_be_a_positive_integer(value: object) -> None:
    lim = limiter(LimitRule("r", {}, 10))
    for name in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(BadRequest, match=f"{name} must be a positive integer"):
            lim.estimate({"prompt": "x", name: value})


async def test_reserve_limits_and_reports_headers() -> None:
    lim = limiter(LimitRule("r", {"tenant": "*"}, requests_per_min=2, tokens_per_min=1000))
    body = {"prompt": "x" * 40, "max_tokens": 90}
    first = await lim.reserve(ACME, "m", "/v1/completions", body)
    assert first is not None and first.estimate == 100
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-remaining-tokens"] == "900"
    await lim.reserve(ACME, "m", "/v1/completions", body)
    with pytest.raises(RateLimited) as err:
        await lim.reserve(ACME, "m", "/v1/completions", body)
    assert err.value.status == 429 and int(err.value.headers["retry-after"]) >= 1
    assert await limiter().reserve(ACME, "m", "/v1/completions", body) is None


async def test_settle_refunds_unused_tokens() -> None:
    lim = limiter(LimitRule("r", {}, tokens_per_min=300))
    body = {"prompt": "x" * 40, "max_tokens": 190}  # estimate 200
    reservation = await lim.reserve(ACME, "m", "/", body)
    with pytest.raises(RateLimited):
        await lim.reserve(ACME, "m", "/", body)
    lim.settle(reservation, actual_tokens=20)  # 180 come back
    await asyncio.sleep(0)
    assert await lim.reserve(ACME, "m", "/", body) is not None


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
async def test_unreachable_redis_never_hangs(policy: str) -> None:
    dead = LimitStore(
        kind="redis",
        url=f"redis://127.0.0.1:{free_port()}/0",
        timeout=0.05,
        on_failure=policy,
        replicas=2,
    )
    lim = limiter(LimitRule("r", {}, requests_per_min=10), store=dead)
    started = time.perf_counter()
    if policy == "fail_open":
        results = []
        for _ in range(8):
            try:
                results.append(await lim.reserve(ACME, "m", "/", {}) is not None)
            except RateLimited:
                results.append(False)
        assert results == [True] * 5 + [False] * 3  # half of the limit: this replica's share
        assert lim.status == "degraded"
    else:
        for _ in range(FAILURES_TO_DOWN):  # each refused; the store is down after the last
            assert lim.status == "ok"
            with pytest.raises(LimiterUnavailable):
                await lim.reserve(ACME, "m", "/", {})
        assert lim.status == "down"
    assert time.perf_counter() - started < 0.5
    await lim.close()
