"""The endpoint picker's contracts: filters, scorers and pickers over endpoints.

A scheduling cycle runs the profile's filters in order, then every scorer; the framework (not
the plugin) clamps each score to [0, 1] and applies the profile's weights; the picker ranks the
endpoints by total score. Plugins never know their own weight.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar, runtime_checkable

from kvgate.in_flight import InFlight

T = TypeVar("T")


@dataclass(slots=True)
class EndpointMetrics:
    """What the scraper last read from an endpoint's /metrics."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # 0..1
    block_size: int = 0  # 0: unknown
    num_gpu_blocks: int = 0  # 0: unknown
    running_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_loras: int = 0
    # the engine's inter-token latency histogram so far: how many gaps between a request's
    # output tokens, and their seconds in all (measured capacity)
    token_gaps: float = 0.0
    token_gap_seconds: float = 0.0
    scraped_at: float = 0.0  # time.monotonic() of the last good scrape; 0: never

    def age(self, now: float | None = None) -> float:
        if not self.scraped_at:
            return float("inf")
        return (time.monotonic() if now is None else now) - self.scraped_at


@dataclass(eq=False, slots=True)
class EndpointLoad:
    """What the picker sent an endpoint and has not seen the end of, kept by ``EppService``
    (its picks, their ends, its sibling workers' picks) and by the scrapes that show them."""

    # requests sent here and not yet finished: the picker's own count, or the one of the gateway
    # that embeds it (``EppService.share_in_flight``)
    requests: InFlight = field(default_factory=InFlight)
    # picks since the last scrape, not yet visible in the metrics and not over yet
    dispatched: int = 0
    # the picker's own token counts of what it sent here: prompt tokens not cached here whose
    # first output token has not come back yet, and output tokens still owed (output limits)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    # uncached prompt tokens sent here, decayed (``epp.datalayer.placement``)
    placed_tokens: float = 0.0
    placed_at: float = 0.0  # when ``placed_tokens`` was last brought up to date
    # requests of each LoRA adapter sent here, decayed alike (``epp.datalayer.placement``)
    placed_adapters: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndpointMetadata:
    """What the policy says of an endpoint, fixed when the datastore is built (GIE's endpoint
    metadata): the scraper's metrics and the service's load are kept beside it."""

    address: str  # host:port
    pool: str
    role: str = "both"  # both | prefill | decode
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_port: int | None = None  # where /metrics is served, if not on ``address``
    kv_events_port: int | None = None  # where the engine publishes KV events (ZMQ PUB)
    kv_events_bind: str | None = None  # or: the address the EPP binds, engines connecting
    kv_events_replay_port: int | None = None  # the engine's replay socket (ZMQ ROUTER)
    kv_events_topic: str | None = None  # bind mode: the topic this engine publishes on

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))


@dataclass(eq=False, slots=True)
class Endpoint:
    """One model server the picker may choose: its spec (fixed), the metrics the scraper last
    swapped in, the load the service keeps, and what the picker learns of it as it runs."""

    spec: EndpointMetadata
    metrics: EndpointMetrics = field(default_factory=EndpointMetrics)
    load: EndpointLoad = field(default_factory=EndpointLoad)  # what it was sent: ``EppService``
    healthy: bool = True  # false after repeated failed scrapes, until one succeeds
    # seconds older than ``max_metrics_age`` the metrics may be and still count as fresh: the
    # scraper's idle interval while it polls an idle endpoint slowly (its state cannot change
    # by this picker's doing until a pick wakes the poller), else 0
    metrics_grace: float = 0.0
    # the policy's, or measured (``epp.datalayer.measured_capacity``): the load scorers and
    # saturation read load / capacity
    capacity: float = 1.0
    # the LoRA adapters the gateway loaded here, when it places a pool's adapters itself (its
    # placement's live record: ``gateway.routing.adapter_placement``), and how many fit (0: the
    # gateway does not place them; the engine's metrics tell)
    adapters_loaded: Collection[str] = ()
    adapter_slots: int = 0
    # the spec's, read as plain attributes: the scorers read them for every endpoint of every
    # pick, and a property costs the picker 5-12% (bench.epp's in-process picks)
    address: str = field(init=False)
    pool: str = field(init=False)

    def __post_init__(self) -> None:
        self.address = self.spec.address
        self.pool = self.spec.pool

    @property
    def in_flight(self) -> int:
        return self.load.requests.count

    @in_flight.setter
    def in_flight(self, count: int) -> None:
        self.load.requests.count = count


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """What the plugins may look at."""

    request_id: str
    model: str  # the model the endpoints will be asked for (after any rewrite)
    routing_text: str  # prompt or rendered chat messages, cut to what the prefix index uses
    lora: str | None = None  # the adapter the request needs, if any
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, object] = field(default_factory=dict)  # the OpenAI request, for tokenizing
    tenant: str = ""  # the caller's tenant, where the picker knows it (embedded in the gateway)
    # filled while scoring: per endpoint scored, the leading blocks of the prompt it holds
    prefix_match: dict[str, float] = field(default_factory=dict)


