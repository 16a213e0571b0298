"""Everything derived from one policy, swapped atomically when the policy is reloaded.

A request reads ``holder.current`` once, when it arrives, and keeps that runtime to the end, so
a reload never changes a request half-way. What carries state is reused when its part of the
policy did not change: an endpoint's breaker and in-flight count, a pool's retry budget, the
embedded picker (metrics, prefix index) and the limiter's buckets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from epp.metrics import EppMetrics
from epp.service import EppService
from gateway.auth import Authenticator
from gateway.breaker import RetryBudget
from gateway.embedded_epp import EmbeddedEpp
from gateway.limits.limiter import Limiter
from gateway.metrics import GatewayMetrics
from gateway.picker import EndpointState, LeastInFlightPicker, Picker, endpoint_states
from gateway.upstream import UpstreamCall
from policies.schema import Policy


@dataclass(eq=False)
class Runtime:
    policy: Policy
    authenticator: Authenticator
    endpoints: dict[str, list[EndpointState]]
    picker: Picker
    limiter: Limiter
    budgets: dict[str, RetryBudget]
    embedded: EmbeddedEpp | None
    loaded_at: float = field(default_factory=time.time)
    calls: dict[str, UpstreamCall] = field(default_factory=dict)  # per pool, made on first use


@dataclass(eq=False)
class RuntimeHolder:
    current: Runtime
    version: int = 1


def build_runtime(
    policy: Policy,
    metrics: GatewayMetrics,
    epp_metrics: EppMetrics,
    previous: Runtime | None = None,
    picker: Picker | None = None,
) -> Runtime:
    endpoints = endpoint_states(policy, metrics.breaker_changed)
    if previous is not None:
        old = {_identity(s): s for pool in previous.endpoints.values() for s in pool}
        endpoints = {
            name: [old.get(_identity(s), s) for s in states] for name, states in endpoints.items()
        }
    budgets = {
        name: previous.budgets[name]
        if previous is not None and name in previous.budgets
        else RetryBudget(policy.retries.budget_ratio, policy.retries.min_retries_per_second)
        for name in policy.pools
    }
    embedded: EmbeddedEpp | None = None
    if picker is None and policy.epp.picker == "epp":
        same_picker = (
            previous is not None
            and previous.embedded is not None
            and previous.policy.pools == policy.pools
            and previous.policy.epp == policy.epp
        )
        if same_picker and previous is not None:
            embedded = previous.embedded
        else:
            service = EppService(policy, epp_metrics)
            embedded = EmbeddedEpp(policy, endpoints, service)
        picker = embedded
    limiter = Limiter(policy.limits, workers=policy.listen.workers)
    if previous is not None and previous.policy.limits == policy.limits:
        limiter = previous.limiter
    return Runtime(
        policy,
        Authenticator(policy),
        endpoints,
        picker or LeastInFlightPicker(endpoints),
        limiter,
        budgets,
        embedded,
    )


def _identity(state: EndpointState) -> tuple[object, ...]:
    """What makes two endpoint entries the same upstream (hashable)."""
    e = state.endpoint
    return (state.pool, e.address, e.role, tuple(sorted(e.labels.items())), e.kv_events_port)
