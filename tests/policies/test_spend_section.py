"""``spend:``: prices per model (cached input at the input price unless given) and budgets per
tenant or key, each needing exactly one of them, a period and a limit."""

from __future__ import annotations

import pytest

from policies.errors import PolicyError
from policies.loader import load_policy_text
from policies.spend_section import Budget, Price

BASE = "pools: {a: {endpoints: [127.0.0.1:8001]}}\nroutes: [{model: m, pool: a}]\n"


def test_prices_and_budgets_load() -> None:
    policy = load_policy_text(
        BASE
        + "spend:\n"
        + "  currency: EUR\n"
        + "  prices: {m: {input: 0.5, output: 1.5}, n: {input: 1, output: 2, cached_input: 0.1}}\n"
        + "  budgets:\n"
        + "    - {tenant: '*', per: day, limit: 20}\n"
        + "    - {name: ci, key: ci-bot, per: month, limit: 5}\n"
    )
    spend = policy.spend
    assert spend.currency == "EUR"
    assert spend.prices == {"m": Price(0.5, 1.5, 0.5), "n": Price(1.0, 2.0, 0.1)}
    assert spend.budgets == (
        Budget("tenant-each-day", "tenant", "*", "day", 20.0),
        Budget("ci", "key", "ci-bot", "month", 5.0),
    )


@pytest.mark.parametrize(
    ("fragment", "error"),
    [
        (
            "spend: {budgets: [{tenant: a, key: b, per: day, limit: 1}]}",
            "spend.budgets[0] (line 3): needs exactly one of tenant, key",
        ),
        (
            "spend: {budgets: [{tenant: a, per: week, limit: 1}]}",
            "spend.budgets[0].per (line 3): must be one of day, month; got 'week'",
        ),
        (
            "spend: {prices: {m: {input: -1, output: 1}}}",
            "spend.prices.m.input (line 3): must be at least 0.0; got -1.0",
        ),
        (
            "spend: {budgets: [{tenant: a, per: day, limit: 1}, {tenant: a, per: day, limit: 2}]}",
            "spend.budgets[1].name (line 3): budget name 'tenant-a-day' is used twice",
        ),
    ],
)
def test_a_wrong_spend_is_an_error_naming_its_field(fragment: str, error: str) -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy_text(BASE + fragment)
    assert raised.value.errors == [error]
