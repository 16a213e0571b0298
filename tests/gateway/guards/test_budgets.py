"""Spend budgets as the limiter's buckets: calendar periods, who a budget counts, what a
request is charged at admission and settled to, and the refusal when a budget cannot pay."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from gateway.base.identity import Identity
from gateway.guards.limits.buckets import BucketSpec, MemoryStore, reset_seconds
from gateway.guards.limits.budgets import BudgetSpent, budget_buckets, period_bounds
from gateway.guards.limits.limiter import Limiter
from policies.schema import Limits
from policies.spend_section import Budget, Price, Spend

ACME = Identity("acme", principal="acme-key")
PRICE = Price(input=2.0, output=8.0, cached_input=0.5)  # per million tokens
BODY = {"model": "m", "prompt": "x" * 4000, "max_tokens": 1000}  # 1,000 + 1,000 tokens


def test_a_request_costs_its_uncached_cached_and_output_tokens() -> None:
    assert PRICE.cost(prompt=1000, cached=400, completion=100) == pytest.approx(
        (600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6
    )
    assert PRICE.cost(prompt=10, cached=50, completion=0) == pytest.approx(10 * 0.5 / 1e6)


@pytest.mark.parametrize(
    ("period", "now", "name", "renews"),
    [
        ("day", datetime(2026, 12, 5, 17, 3, tzinfo=UTC), "2026-12-05", datetime(2026, 12, 6)),
        ("month", datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "2026-12", datetime(2027, 1, 1)),
        ("month", datetime(2027, 2, 1, tzinfo=UTC), "2027-02", datetime(2027, 3, 1)),
    ],
)
def test_periods_are_utc_calendar_days_and_months(
    period: str, now: datetime, name: str, renews: datetime
) -> None:
    assert period_bounds(period, now) == (name, renews.replace(tzinfo=UTC))


def test_a_budget_counts_its_tenant_or_key_and_each_period_has_its_own_bucket() -> None:
    spend = Spend(
        budgets=(
            Budget("each-tenant", "tenant", "*", "day", 5.0),
            Budget("acme", "tenant", "acme", "month", 100.0),
            Budget("other-key", "key", "other-key", "day", 1.0),
        )
    )
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)
    keys = [b.spec.key for b in budget_buckets(spend, ACME, 0.25, now)]
    assert keys == ["budget:each-tenant:acme:2026-12-05", "budget:acme:acme:2026-12"]
    tomorrow = datetime(2026, 12, 6, 0, 0, 1, tzinfo=UTC)
    assert budget_buckets(spend, ACME, 0.25, tomorrow)[0].spec.key.endswith("2026-12-06")
    assert budget_buckets(spend, None, 0.25, now) == []  # nobody to count


def test_a_budget_bucket_never_refills() -> None:
    store = MemoryStore()
    spec = BucketSpec("b", capacity=1.0, cost=0.6, period=math.inf)
    assert store.take_now([spec], 0.0).allowed
    refused = store.take_now([spec], 10**6)
    assert not refused.allowed and refused.retry_after == math.inf
    assert reset_seconds(0.4, spec) == math.inf


def limiter(limit: float) -> Limiter:
    budget = Budget("acme-day", "tenant", "acme", "day", limit)
    return Limiter(Limits(), spend=Spend(prices={"m": PRICE}, budgets=(budget,)))


async def test_a_request_is_charged_its_most_cost_and_settled_to_its_real_one() -> None:
    lim = limiter(0.05)
    reservation = await lim.reserve(ACME, "m", "/v1/completions", BODY)
    assert reservation is not None
    most = (1000 * 2.0 + 1000 * 8.0) / 1e6
    assert reservation.cost == pytest.approx(most)
    assert float(reservation.headers["x-kvgate-spend-remaining"]) == pytest.approx(0.05 - most)
    real = PRICE.cost(1000, 0, 10)
    lim.settle(reservation, 1010, real)
    after = await lim.reserve(ACME, "m", "/v1/completions", BODY)
    assert after is not None
    left = 0.05 - real - most
    assert float(after.headers["x-kvgate-spend-remaining"]) == pytest.approx(left, abs=1e-6)


async def test_a_budget_that_cannot_pay_refuses_with_when_it_renews() -> None:
    lim = limiter(0.015)  # one request's most cost is 0.01
    assert await lim.reserve(ACME, "m", "/v1/completions", BODY) is not None
    with pytest.raises(BudgetSpent) as refused:
        await lim.reserve(ACME, "m", "/v1/completions", BODY)
    error = refused.value
    assert (error.status, error.code) == (429, "insufficient_quota")
    assert error.headers["x-should-retry"] == "false"
    assert "daily budget `acme-day` of tenant acme (0.015 USD) has 0.005000 USD left" in str(error)
    assert "renews at" in str(error)
    # a smaller request still fits, and an unpriced model costs nothing
    small = await lim.reserve(ACME, "m", "/v1/completions", {**BODY, "max_tokens": 100})
    assert small is not None
    assert await lim.reserve(ACME, "unpriced", "/v1/completions", BODY) is not None


async def test_a_request_that_was_never_answered_is_refunded_whole() -> None:
    lim = limiter(0.015)
    reservation = await lim.reserve(ACME, "m", "/v1/completions", BODY)
    lim.settle(reservation, None, 0.0)  # failed before any byte: nothing spent
    assert await lim.reserve(ACME, "m", "/v1/completions", BODY) is not None


async def test_a_cjk_prompt_is_estimated_from_its_bytes_not_its_characters() -> None:
    lim = limiter(1.0)
    cjk = {"model": "m", "prompt": "長" * 400, "max_tokens": 1}  # 400 characters, 1,200 bytes
    assert lim.estimate_parts(cjk) == (300, 1)  # 1,200 bytes / 4 (characters / 4 said 100)


async def test_the_pools_tokenizer_counts_the_prompt_where_it_is_known() -> None:
    lim = limiter(1.0)
    reservation = await lim.reserve(ACME, "m", "/v1/completions", BODY, None, lambda: 1234)
    assert reservation is not None
    assert reservation.estimate == 1234 + 1000
    assert reservation.cost == pytest.approx((1234 * 2.0 + 1000 * 8.0) / 1e6)


async def test_the_output_reserved_per_sample_is_what_the_engine_is_told() -> None:
    lim = limiter(1.0)
    reservation = await lim.reserve(ACME, "m", "/v1/completions", {**BODY, "n": 3})
    assert reservation is not None and reservation.output_limit == 1000
    unlimited = {"model": "m", "prompt": "hi"}
    reservation = await lim.reserve(ACME, "m", "/v1/completions", unlimited, 300)
    assert reservation is not None and reservation.output_limit == 300  # the context's room
