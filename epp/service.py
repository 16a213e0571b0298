"""The endpoint picker as one object: datastore, metrics scraper, plugins and the components
they share (prefix indexes, saturation), a profile handler per pool, metrics.

The embedded gateway picker, the Pick API and the ext_proc server all call ``pick`` to rank a
pool's endpoints, and ``dispatched`` for the endpoint the request is sent to: only then do the
learning plugins (the prefix indexes, session affinity) record it. ``refused`` takes a
dispatch back when the endpoint could not be reached.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from epp.datalayer.datastore import Datastore
from epp.datalayer.indexes.prefix_index import PrefixIndex
from epp.datalayer.latency_model import Features
from epp.datalayer.placement import add_placed
from epp.datalayer.routing_text import routing_text
from epp.datalayer.scraper import MetricsScraper
from epp.datalayer.upstream_tls import upstream_tls
from epp.framework import (
    Endpoint,
    EndpointMetrics,
    PickObserver,
    SchedulingRequest,
    SessionKeeper,
)
from epp.metrics import EppMetrics
from epp.requestcontrol.pick_exchange import PickExchange, SiblingPick
from epp.requestcontrol.shared_picks import SharedPicks
from epp.requestcontrol.stored_responses import StoredResponses
from epp.scheduling.candidate_sample import CandidateSample
from epp.scheduling.config import build_plugins, build_profile
from epp.scheduling.handle import PluginHandle
from epp.scheduling.profile_handler import (
    Decision,
    PdProfileHandler,
    ProfileHandler,
    SingleProfileHandler,
)
from epp.scheduling.profile_runner import ProfileRunner
from epp.scheduling.registry import Plugin
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.scorers.zone_affinity import in_zone
from kvgate.in_flight import InFlight
from kvgate.wire.output_limit import requested_output_tokens
from policies.schema import Policy

# output tokens a request that names no limit is counted for (vLLM's own default is the
# rest of the context, which says nothing about what the request will really produce)
DEFAULT_OUTPUT_TOKENS = 256


@dataclass(eq=False, slots=True)
class Dispatch:
    """One request sent to one endpoint, with what takes back its records."""

    endpoint: Endpoint
    request: SchedulingRequest
    undo: list[Callable[[], None]]
    open: bool = True  # counted in the endpoint's in_flight until finished or refused
    prefill_tokens: int = 0  # counted in the endpoint's prefill_tokens until its first token
    decode_tokens: int = 0  # counted in the endpoint's decode_tokens until finished
    # when the endpoint's metrics were scraped as it was sent: while no scrape has come since,
    # the request is counted in the endpoint's ``dispatched`` until it is over
    scraped_at: float = 0.0
    # what the TTFT model read as it was sent, and when (None: no model, or learnt already)
    features: Features | None = None
    sent: float = 0.0


class EppService:
    """One policy's endpoint picker. Plugins are built once, here."""

    def __init__(self, policy: Policy, metrics: EppMetrics | None = None) -> None:
        self.policy = policy
        self.datastore = Datastore(policy)
        # whether each pick counts in its endpoint's ``in_flight`` until it is over; not when
        # embedded in a gateway whose attempts keep the count (``share_in_flight``)
        self.counts_in_flight = True
        self.metrics = metrics or EppMetrics()
        self.saturation = SaturationDetector(policy.epp.saturation)
        self.handle = PluginHandle(
            self.saturation,
            self.datastore.all(),
            self.metrics.kv_event_hooks(),
            zone=policy.epp.zone,
            region=policy.epp.region,
        )
        plugins = build_plugins(policy.epp, self.handle)
        self.scheduler = ProfileRunner(build_profile(policy.epp, plugins=plugins))
        self._observers = [p for p in plugins.values() if isinstance(p, PickObserver)]
        self._session_keepers = [p for p in plugins.values() if isinstance(p, SessionKeeper)]
        self.prefix: PrefixIndex | None = self.handle.primary_index
        self.sample = CandidateSample(
            policy.epp.sample_candidates, self.prefix, self._session_keepers
        )
        self.handlers = {name: self._handler(name, plugins) for name in policy.pools}
        if self.prefix is not None:
            for pool in policy.pools:  # a zero series from the start: a rate, not a gap
                self.metrics.warm_diverted.labels(pool)
        self.scraper = MetricsScraper(
            self.datastore,
            policy.epp.scrape_interval,
            idle_interval=policy.epp.scrape_idle_interval,
            quiet_interval=policy.epp.scrape_quiet_interval,
            saturation=policy.epp.saturation,
        )
        self.scraper.on_error = lambda e: self.metrics.scrape_errors.labels(e.address).inc()
        self.scraper.on_scrape = self._scraped
        self.scraper.tls = upstream_tls(policy)
        self.responses = StoredResponses(self.scraper.tls)
        # sibling workers' picks (gateway --workers N): indexes tagged by their parameters
        self._index_by_tag = {
            zlib.crc32(repr(params).encode()): index
            for params, index in self.handle.indexes.items()
        }
        self._by_address = {e.address: e for e in self.datastore.all()}
        self._pool_by_address = {
            pool: {e.address: e for e in endpoints}
            for pool, endpoints in self.datastore.pools.items()
        }
        self.exchange = PickExchange.from_environment(
            self._learn_sibling_pick, self._learn_sibling_scrape
        )
        # other replicas' picks, on any host: then they, not the local exchange, carry picks
        replicas = policy.epp.replicas
        self.shared = SharedPicks(replicas, self._learn_sibling_pick) if replicas else None
        self._shared_counts = (0, 0, 0)

    def _scraped(self, endpoint: Endpoint) -> None:
        self.metrics.scraped(endpoint.address)
        if self.exchange is not None:
            self.exchange.publish_metrics(endpoint.address, endpoint.metrics)

    def _learn_sibling_scrape(self, address: str, metrics: EndpointMetrics) -> None:
        endpoint = self._by_address.get(address)
        if endpoint is not None:
            self.scraper.adopt(endpoint, metrics)

    def _learn_sibling_pick(self, pick: SiblingPick, age: float = 0.0) -> None:
        """Another worker's or replica's pick, made ``age`` seconds ago."""
        endpoint = self._by_address.get(pick.address)
        if endpoint is None:
            return
        add_placed(endpoint, pick.placed, pick.lora, age=age)
        if pick.session:
            for keeper in self._session_keepers:
                keeper.learn_session(pick.session, pick.address)
        for tag, keys in pick.keys:
            index = self._index_by_tag.get(tag)
            if index is not None:
                index.learn_keys(keys, endpoint)

    def _handler(self, pool: str, plugins: dict[str, Plugin]) -> ProfileHandler:
        """The pool's profile handler: prefill/decode pools run a ``decode`` and a ``prefill``
        profile when the policy names them (else the default profile for both)."""
        threshold = self.policy.pools[pool].pd_min_uncached_tokens
        if threshold is None:
            return SingleProfileHandler(self.scheduler)
        named = {p.name for p in self.policy.epp.profiles}

        def scheduler(name: str) -> ProfileRunner:
            if name not in named:
                return self.scheduler
            return ProfileRunner(build_profile(self.policy.epp, name, plugins=plugins))

        return PdProfileHandler(
            scheduler("decode"),
            scheduler("prefill"),
            threshold,
            self.prefix,
            self.saturation.all_saturated,
            self.policy.pools[pool].pd_max_prefill_in_flight,
        )

    async def start(self) -> None:
        await self.scraper.start()
        for index in self.handle.indexes.values():
            await index.start()
        if self.exchange is not None:
            self.exchange.start()
        if self.shared is not None:
            await self.shared.start()

    async def stop(self) -> None:
        if self.shared is not None:
            await self.shared.stop()
        if self.exchange is not None:
            self.exchange.stop()
        await self.scraper.stop()
        self.responses.close()
        for index in self.handle.indexes.values():
            await index.stop()

    def pool_for_model(self, model: str) -> str | None:
        route = self.policy.route_for(model)
        return route.pool if route else None

    def target_model(self, pool: str, model: str) -> str:
        return self.policy.pools[pool].model or model

    @property
    def routing_limit(self) -> int:
        """How much routing text the prefix indexes read; 0 when none does (no prefix scorer,
        or precise mode, which tokenizes the body), so no pick renders a large request it will
        not hash."""
        return max((i.routing_limit for i in self.handle.indexes.values()), default=0)

    def scheduling_request(
        self,
        pool: str,
        request_id: str,
        target_model: str,
        body: Mapping[str, object],
        headers: Mapping[str, str],
        tenant: str = "",
    ) -> SchedulingRequest:
        """What the plugins see for one OpenAI request body sent to ``pool`` (by ``tenant``,
        where the caller is known)."""
        return SchedulingRequest(
            request_id=request_id,
            model=target_model,
            routing_text=routing_text(body, self.routing_limit),
            lora=target_model if target_model in self.policy.pools[pool].adapters else None,
            headers=headers,
            body=body,
            tenant=tenant,
        )

    def pick(
        self,
        pool: str,
        request: SchedulingRequest,
        *,
        exclude: set[str] | None = None,
        subset: set[str] | None = None,
    ) -> Decision:
        """Rank ``pool``'s endpoints for ``request`` through the pool's profile handler.

        Nothing is learned: call ``dispatched`` for each endpoint the request is sent to.
        ``subset`` keeps only endpoints whose host (IP) is listed, as GIE's subset hint does.
        A pool larger than ``epp.sample_candidates`` is scored on a sample of it
        (``CandidateSample``), and on all of it when nothing in the sample passes the filters.
        """
        started = time.perf_counter()
        self.scraper.metrics_read()
        candidates = sample = self.candidates(pool, exclude, subset)
        if 0 < self.sample.size < len(candidates):
            sample = self.sample.narrow(request, candidates, self._candidate_of(pool, candidates))
        decision = self.handlers[pool].decide(request, sample)
        if decision.result.target is None and sample is not candidates:
            decision = self.handlers[pool].decide(request, candidates)
        result = decision.result
        target = result.target
        if target is not None:
            self.metrics.child(self.metrics.decisions, pool, result.winner_by or "none").inc()
            matched = request.prefix_match
            if matched and self.prefix is not None:
                held = matched.get(target.address, 0)
                if max(matched.values()) - held >= self.prefix.params.min_match_blocks:
                    self.metrics.child(self.metrics.warm_diverted, pool).inc()
        elapsed = time.perf_counter() - started
        self.metrics.child(self.metrics.pick_latency, pool).observe(elapsed)
        return decision

    def _candidate_of(
        self, pool: str, candidates: list[Endpoint]
    ) -> Callable[[str], Endpoint | None]:
        """Finds one of ``candidates`` (of ``pool``) by address."""
        if len(candidates) != len(self.datastore.endpoints(pool)):
            return {e.address: e for e in candidates}.get
        return self._pool_by_address[pool].get

    def share_in_flight(self, counts: Mapping[tuple[str, str], InFlight]) -> None:
        """Read each endpoint's requests in flight from ``counts`` (by pool and address), which
        its owner keeps, instead of counting picks: one count per request, not two."""
        for endpoint in self.datastore.all():
            count = counts.get((endpoint.pool, endpoint.address))
            if count is not None:
                endpoint.load.requests = count
        self.counts_in_flight = False

    def share_loaded_adapters(
        self, pool: str, loaded_on: Callable[[str], Collection[str]], slots: int
    ) -> None:
        """Read which LoRA adapters each endpoint of ``pool`` has loaded from ``loaded_on``
        (by address), ``slots`` of them at most: a gateway that loads them itself knows."""
        for endpoint in self.datastore.endpoints(pool):
            endpoint.adapters_loaded = loaded_on(endpoint.address)
            endpoint.adapter_slots = slots

    def dispatched(self, request: SchedulingRequest, endpoint: Endpoint) -> Dispatch:
        """``request`` is being sent to ``endpoint``: count it until the next scrape shows it
        (or it is over first), and let the prefix indexes and learning plugins record it."""
        load = endpoint.load
        load.dispatched += 1
        if not in_zone(endpoint, self.policy.epp.zone):  # where it went, not the first choice
            self.metrics.child(self.metrics.cross_zone_picks, endpoint.pool).inc()
        if self.counts_in_flight:
            endpoint.in_flight += 1
        # before the indexes learn this pick: what the endpoint does not hold yet
        prefill = self.prefix.uncached_tokens(request, endpoint) if self.prefix else 0
        decode = requested_output_tokens(request.body) or DEFAULT_OUTPUT_TOKENS
        model = self.handle.latency
        features = None if model is None else model.features(endpoint, prefill)
        load.prefill_tokens += prefill
        load.decode_tokens += decode
        add_placed(endpoint, prefill, request.lora)
        self.scraper.wake(endpoint)
        for observer in self._observers:
            observer.on_pick(request, endpoint)
        undo = []
        tagged_keys = []
        for tag, index in self._index_by_tag.items():
            keys = index.keys(request)
            undo.append(index.learn_keys(keys, endpoint))
            tagged_keys.append((tag, keys))
        if self.shared is not None or self.exchange is not None:
            session = self._session_keepers[0].session_of(request) if self._session_keepers else ""
            pick = SiblingPick(endpoint.address, prefill, request.lora, tagged_keys, session)
            if self.shared is not None:
                self.shared.publish(pick)
            elif self.exchange is not None:
                self.exchange.publish(pick)
        return Dispatch(
            endpoint,
            request,
            [u for u in undo if u is not None],
            True,
            prefill,
            decode,
            scraped_at=endpoint.metrics.scraped_at,
            features=features,
            sent=time.perf_counter(),
        )

    def prefilled(self, dispatch: Dispatch) -> None:
        """The endpoint sent the request's first token: its prompt is no longer waiting to be
        computed there, and the TTFT model learns how long it took. Idempotent."""
        features, model = dispatch.features, self.handle.latency
        if features is not None and model is not None:
            dispatch.features = None
            pool = dispatch.endpoint.pool
            error = model.learn(pool, features, time.perf_counter() - dispatch.sent)
            self.metrics.child(self.metrics.ttft_prediction_error, pool).observe(error)
        self._computed(dispatch)

    def _computed(self, dispatch: Dispatch) -> None:
        """The request's prompt no longer waits to be computed at its endpoint. Idempotent."""
        dispatch.endpoint.load.prefill_tokens -= dispatch.prefill_tokens
        dispatch.prefill_tokens = 0

    def finished(self, dispatch: Dispatch, prompt_tokens: int | None = None) -> None:
        """The request of ``dispatch`` is over (answered, failed or cancelled): it no longer
        loads its endpoint. ``prompt_tokens``: the usage the endpoint answered with, which
        tells the prefix indexes how much text its cache holds. Idempotent."""
        if dispatch.open:
            dispatch.open = False
            endpoint = dispatch.endpoint
            if self.counts_in_flight:
                endpoint.in_flight -= 1
            if endpoint.metrics.scraped_at == dispatch.scraped_at and endpoint.load.dispatched > 0:
                endpoint.load.dispatched -= 1  # over before a scrape showed it: not queued there
            dispatch.features = None  # no first token: nothing to learn
            self._computed(dispatch)
            endpoint.load.decode_tokens -= dispatch.decode_tokens
            dispatch.decode_tokens = 0
            if prompt_tokens:
                for index in self.handle.indexes.values():
                    index.observe_usage(dispatch.request, dispatch.endpoint, prompt_tokens)

    def refused(self, dispatch: Dispatch) -> None:
        """The endpoint of ``dispatch`` never took the request: take back what it recorded."""
        self.finished(dispatch)
        for undo in dispatch.undo:
            undo()
        dispatch.undo.clear()

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
        tokens = self.metrics.tokens_in_flight
        for endpoint in self.datastore.all():
            address = endpoint.address
            tokens.labels(address, "prefill").set(endpoint.load.prefill_tokens)
            tokens.labels(address, "decode").set(endpoint.load.decode_tokens)
            self.metrics.endpoint_capacity.labels(address).set(endpoint.capacity)
            if self.prefix is not None:
                self.metrics.index_blocks.labels(address).set(self.prefix.blocks_of(address))
                self.metrics.index_capacity.labels(address).set(self.prefix.capacity_of(endpoint))
        if self.shared is not None:
            s = self.shared
            counts = (s.sent, s.received, s.dropped)
            self._shared_counts = self.metrics.shared_view(s.shared, counts, self._shared_counts)
