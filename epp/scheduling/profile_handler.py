"""Profile handlers: which scheduling profiles run for a request, and what their results mean
(GIE's ``ProfileHandler``).

``SingleProfileHandler`` runs one profile over every candidate. ``PdProfileHandler`` serves
prefill/decode pools: it runs the decode profile over the endpoints that decode, and the
prefill profile over the prefill endpoints only when the prompt's uncached part on the chosen
decode endpoint is at least the pool's ``pd.min_uncached_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from epp.datalayer.indexes.prefix_index import PrefixIndex
from epp.framework import Endpoint, SchedulingRequest, SchedulingResult
from epp.scheduling.profile_runner import ProfileRunner

DECODE_ROLES = ("decode", "both")


@dataclass(frozen=True, slots=True)
class Decision:
    """What the profiles chose: ``result`` ranks the endpoints that serve the request (the
    decode side of a prefill/decode pool); ``prefill`` computes its prompt first, if any."""

    result: SchedulingResult
    prefill: Endpoint | None = None

    @property
    def chosen(self) -> list[Endpoint]:
        """Every endpoint that takes part (the one serving it first)."""
        target = self.result.target
        served = [] if target is None else [target]
        return served + ([self.prefill] if self.prefill is not None else [])


class ProfileHandler(Protocol):
    """Chooses which profiles run for a request and combines their results (GIE's contract)."""

    def decide(self, request: SchedulingRequest, candidates: list[Endpoint]) -> Decision:
        """Run the profiles this request needs over ``candidates``."""
        ...


class SingleProfileHandler:
    """One profile over every candidate."""

    def __init__(self, scheduler: ProfileRunner) -> None:
        self.scheduler = scheduler

    def decide(self, request: SchedulingRequest, candidates: list[Endpoint]) -> Decision:
        return Decision(self.scheduler.schedule(request, candidates))


class PdProfileHandler:
    """A decode pick, plus a prefill pick when the decode endpoint would have to compute at
    least ``min_uncached_tokens`` of the prompt (with no prefix index: never) and the prefill
    endpoints are not all saturated, nor all busy with ``max_prefill_in_flight`` prefills from
    this picker (a queued prefill would only delay the first token: the decode endpoint
    prefills it itself)."""

    def __init__(
        self,
        decode: ProfileRunner,
        prefill: ProfileRunner,
        min_uncached_tokens: int,
        index: PrefixIndex | None,
        all_saturated: Callable[[list[Endpoint]], bool] = lambda endpoints: False,
        max_prefill_in_flight: int | None = None,
    ) -> None:
        self.decode = decode
        self.prefill = prefill
        self.min_uncached_tokens = min_uncached_tokens
        self.index = index
        self.all_saturated = all_saturated
        self.max_prefill_in_flight = max_prefill_in_flight

    def decide(self, request: SchedulingRequest, candidates: list[Endpoint]) -> Decision:
        decoders = [e for e in candidates if e.spec.role in DECODE_ROLES]
        decode = self.decode.schedule(request, decoders)
        target = decode.target
        if target is None or self.index is None:
            return Decision(decode)
        if self.index.uncached_tokens(request, target) < self.min_uncached_tokens:
            return Decision(decode)
        prefillers = [e for e in candidates if e.spec.role == "prefill"]
        busy = self.max_prefill_in_flight
        if busy is not None:  # a prefill that would queue behind others: prefill it here
            prefillers = [e for e in prefillers if e.in_flight < busy]
        if not prefillers or self.all_saturated(prefillers):
            return Decision(decode)
        return Decision(decode, self.prefill.schedule(request, prefillers).target)
