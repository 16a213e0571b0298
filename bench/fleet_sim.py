"""The fleet simulator's event loop: K replicas of the real picker (``EppService``: the same
plugins, indexes, scorers and profiles as the gateway embeds) in front of N simulated engines
(``bench.fleet_engine``), in virtual time.

Time is a heap of events: a request arriving at a replica (picked there, by the picker's own
code, and queued at its engine), an engine's step ending (its tokens delivered: the first one
tells the picker the prompt is computed, the last that the request is over, with its usage), a
replica's scrape of every engine (every ``scrape_interval``, the replicas' phases spread), a
pick shared with the other replicas (learnt there ``share_lag`` later, as ``SharedPicks``
delivers one through Redis, aged by the lag) and, in precise mode, an engine's KV-event batch
(applied to every replica's index ``event_lag`` later). ``time.monotonic`` reads the virtual
clock while the simulation runs; the picker's CPU per pick is measured on the real one.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from backends.engine.sequence import Sequence as EngineSeq
from backends.runners.sim_runner import CostModel
from bench.fleet_engine import Flight, SimEngine
from bench.routing_peers import precise_profile
from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from epp.requestcontrol.pick_exchange import SiblingPick
from epp.service import EppService
from kvgate.wire.kv_events import encode_event
from policies.loader import load_policy_text

MODEL = "kvgate-sim"
IDLE_RETRY = 0.05  # an engine whose step found nothing to run looks again (as AsyncEngine)


@dataclass(frozen=True)
class Arrival:
    at: float  # virtual seconds
    messages: list[dict[str, Any]]
    max_tokens: int
    token_ids: Callable[[], list[int]]  # what the engine tokenizes the request to


@dataclass
class FleetResult:
    ttft: list[float] = field(default_factory=list)  # seconds, in order of arrival
    cached: list[int] = field(default_factory=list)  # prompt tokens served from cache
    served: list[int] = field(default_factory=list)  # requests per engine
    pick_seconds: list[float] = field(default_factory=list)  # real time of each pick
    warm_diverted: float = 0.0


def policy_text(engines: int, precise: bool, epp: str = "", model: str = MODEL) -> str:
    """A pool of ``engines`` addresses nothing serves (the simulator stands behind them)."""
    addresses = [f"'10.{i >> 16}.{(i >> 8) & 255}.{i & 255}:8000'" for i in range(engines)]
    if precise:
        addresses = [f"{{address: {a}, kv_events_port: 5557}}" for a in addresses]
    return (
        f"pools: {{p: {{endpoints: [{', '.join(addresses)}]}}}}\n"
        f"routes: [{{model: {model}, pool: p}}]\n{epp}\n"
    )


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def virtual_time(clock: VirtualClock) -> Iterator[None]:
    """``time.monotonic`` reads ``clock`` (the picker's decay, ages and TTLs run on it)."""
    with mock.patch.object(time, "monotonic", clock):
        yield


class LaggedShare:
    """Stands where ``SharedPicks`` does: a published pick reaches every other replica
    ``lag`` seconds later."""

    def __init__(self, fleet: FleetSim, replica: int) -> None:
        self.fleet, self.replica = fleet, replica

    def publish(self, pick: SiblingPick) -> None:
        fleet = self.fleet
        fleet.schedule(fleet.share_lag, fleet.shared_pick, (self.replica, pick))


class FleetSim:
    """One simulated run; ``run`` drives ``arrivals`` to the end of the last answer."""

    def __init__(
        self,
        engines: int,
        replicas: int,
        *,
        num_blocks: int,
        max_model_len: int,
        precise: bool = False,
        epp: str = "",  # the policy's epp: section (default: the default or precise profile)
        cost: CostModel | None = None,
        share_lag: float = 0.002,
        event_lag: float = 0.002,
    ) -> None:
        self.clock = VirtualClock()
        self.share_lag, self.event_lag = share_lag, event_lag
        epp = epp or (precise_profile() if precise else "")
        policy = load_policy_text(policy_text(engines, precise, epp))
        self.services = [EppService(policy) for _ in range(replicas)]
        addresses = [e.address for e in self.services[0].datastore.endpoints("p")]
        self.engines = [
            SimEngine(n, a, num_blocks, cost or CostModel(), max_model_len, precise)
            for n, a in enumerate(addresses)
        ]
        self._engine_of = {e.address: e for e in self.engines}
        self._by_address = [
            {e.address: e for e in s.datastore.endpoints("p")} for s in self.services
        ]
        if replicas > 1:
            for number, service in enumerate(self.services):
                service.shared = LaggedShare(self, number)  # type: ignore[assignment]
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._order = itertools.count()
        self.result = FleetResult(served=[0] * engines)

    def schedule(self, delay: float, action: Callable[[Any], None], payload: Any) -> None:
        heapq.heappush(self._heap, (self.clock.now + delay, next(self._order), action, payload))

    def run(self, arrivals: Sequence[Arrival]) -> FleetResult:
        self.result.ttft = [0.0] * len(arrivals)
        self.result.cached = [0] * len(arrivals)
        for number, arrival in enumerate(arrivals):
            heapq.heappush(self._heap, (arrival.at, next(self._order), self.arrive, number))
        interval = self.services[0].policy.epp.scrape_interval
        for number in range(len(self.services)):
            self.schedule(interval * number / len(self.services), self.scrape, number)
        self._arrivals, self._left = arrivals, len(arrivals)
        with virtual_time(self.clock):
            while self._heap and self._left:
                at, _, action, payload = heapq.heappop(self._heap)
                self.clock.now = at
                action(payload)
        for service in self.services:
            self.result.warm_diverted += service.metrics.warm_diverted.labels("p")._value.get()
        return self.result

    # -- events -------------------------------------------------------------------------------
    def arrive(self, number: int) -> None:
        arrival = self._arrivals[number]
        replica = number % len(self.services)
        service = self.services[replica]
        body = {
            "model": MODEL,
            "messages": arrival.messages,
            "max_tokens": arrival.max_tokens,
            "stream": True,
        }
        started = time.perf_counter()
        request = service.scheduling_request("p", f"r{number}", MODEL, body, {})
        target = service.pick("p", request).result.target
        assert target is not None, "the picker found no endpoint"
        dispatch = service.dispatched(request, target)
        self.result.pick_seconds.append(time.perf_counter() - started)
        engine = self._engine_of[target.address]
        self.result.served[engine.number] += 1
        flight = engine.add(arrival.token_ids(), arrival.max_tokens, self.clock.now, replica)
        flight.number, flight.dispatch = number, dispatch
        if not engine.stepping:
            self.start_step(engine)

    def start_step(self, engine: SimEngine) -> None:
        ran = engine.step_begin()
        if ran is None:
            engine.stepping = engine.scheduler.has_work
            if engine.stepping:
                self.schedule(IDLE_RETRY, self.start_step, engine)
            return
        engine.stepping = True
        self.schedule(ran, self.end_step, engine)

    def end_step(self, engine: SimEngine) -> None:
        now = self.clock.now
        for seq in engine.step_end():
            flight = engine.flights[seq.seq_id]
            self._delivered(engine, flight, seq, now)
        if engine.record_events:
            events = engine.take_events()
            if events:
                seq_no = engine.event_batches
                engine.event_batches += 1
                raw = [encode_event(e) for e in events]
                self.schedule(self.event_lag, self.apply_events, (engine.address, seq_no, raw))
        self.start_step(engine)

    def _delivered(self, engine: SimEngine, flight: Flight, seq: EngineSeq, now: float) -> None:
        number, dispatch = flight.number, flight.dispatch
        assert dispatch is not None
        service = self.services[flight.replica]
        if not flight.first_token:
            flight.first_token = now
            self.result.ttft[number] = now - flight.arrived
            service.prefilled(dispatch)
        if seq.is_finished:
            self.result.cached[number] = seq.num_cached_tokens
            service.finished(dispatch, seq.num_prompt_tokens)
            del engine.flights[seq.seq_id]
            self._left -= 1

    def scrape(self, replica: int) -> None:
        service, now = self.services[replica], self.clock.now
        by_address = self._by_address[replica]
        for engine in self.engines:
            service.scraper.adopt(by_address[engine.address], engine.metrics(now))
        self.schedule(service.policy.epp.scrape_interval, self.scrape, replica)

    def shared_pick(self, item: tuple[int, SiblingPick]) -> None:
        sender, pick = item
        for number, service in enumerate(self.services):
            if number != sender:
                service._learn_sibling_pick(pick, age=self.share_lag)

    def apply_events(self, item: tuple[str, int, list[dict[str, Any]]]) -> None:
        address, seq_no, raw = item
        for service in self.services:
            for index in service.handle.indexes.values():
                if isinstance(index, PrecisePrefixCache):
                    index.index.apply_batch(address, seq_no, raw)
