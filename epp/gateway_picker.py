"""The endpoint picker embedded in the gateway: the gateway's ``Picker`` contract, backed by
the EPP's datastore, scraper and scheduling profile."""

from __future__ import annotations

import time

from epp.config import build_profile
from epp.datastore import Datastore
from epp.framework import SchedulingRequest
from epp.routing_text import routing_text
from epp.scheduler import Scheduler
from epp.scraper import MetricsScraper
from gateway.picker import EndpointState, PickRequest
from policies.schema import Policy


class EmbeddedEpp:
    def __init__(self, policy: Policy, states: dict[str, list[EndpointState]]) -> None:
        self.policy = policy
        self.datastore = Datastore(policy)
        self.scheduler = Scheduler(build_profile(policy.epp))
        self.scraper = MetricsScraper(self.datastore, policy.epp.scrape_interval)
        self._states = {(s.pool, s.address): s for pool in states.values() for s in pool}
        self.decisions: dict[str, int] = {}  # winning scorer -> count
        self.last_pick_seconds = 0.0

    async def start(self) -> None:
        await self.scraper.start()

    async def stop(self) -> None:
        await self.scraper.stop()

    async def pick(
        self, pool: str, request: PickRequest, exclude: set[str]
    ) -> EndpointState | None:
        started = time.perf_counter()
        candidates = [e for e in self.datastore.endpoints(pool) if e.address not in exclude]
        if not candidates:
            return None
        pool_spec = self.policy.pools[pool]
        model = pool_spec.model or request.model
        scheduling = SchedulingRequest(
            request_id=request.request_id,
            model=model,
            routing_text=routing_text(request.body),
            lora=model if model in pool_spec.adapters else None,
            headers=request.headers,
            session_id=request.headers.get("x-session-id"),
        )
        result = self.scheduler.schedule(scheduling, candidates)
        target = result.target
        if target is None:
            return None
        self.scheduler.observe(scheduling, target)
        self.decisions[result.winner_by] = self.decisions.get(result.winner_by, 0) + 1
        self.last_pick_seconds = time.perf_counter() - started
        return self._states[(pool, target.address)]