class RequestMemo(Generic[T]):
    """What a plugin worked out for the last request (its block keys, its token ids, its
    length, its session), so scoring, learning and the prefill decision work a request out
    once. Keyed by the request object itself, never by its id: a client may send any
    ``x-request-id``, twice, with different prompts."""

    __slots__ = ("_request", "_value")

    def __init__(self) -> None:
        self._request: SchedulingRequest | None = None
        self._value: T | None = None

    def get(self, request: SchedulingRequest) -> T | None:
        return self._value if request is self._request else None

    def put(self, request: SchedulingRequest, value: T) -> T:
        self._request, self._value = request, value
        return value


@runtime_checkable
class Filter(Protocol):
    """Narrows the candidates of a scheduling cycle; runs before every scorer, in profile order."""

    name: str

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        """The endpoints that may serve ``request`` (a subset, order kept)."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """Scores every candidate in [0, 1]; the framework clamps and weights it."""

    name: str

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        """A score per endpoint address, higher is better; clamped to [0, 1] by the framework."""
        ...


@runtime_checkable
class Picker(Protocol):
    """Orders the scored candidates, best first; exactly one per profile."""

    name: str

    def pick(
        self, request: SchedulingRequest, scored: list[tuple[Endpoint, float]]
    ) -> list[Endpoint]:
        """Every candidate, best first (the gateway retries down the list)."""
        ...


@runtime_checkable
class PickObserver(Protocol):
    """A plugin that learns from decisions (e.g. the approximate prefix index)."""

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None: ...


@runtime_checkable
class SessionKeeper(Protocol):
    """A plugin that remembers where sessions went, and learns other workers' and replicas'
    picks of them too (a session's next call may reach any of them)."""

    def session_of(self, request: SchedulingRequest) -> str: ...

    def session_home(self, request: SchedulingRequest) -> str | None:
        """Where the request's session last went (None: no session, or not seen)."""
        ...

    def learn_session(self, session: str, address: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    """A scorer and the weight its profile gives it."""

    scorer: Scorer
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Profile:
    """One scheduling profile: filters in order, weighted scorers, one picker."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """One profile's result: every candidate ranked, their total scores, the deciding scorer."""

    ranked: list[Endpoint]  # best first
    scores: dict[str, float]  # total weighted score by address
    winner_by: str  # the scorer that contributed most to the winner ("" if none)
    # what explains it: each scorer's name, weight and raw scores by address, and each
    # filter's name and the endpoints it kept, after ("", the candidates) (references the
    # cycle made anyway: free)
    parts: list[tuple[str, float, dict[str, float]]] = field(default_factory=list)
    kept: list[tuple[str, list[Endpoint]]] = field(default_factory=list)

    @property
    def target(self) -> Endpoint | None:
        return self.ranked[0] if self.ranked else None
