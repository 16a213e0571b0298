"""Everything derived from one policy, swapped atomically when the policy is reloaded.

A request reads ``GatewayState.current`` once, when it arrives, and keeps that runtime to the
end, so a reload never changes a request half-way. What carries state is reused when its part of the
policy did not change: an endpoint's breaker and in-flight count, a pool's retry budget, the
embedded picker (metrics, prefix index) and the limiter's buckets.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field

from opentelemetry import trace

from epp.datalayer.upstream_tls import upstream_tls
from epp.metrics import EppMetrics
from epp.service import EppService
from gateway.base.forwarded import ClientAddress
from gateway.base.metrics import GatewayMetrics
from gateway.guards.auth import Authenticator
from gateway.guards.limits.limiter import Limiter
from gateway.guards.remote_jwks import RemoteKeySets
from gateway.request.upstream import UpstreamCall
from gateway.routing.adapter_placement import AdapterPlacement
from gateway.routing.breaker import RetryBudget
from gateway.routing.embedded_epp import EmbeddedEpp
from gateway.routing.endpoint_picker import (
    EndpointPicker,
    EndpointState,
    LeastInFlightPicker,
    endpoint_states,
)
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.schema import Policy, Pool


@dataclass(eq=False)
class Runtime:
    """What the request path reads for one policy, all of it built by ``build_runtime``."""

    policy: Policy
    authenticator: Authenticator
    endpoints: dict[str, list[EndpointState]]
    picker: EndpointPicker
    limiter: Limiter
    budgets: dict[str, RetryBudget]
    embedded: EmbeddedEpp | None
    calls: dict[str, UpstreamCall]  # per pool: what sending to it needs
    client_address: ClientAddress
    # how each https:// endpoint is dialled (by address): also told to the connection pool
    upstream_tls: dict[str, tuple[ssl.SSLContext, str]] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.time)


def dead_pools(runtime: Runtime) -> list[str]:
    """The pools none of whose endpoints can take a request now: every breaker open, or (with
    the embedded picker) every endpoint's metrics unreachable."""
    dead = []
    for name, states in runtime.endpoints.items():
        if states and all(not s.breaker.closed and not s.breaker.available() for s in states):
            dead.append(name)
        elif runtime.embedded is not None:
            endpoints = runtime.embedded.service.datastore.endpoints(name)
            if endpoints and not any(e.healthy for e in endpoints):
                dead.append(name)
    return dead


@dataclass(frozen=True, eq=False)
class RuntimeParts:
    """What outlives a policy: the app's metrics, upstream connections and tracer."""

    metrics: GatewayMetrics
    epp_metrics: EppMetrics
    upstreams: ConnectionPool
    tracer: trace.Tracer | None = None
    key_sets: RemoteKeySets = field(default_factory=RemoteKeySets)  # issuers' jwks_url keys


def build_runtime(
    policy: Policy,
    parts: RuntimeParts,
    previous: Runtime | None = None,
    picker: EndpointPicker | None = None,
) -> Runtime:
    """Everything ``policy`` needs on the request path; what carries state is taken from
    ``previous`` where its part of the policy did not change."""
    metrics = parts.metrics
    endpoints = endpoint_states(
        policy, lambda endpoint, state: metrics.breaker_changed(endpoint.address, state.value)
    )
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
            service = EppService(policy, parts.epp_metrics)
            embedded = EmbeddedEpp(policy, endpoints, service)
        picker = embedded
    adapters = {
        name: _adapter_placement(pool, parts, previous)
        for name, pool in policy.pools.items()
        if pool.adapter_paths
    }
    if embedded is not None:
        for name, placement in adapters.items():
            embedded.service.share_loaded_adapters(
                name, placement.placed_on, placement.max_adapters
            )
    tls = upstream_tls(policy)
    for address, (context, server_name) in tls.items():
        parts.upstreams.use_tls(address, context, server_name)
    limiter = Limiter(policy.limits, workers=policy.listen.workers, spend=policy.spend)
    if (
        previous is not None
        and previous.policy.limits == policy.limits
        and previous.policy.spend == policy.spend
    ):
        limiter = previous.limiter
    chosen = picker or LeastInFlightPicker(endpoints)
    calls = {
        name: UpstreamCall(
            parts.upstreams,
            chosen,
            parts.metrics,
            policy.timeouts,
            policy.retries,
            parts.tracer,
            endpoints[name],
            budgets[name],
            adapters.get(name),
        )
        for name in policy.pools
    }
    return Runtime(
        policy,
        Authenticator(policy, parts.key_sets),
        endpoints,
        chosen,
        limiter,
        budgets,
        embedded,
        calls,
        ClientAddress(policy.listen.trusted_proxies, "https" if policy.listen.tls else "http"),
        tls,
    )


def _adapter_placement(
    pool: Pool, parts: RuntimeParts, previous: Runtime | None
) -> AdapterPlacement:
    """The pool's adapter placement: the previous policy's while the pool did not change (what
    it loaded where stays known)."""
    if previous is not None and previous.policy.pools.get(pool.name) == pool:
        kept = previous.calls[pool.name].adapters
        if kept is not None:
            return kept
    return AdapterPlacement(pool, parts.upstreams, parts.metrics)


def _identity(state: EndpointState) -> tuple[object, ...]:
    """What makes two endpoint entries the same upstream (hashable)."""
    e = state.endpoint
    return (state.pool, e.address, e.role, tuple(sorted(e.labels.items())), e.kv_events_port)
