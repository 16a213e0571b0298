"""What an answered request cost at the policy's prices: counted in ``kvgate_spend_total``
and settled with the budgets that were charged the most it could cost."""

from __future__ import annotations

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from policies.spend_section import Price


def settled_cost(price: Price, ctx: RequestContext, metrics: GatewayMetrics) -> float | None:
    """The request's real cost, counted by tenant, key, model and route, when its usage is
    known; 0 when nothing was answered (no byte reached the client); None when the answer
    broke off without usage (the budgets keep what they were charged)."""
    if not ctx.usage_known:
        return 0.0 if ctx.ttft is None else None
    cost = price.cost(ctx.prompt_tokens, ctx.cached_tokens, ctx.completion_tokens)
    principal = ctx.identity.principal if ctx.identity is not None else ""
    metrics.child(metrics.spend, ctx.tenant, principal, ctx.model, ctx.route).inc(cost)
    return cost
