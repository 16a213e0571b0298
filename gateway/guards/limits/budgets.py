"""Spend budgets as buckets of the limiter: one per budget, matched value and calendar period.

A budget's bucket holds its limit in the policy's currency and never refills; its key names the
UTC day or month (``budget:acme-month:acme:2026-12``), so the next period starts a new, full
bucket, and the store forgets the old one a day after it ended. A request takes what it may
cost at most (the limiter's token estimate at the model's prices: its prompt at the uncached
price, its output limit at the output price), all or nothing with its rate limits, and the
real cost is settled when its usage is known.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.base.errors import GatewayError
from gateway.base.identity import Identity
from gateway.guards.limits.buckets import BucketSpec
from policies.spend_section import Budget, Price, Spend

REMAINING_HEADER = "x-kvgate-spend-remaining"
ADJECTIVE = {"day": "daily", "month": "monthly"}


class BudgetSpent(GatewayError):
    """A budget cannot pay for the request (429, as OpenAI's ``insufficient_quota``; the
    official clients are told not to retry: the budget renews with its period)."""

    status, type, code = 429, "insufficient_quota", "insufficient_quota"


def period_bounds(period: str, now: datetime) -> tuple[str, datetime]:
    """The calendar period holding ``now`` (UTC): its name and when the next one starts."""
    return _period_of_day(period, now.replace(hour=0, minute=0, second=0, microsecond=0))


@functools.lru_cache(maxsize=16)
def _period_of_day(period: str, day: datetime) -> tuple[str, datetime]:
    """``period_bounds`` of a day's midnight (formatted once a day, not per request)."""
    if period == "day":
        return day.strftime("%Y-%m-%d"), day + timedelta(days=1)
    first = day.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return first.strftime("%Y-%m"), following


def matched(budget: Budget, identity: Identity) -> str | None:
    """The value ``budget`` counts this caller under (its tenant or key), None when it does
    not apply."""
    value = identity.tenant if budget.scope == "tenant" else identity.principal
    if not value or (budget.match != "*" and budget.match != value):
        return None
    return value


@dataclass(frozen=True, slots=True)
class BudgetBucket:
    """One budget's bucket for one caller and period."""

    spec: BucketSpec
    budget: Budget
    value: str  # the tenant or key it counts
    renews: datetime  # when its period ends


def budget_buckets(
    spend: Spend, identity: Identity | None, cost: float, now: datetime
) -> list[BudgetBucket]:
    """The buckets of the budgets that apply to this caller, each taking ``cost``."""
    if identity is None:
        return []
    buckets = []
    for budget in spend.budgets:
        value = matched(budget, identity)
        if value is None:
            continue
        name, renews = period_bounds(budget.period, now)
        ttl = int((renews - now).total_seconds()) + 86400
        key = f"budget:{budget.name}:{value}:{name}"
        spec = BucketSpec(key, budget.limit, cost, period=math.inf, ttl=ttl)
        buckets.append(BudgetBucket(spec, budget, value, renews))
    return buckets


def most_cost(price: Price | None, prompt: int, output: int) -> float:
    """What a request of ``prompt`` (estimated) and at most ``output`` tokens may cost."""
    return 0.0 if price is None else price.cost(prompt, 0, output)


def refusal(
    spend: Spend, buckets: list[BudgetBucket], levels: tuple[float, ...]
) -> BudgetSpent | None:
    """The error for the first of ``buckets`` whose level cannot pay its cost (None: all can)."""
    for bucket, level in zip(buckets, levels, strict=True):
        spec, budget = bucket.spec, bucket.budget
        if level < spec.cost:
            currency, whose = spend.currency, f"{budget.scope} {bucket.value}"
            return BudgetSpent(
                f"The {ADJECTIVE[budget.period]} budget `{budget.name}` of {whose} "
                f"({budget.limit:g} {currency}) has {max(level, 0.0):.6f} {currency} left; "
                f"this request may cost up to {spec.cost:.6f}. It renews at "
                f"{bucket.renews.isoformat()}.",
                headers={"x-should-retry": "false", REMAINING_HEADER: _amount(level)},
            )
    return None


def remaining_header(levels: tuple[float, ...]) -> dict[str, str]:
    """``x-kvgate-spend-remaining``: the least any of the caller's budgets has left."""
    return {REMAINING_HEADER: _amount(min(levels))} if levels else {}


def _amount(level: float) -> str:
    return f"{max(level, 0.0):.6f}"
