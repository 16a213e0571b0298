"""What a request is billed: its usage when known, nothing when nothing was served (a refusal,
a failure before the first byte), else the most it could cost (what its budgets reserved)."""

from __future__ import annotations

import pytest

from gateway.base.context import RequestContext
from gateway.base.finished_requests import STREAM_BROKEN, outcome_status
from gateway.base.identity import Identity
from gateway.base.metrics import GatewayMetrics
from gateway.guards.spend import served, settled_cost
from policies.spend_section import Price

PRICE = Price(input=0.0, output=1e6, cached_input=0.0)  # a unit a generated token


def answered(status: int = 200, ttft: float | None = 0.1) -> RequestContext:
    ctx = RequestContext("r", "/v1/completions")
    ctx.identity, ctx.model, ctx.status, ctx.ttft = Identity("acme"), "m", status, ttft
    return ctx


def spent(metrics: GatewayMetrics) -> float:
    return sum(
        s.value for m in metrics.spend.collect() for s in m.samples if s.name.endswith("_total")
    )


@pytest.mark.parametrize(
    ("status", "ttft", "usage", "cost"),
    [
        (200, 0.1, (5, 7), 7.0),  # the engine's count
        (200, 0.1, None, 30.0),  # cut with no count: the most it could cost
        (400, 0.1, None, 0.0),  # the engine refused it: nothing served
        (502, 0.1, None, 0.0),  # a relayed 5xx
        (200, None, None, 0.0),  # no byte reached the client
    ],
)
def test_a_request_is_billed_what_was_served(
    status: int, ttft: float | None, usage: tuple[int, int] | None, cost: float
) -> None:
    ctx, metrics = answered(status, ttft), GatewayMetrics()
    if usage is not None:
        ctx.prompt_tokens, ctx.completion_tokens = usage
        ctx.usage_known = True
    assert served(ctx) == (status < 400 and ttft is not None)
    assert settled_cost(PRICE, ctx, metrics, lambda: 30.0) == cost
    assert spent(metrics) == cost


def test_a_stream_broken_after_its_head_counts_as_a_502() -> None:
    ctx = answered()
    assert outcome_status(ctx) == 200
    ctx.error = STREAM_BROKEN
    assert outcome_status(ctx) == 502
    ctx.status, ctx.error = 499, "client_disconnected"
    assert outcome_status(ctx) == 499
