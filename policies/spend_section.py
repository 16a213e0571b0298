"""``spend:``: what tokens cost, per public model, and the budgets tenants and keys may spend.

Prices are per million tokens, in ``currency``: ``input`` (prompt tokens the engine computed),
``cached_input`` (prompt tokens its prefix cache held; ``input`` when not given) and
``output``. A budget caps what a tenant (or each tenant, ``tenant: "*"``) or an API key (its
name; ``key: "*"``: each key) spends per calendar ``day`` or ``month`` (UTC); it is kept where
the limits keep their buckets (``limits.store``), so replicas sharing that Redis share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.fields import Fields, child

PERIODS = ("day", "month")


@dataclass(frozen=True)
class Price:
    """Per million tokens."""

    input: float
    output: float
    cached_input: float

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        """What one request's tokens cost (``cached``: of the prompt's, those found cached)."""
        cached = min(max(cached, 0), prompt)
        return (
            (prompt - cached) * self.input + cached * self.cached_input + completion * self.output
        ) / 1e6


@dataclass(frozen=True)
class Budget:
    name: str
    scope: str  # tenant | key
    match: str  # the tenant or key name; "*": each its own
    period: str  # day | month
    limit: float  # in the currency


@dataclass(frozen=True)
class Spend:
    currency: str = "USD"
    prices: Mapping[str, Price] = field(default_factory=dict)  # by public model
    budgets: tuple[Budget, ...] = ()


def load_spend(top: Fields) -> Spend:
    f = top.sub("spend", {"currency", "prices", "budgets"})
    prices = {}
    for path, model, item in f.entries("prices"):
        p = Fields(f.source, item, path, {"input", "output", "cached_input"})
        price = p.number("input", low=0.0)
        cached = p.number("cached_input", low=0.0) if p.has("cached_input") else price
        prices[model] = Price(price, p.number("output", low=0.0), cached)
    budgets: list[Budget] = []
    for path, item in f.items("budgets"):
        b = Fields(f.source, item, path, {"name", "tenant", "key", "per", "limit"})
        scopes = [scope for scope in ("tenant", "key") if b.has(scope)]
        if len(scopes) != 1:
            b.error(path, "needs exactly one of tenant, key")
            continue
        scope = scopes[0]
        match = b.text(scope)
        period = b.text("per", choices=PERIODS)
        name = b.text("name", f"{scope}-{match}-{period}".replace("*", "each"))
        if name in {budget.name for budget in budgets}:
            b.error(child(path, "name"), f"budget name {name!r} is used twice")
        budgets.append(Budget(name, scope, match, period, b.number("limit", low=0.0)))
    return Spend(f.text("currency", "USD"), prices, tuple(budgets))
