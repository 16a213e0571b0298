"""What an answered request cost at the policy's prices: counted in ``kvgate_spend_total``
and settled with the budgets that were charged the most it could cost. Nothing served
(refused, failed before a byte) costs nothing; whatever the client did, what the engine
generated for it is counted (``settled_cost`` says from what)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.base.context import RequestContext
from gateway.base.metrics import GatewayMetrics
from policies.spend_section import Price


def served(ctx: RequestContext) -> bool:
    """Whether the request was answered: a first byte reached the client, and not a refusal
    (an engine's 400 for a prompt too long, a relayed 5xx: nothing generated, nothing owed)."""
    return ctx.ttft is not None and ctx.status < 400


def settled_cost(
    price: Price, ctx: RequestContext, metrics: GatewayMetrics, most: Callable[[], float]
) -> float:
    """The request's cost, counted by tenant, key, model and route: from its usage when known
    (the engine's final usage; for a stream cut short, what the engine's token ids or counts
    say it sent); 0 when nothing was served; else ``most()``, the most it could cost (what its
    budgets reserved: a Messages stream cut before its final usage, a stream with no ids)."""
    if ctx.usage_known:
        cost = price.cost(ctx.prompt_tokens, ctx.cached_tokens, ctx.completion_tokens)
    elif served(ctx):
        cost = most()
    else:
        return 0.0
    principal = ctx.identity.principal if ctx.identity is not None else ""
    metrics.child(metrics.spend, ctx.tenant, principal, ctx.model, ctx.route).inc(cost)
    return cost
