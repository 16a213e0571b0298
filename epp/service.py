"""The endpoint picker as one object: datastore, metrics scraper, scheduling profile, metrics.

The embedded gateway picker, the Pick API and the ext_proc server all call ``pick``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from epp.config import build_profile
from epp.datastore import Datastore
from epp.framework import Endpoint, SchedulingRequest, SchedulingResult
from epp.kv_events import KVEventSubscriber
from epp.metrics import EppMetrics
from epp.routing_text import routing_text
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
        self.prefix = next(
            (
                ws.scorer
                for ws in self.scheduler.profile.scorers
                if isinstance(ws.scorer, PrefixCacheScorer)
            ),
            None,
        )
        self.events: KVEventSubscriber | None = None
        if self.prefix is not None and self.prefix.precise:
            self.events = KVEventSubscriber(
                self.prefix.precise_index, self.datastore.all(), self.metrics.event_lag.observe
            )

    async def start(self) -> None:
        await self.scraper.start()
        if self.events is not None:
            await self.events.start()

    async def stop(self) -> None:
        await self.scraper.stop()
        if self.events is not None:
            await self.events.stop()

    def pool_for_model(self, model: str) -> str | None:
        route = self.policy.route_for(model)
        return route.pool if route else None

    def target_model(self, pool: str, model: str) -> str:
        return self.policy.pools[pool].model or model

    @property
    def routing_limit(self) -> int:
        """How much routing text the approximate prefix index can use; 0 when nothing reads
        it (no prefix scorer, or precise mode, which tokenizes the body), so no pick renders
        a large request it will not hash."""
        if self.prefix is None or self.prefix.precise:
            return 0
        params = self.prefix.params
        return params.block_size_tokens * params.chars_per_token * params.max_prefix_blocks

    def scheduling_request(
        self,
        pool: str,
        request_id: str,
        target_model: str,
        body: Mapping[str, object],
        headers: Mapping[str, str],
    ) -> SchedulingRequest:
        """What the plugins see for one OpenAI request body sent to ``pool``."""
        return SchedulingRequest(
            request_id=request_id,
            model=target_model,
            routing_text=routing_text(body, self.routing_limit),
            lora=target_model if target_model in self.policy.pools[pool].adapters else None,
            headers=headers,
            session_id=headers.get("x-session-id"),
            body=body,
        )

    def pick(
        self,
        pool: str,
        request: SchedulingRequest,
        *,
        exclude: set[str] | None = None,
        subset: set[str] | None = None,
        roles: tuple[str, ...] = (),
        learn: bool = True,
    ) -> SchedulingResult:
        """Rank ``pool``'s endpoints for ``request``; the winner learns the request's prefix.

        ``subset`` keeps only endpoints whose host (IP) is listed, as GIE's subset hint does.
        """
        started = time.perf_counter()
        candidates = self.candidates(pool, exclude, subset)
        if roles:
            candidates = [e for e in candidates if e.role in roles]
        result = self.scheduler.schedule(request, candidates)
        if result.target is not None:
            if learn:
                self.scheduler.observe(request, result.target)
            self.metrics.decisions.labels(pool, result.winner_by or "none").inc()
        self.metrics.pick_latency.labels(pool).observe(time.perf_counter() - started)
        return result

    def pick_pd(
        self,
        pool: str,
        request: SchedulingRequest,
        *,
        exclude: set[str] | None = None,
        subset: set[str] | None = None,
    ) -> tuple[SchedulingResult, Endpoint | None]:
        """A decode pick and, when the prompt's uncached part there is at least the pool's
        ``pd.min_uncached_tokens``, a prefill endpoint to compute it (else None)."""
        roles = ("decode", "both")
        decode = self.pick(pool, request, exclude=exclude, subset=subset, roles=roles, learn=False)
        threshold = self.policy.pools[pool].pd_min_uncached_tokens
        target = decode.target
        if target is None:
            return decode, None
        needs_prefill = (
            threshold is not None
            and self.prefix is not None
            and self.prefix.uncached_tokens(request, target) >= threshold
        )
        self.scheduler.observe(request, target)
        if not needs_prefill:
            return decode, None
        prefill = self.pick(pool, request, exclude=exclude, subset=subset, roles=("prefill",))
        return decode, prefill.target

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
        if self.prefix is None:
            return
        index = self.prefix.precise_index if self.prefix.precise else self.prefix.index
        for endpoint in self.datastore.all():
            self.metrics.index_blocks.labels(endpoint.address).set(
                index.blocks_of(endpoint.address)
            )
