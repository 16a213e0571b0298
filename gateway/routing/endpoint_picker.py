"""Choosing an endpoint of a pool: the ``EndpointPicker`` contract, the ``Ranking`` it returns,
and the least-in-flight default.

A picker ranks a pool's endpoints once per request; the upstream call walks the ranking,
one endpoint per attempt. A learning picker records each endpoint as it hands it out (so a
burst of one prefix sees the pick at once) and takes it back when the upstream refuses the
connection (so a dead endpoint is not believed to hold what it never got). The embedded
endpoint picker (``gateway.routing.embedded_epp``) implements the same contract with the EPP's
KV-cache-aware scoring.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from gateway.base.identity import Identity
from gateway.routing.breaker import BreakerState, CircuitBreaker
from kvgate.in_flight import InFlight
from policies.schema import EndpointSpec, Policy


@dataclass(eq=False, slots=True)
class EndpointState:
    """One upstream as this gateway process sees it."""

    endpoint: EndpointSpec
    pool: str
    breaker: CircuitBreaker
    # requests this process sent here and not yet finished, kept by the attempts (the picker
    # embedded in the gateway reads the same count)
    requests: InFlight = field(default_factory=InFlight)
    url: str = field(init=False)
    address: str = field(init=False)  # the endpoint's host:port (read on every pick)
    capacity: float = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.endpoint.url
        self.address = self.endpoint.address
        self.capacity = self.endpoint.capacity

    @property
    def in_flight(self) -> int:
        return self.requests.count

    @in_flight.setter
    def in_flight(self, count: int) -> None:
        self.requests.count = count


class PickRequest:
    """What a picker may look at: the parsed body (for prompts), headers and the caller.
    (A plain slots class: one is made per request, and a dataclass's generated ``__init__``
    stays interpreted Python in the compiled build; pickers only read it.)"""

    __slots__ = ("body", "headers", "identity", "model", "request_id", "worked_out")

    def __init__(
        self,
        model: str,
        body: Mapping[str, object],
        headers: Mapping[str, str],
        identity: Identity | None,
        request_id: str = "",
    ) -> None:
        self.model = model
        self.body = body
        self.headers = headers
        self.identity = identity
        self.request_id = request_id
        # what a picker worked out for one pool before ranking (its tokens, counted for the
        # limits), kept so the ranking does not work it out again: (pool, the picker's own)
        self.worked_out: tuple[str, object] | None = None

    def __repr__(self) -> str:
        return f"PickRequest(model={self.model!r}, request_id={self.request_id!r})"


class Ranking(Protocol):
    """One request's endpoints of a pool, best first, walked by the upstream call's attempts."""

    def next(self, exclude: set[str]) -> EndpointState | None:
        """The best endpoint not yet returned and not in ``exclude`` (addresses); None when
        the ranking is exhausted. The request is about to be sent there."""
        ...

    def refused(self, endpoint: EndpointState) -> None:
        """``endpoint`` could not be reached: it never took the request."""
        ...

    def started(self, endpoint: EndpointState) -> None:
        """``endpoint`` streamed the request's first token: its prompt has been computed."""
        ...

    def finished(self, endpoint: EndpointState, prompt_tokens: int | None = None) -> None:
        """The request's try at ``endpoint`` is over (its attempt closed); ``prompt_tokens``:
        what the endpoint's usage reported, when it answered with one."""
        ...

    def prefill(self) -> EndpointState | None:
        """The endpoint to prefill the prompt on first (a prefill/decode pool whose picker
        chose to disaggregate this request), or None: the endpoints ranked serve it whole."""
        ...


class EndpointPicker(Protocol):
    """The gateway's contract for choosing endpoints (least-in-flight, or the embedded EPP)."""

    def prompt_token_ids(self, pool: str, request: PickRequest) -> list[int] | None:
        """The prompt's token ids as ``pool``'s engines compute them, where this picker
        tokenizes requests as they do (the precise prefix index); None where it does not."""
        ...

    def rank(self, pool: str, request: PickRequest) -> Ranking:
        """``pool``'s endpoints for ``request``, best first.

        Synchronous, made in-process on every request: a picker reads state that is kept
        fresh in the background (scrapes, KV events), it does not wait for anything."""
        ...


def endpoint_states(
    policy: Policy, on_change: Callable[[EndpointState, BreakerState], None] | None = None
) -> dict[str, list[EndpointState]]:
    """Every pool's endpoints, each with its own circuit breaker."""
    states: dict[str, list[EndpointState]] = {}
    for name, pool in policy.pools.items():
        states[name] = []
        for endpoint in pool.endpoints:
            state = EndpointState(endpoint, name, CircuitBreaker(policy.breakers))
            if on_change is not None:
                state.breaker.on_change = partial(on_change, state)
            states[name].append(state)
    return states


class LeastInFlightPicker:
    """Fewest requests in flight from this process; ties broken at random."""

    def __init__(self, pools: dict[str, list[EndpointState]], seed: int | None = None) -> None:
        self.pools = pools
        self._random = random.Random(seed)

    def prompt_token_ids(self, pool: str, request: PickRequest) -> list[int] | None:
        return None

    def rank(self, pool: str, request: PickRequest) -> Ranking:
        return LeastInFlightRanking(self.pools.get(pool, []), self._random)


class LeastInFlightRanking:
    """Ranks lazily: each ``next`` takes the endpoint with the fewest requests in flight per
    unit of capacity at that moment (counting is cheaper than sorting, and a retry sees the
    counts as they are then); of tied endpoints, each in proportion to its capacity."""

    __slots__ = ("_endpoints", "_random")

    def __init__(self, endpoints: list[EndpointState], rng: random.Random) -> None:
        self._endpoints = endpoints
        self._random = rng

    def refused(self, endpoint: EndpointState) -> None:
        return None

    def started(self, endpoint: EndpointState) -> None:
        return None

    def finished(self, endpoint: EndpointState, prompt_tokens: int | None = None) -> None:
        return None  # the in-flight counts it ranks by are the attempts' own

    def prefill(self) -> EndpointState | None:
        return None

    def next(self, exclude: set[str]) -> EndpointState | None:
        """The untried endpoint with the fewest requests in flight (``exclude`` holds the
        addresses already tried or blocked)."""
        best: EndpointState | None = None
        least = ties = 0.0
        for endpoint in self._endpoints:
            if exclude and endpoint.address in exclude:
                continue
            capacity = endpoint.capacity
            load = endpoint.requests.count / capacity
            if best is None or load < least:
                best, least, ties = endpoint, load, capacity
            elif load == least:  # weighted reservoir sampling: each tied one by its capacity
                ties += capacity
                if self._random.random() * ties < capacity:
                    best = endpoint
        return best
