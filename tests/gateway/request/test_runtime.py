"""What a reload keeps: breakers and in-flight counts of unchanged endpoints, retry budgets."""

from __future__ import annotations

from epp.metrics import EppMetrics
from gateway.base.metrics import GatewayMetrics
from gateway.request.runtime import RuntimeParts, build_runtime
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.loader import load_policy_text

BEFORE = """
pools: {p: {endpoints: [127.0.0.2:1, {address: 127.0.0.2:2, labels: {zone: a}}]}}
routes: [{model: m, pool: p}]
epp: {picker: least-in-flight}
"""
AFTER = BEFORE.replace("127.0.0.2:1", "127.0.0.2:3")


def test_unchanged_endpoints_keep_their_state() -> None:
    parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
    first = build_runtime(load_policy_text(BEFORE), parts)
    kept = first.endpoints["p"][1]
    kept.in_flight = 3
    second = build_runtime(load_policy_text(AFTER), parts, previous=first)
    assert second.endpoints["p"][1] is kept and second.endpoints["p"][1].in_flight == 3
    assert second.endpoints["p"][0] is not first.endpoints["p"][0]  # a new address: fresh state
    assert second.budgets["p"] is first.budgets["p"]
    assert second.limiter is first.limiter  # limits unchanged
