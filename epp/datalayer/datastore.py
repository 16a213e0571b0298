"""The endpoints of every pool, from the policy file, with their latest metrics."""

from __future__ import annotations

from epp.datalayer.metrics_parser import names_for
from epp.framework import Endpoint, EndpointMetadata
from policies.schema import Policy


class Datastore:
    """The endpoints of every pool, as listed by the policy, with their latest scraped metrics."""

    def __init__(self, policy: Policy) -> None:
        self.pools: dict[str, list[Endpoint]] = {
            name: [
                Endpoint(
                    EndpointMetadata(
                        e.address,
                        name,
                        e.role,
                        e.labels,
                        kv_events_port=e.kv_events_port or pool.kv_events_port,
                        kv_events_bind=pool.kv_events_bind,
                        kv_events_replay_port=replay_port(
                            e.kv_events_port or pool.kv_events_port,
                            e.kv_events_replay_port,
                            pool.kv_events_replay_port,
                        ),
                        kv_events_topic=e.kv_events_topic,
                    ),
                    capacity=e.capacity,
                )
                for e in pool.endpoints
            ]
            for name, pool in policy.pools.items()
        }
        self.engines = {name: pool.engine for name, pool in policy.pools.items()}
        # the pools whose endpoints' capacities are measured (``epp.datalayer.measured_capacity``)
        self.measured = {name for name, pool in policy.pools.items() if pool.measured_capacity}
        self.metric_names = {
            name: names_for(pool.engine, dict(pool.metric_names))
            for name, pool in policy.pools.items()
        }

    def endpoints(self, pool: str) -> list[Endpoint]:
        return self.pools.get(pool, [])

    def all(self) -> list[Endpoint]:
        return [e for endpoints in self.pools.values() for e in endpoints]


def replay_port(events: int | None, endpoint: int | None, pool: int | None) -> int | None:
    """Where an endpoint replays its KV events: the endpoint's port, else the pool's, else the
    events port + 1 (the kvgate backend's default, and what the docs give vLLM's
    ``replay_endpoint``); 0 for none. None when it publishes none, or only to a bound socket."""
    chosen = endpoint if endpoint is not None else pool
    if chosen is None:
        return events + 1 if events and events < 65535 else None
    return chosen or None
