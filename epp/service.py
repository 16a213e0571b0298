"""The endpoint picker as one object: datastore, metrics scraper, scheduling profile, metrics.

The embedded gateway picker, the Pick API and the ext_proc server all call ``pick``.
"""

from __future__ import annotations

import time

from epp.config import build_profile
from epp.datastore import Datastore
from epp.framework import Endpoint, SchedulingRequest, SchedulingResult
from epp.metrics import EppMetrics
from epp.scheduler import Scheduler
from epp.scorers.prefix_cache import PrefixCacheScorer
from epp.scraper import MetricsScraper
from policies.schema import Policy


class EppService:
    def __init__(self, policy: Policy, metrics: EppMetrics | None = None) -> None:
        self.policy = policy
        self.datastore = Datastore(policy)
        self.scheduler = Scheduler(build_profile(policy.epp))
        self.scraper = MetricsScraper(self.datastore, policy.epp.scrape_interval)
        self.metrics = metrics or EppMetrics()
        self.scraper.on_error = lambda e: self.metrics.scrape_errors.labels(e.address).inc()

    async def start(self) -> None:
        await self.scraper.start()

    async def stop(self) -> None:
        await self.scraper.stop()

    def pool_for_model(self, model: str) -> str | None:
        route = self.policy.route_for(model)
        return route.pool if route else None

    def target_model(self, pool: str, model: str) -> str:
        return self.policy.pools[pool].model or model

    def pick(
        self,
        pool: str,
        request: SchedulingRequest,
        *,
        exclude: set[str] | None = None,
        subset: set[str] | None = None,
    ) -> SchedulingResult:
        """Rank ``pool``'s endpoints for ``request``; the winner learns the request's prefix.

        ``subset`` keeps only endpoints whose host (IP) is listed, as GIE's subset hint does.
        """
        started = time.perf_counter()
        candidates = self.candidates(pool, exclude, subset)
        result = self.scheduler.schedule(request, candidates)
        if result.target is not None:
            self.scheduler.observe(request, result.target)
            self.metrics.decisions.labels(pool, result.winner_by or "none").inc()
        self.metrics.pick_latency.labels(pool).observe(time.perf_counter() - started)
        return result

    def candidates(
        self, pool: str, exclude: set[str] | None, subset: set[str] | None
    ) -> list[Endpoint]:
        endpoints = self.datastore.endpoints(pool)
        if exclude:
            endpoints = [e for e in endpoints if e.address not in exclude]
        if subset is not None:
            endpoints = [e for e in endpoints if e.address.rsplit(":", 1)[0] in subset]
        return endpoints

    def update_gauges(self) -> None:
        for weighted in self.scheduler.profile.scorers:
            if isinstance(weighted.scorer, PrefixCacheScorer):
                for endpoint in self.datastore.all():
                    blocks = weighted.scorer.index.blocks_of(endpoint.address)
                    self.metrics.index_blocks.labels(endpoint.address).set(blocks)
