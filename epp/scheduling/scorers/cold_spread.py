"""``cold-spread-scorer``: new prefixes go to the endpoints whose caches are the least full.

A request that no endpoint holds a useful part of (fewer than the index's
``min_match_blocks`` distinguishing blocks anywhere) is scored by how full the prefix index
believes each endpoint's cache is (blocks held over the cache's capacity, or blocks held
while some capacity is not scraped yet), min-max scaled, emptiest best: each new system prompt or
conversation lands where there is room, so the prefixes spread evenly over the caches instead
of piling onto whichever endpoint happened to be least busy at that moment (sglang-router's
cache_aware sends a miss to the smallest tree for the same reason). A request some endpoint
holds gets 0.5 everywhere (the prefix scorer decides it) while the caches are alike in fill;
where they differ by a quarter of a cache or more, it too goes where the caches hold least: what
it adds evicts other conversations' blocks from a full cache, not from an empty one. (On
conversations over a few shared system prompts the precise index, which knows the engines' full
caches and empty ones, kept every new conversation on the prompts' holders and left half the
engines idle: TTFT p90 3.5-4.7x the approximate index's, `make bench-routing`
``shared-sessions``.)

Once the caches are scraped, fill that differs by less than a quarter of a cache says nothing:
caches that are all full differ by a few blocks from moment to moment (an engine that is busy
holds fewer finished blocks), and scaling that noise to the full 0-1 range sent every new
conversation to the busiest engine (precise mode on multi-turn). Among caches alike
in fill, the new prompt content each endpoint was sent lately decides (``among_full: placed``,
``epp.datalayer.placement``), per unit of the endpoint's capacity: a new conversation's later turns
will follow it, so this spreads the conversations, where full caches no longer can.
``among_full: fill`` scores the small differences in proportion instead. Fill, not blocks: a
cache a quarter the size of another is full with a quarter of the blocks, and counting blocks
sent every new prefix to it.

A new prefix of a LoRA adapter goes where it fits (``epp.datalayer.placement.adapter_fits``: an
endpoint that serves that adapter already, or serves fewer adapters than it holds at once):
those score 0.5-1 (spread among themselves as above), the rest 0. Each prefix's later requests
follow it, so this keeps each engine to the adapters it can hold, instead of one that swaps
adapters in and out and makes requests wait for a free adapter slot. Unless every endpoint it
fits was sent more than 1.25 times the pool's mean new content lately
(``epp.datalayer.placement.room_among``): a popular adapter served by few endpoints would
overflow their caches, so its new prefix is spread over the whole pool and takes one more
adapter to an endpoint with room.

It reads the EPP's first prefix index (list a ``prefix-cache-scorer`` in the profile too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.datalayer.indexes.prefix_index import PrefixIndex
from epp.datalayer.placement import adapter_fits, holding, placed, room_among
from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import parse_params
from epp.scheduling.scorers.queue import min_max_low_is_best

# differences in cache fill below this share of a cache count in proportion, not in full
SIGNIFICANT_SHARE = 0.25
PER_MILLE = 1000
SIGNIFICANT = int(PER_MILLE * SIGNIFICANT_SHARE)  # a quarter of a cache, per mille


@dataclass(frozen=True)
class Params:
    among_full: str = "placed"  # placed | fill: what decides among caches alike in fill


class ColdSpreadScorer:
    """Scores a request no endpoint holds by cache fill (the emptiest scores 1)."""

    def __init__(self, name: str, params: Params, handle: PluginHandle) -> None:
        self.name = name
        self.params = params
        self._handle = handle

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"among_full": lambda v: v in ("placed", "fill")})

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> ColdSpreadScorer:
        return cls(name, cls.parse_config(name, raw), handle)

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        index = self._handle.primary_index
        if index is None:
            return {e.address: 0.5 for e in endpoints}
        addresses = [e.address for e in endpoints]
        keys = index.keys(request)
        if keys:
            matched = index.match(keys, addresses)
            spread = max(matched.values(), default=0) - min(matched.values(), default=0)
            if spread >= index.params.min_match_blocks:
                return _uneven_fill(index, endpoints) or dict.fromkeys(addresses, 0.5)
        if request.lora is not None:
            lora = request.lora
            held = holding(endpoints, lora)
            fit = held or [e for e in endpoints if adapter_fits(e, lora)]
            if fit and len(fit) < len(endpoints) and (held or room_among(fit, endpoints)):
                scores = dict.fromkeys(addresses, 0.0)
                scores.update({a: 0.5 + s / 2 for a, s in self._spread(index, fit).items()})
                return scores
        return self._spread(index, endpoints)

    def _spread(self, index: PrefixIndex, endpoints: list[Endpoint]) -> dict[str, float]:
        fill = _fill(index, endpoints)
        if fill is None:  # not scraped yet: blocks held, every difference counts
            return min_max_low_is_best({e.address: index.blocks_of(e.address) for e in endpoints})
        if (
            self.params.among_full == "fill"
            or max(fill.values()) - min(fill.values()) >= SIGNIFICANT
        ):
            return min_max_low_is_best(fill, SIGNIFICANT)
        return min_max_low_is_best({e.address: placed(e) / e.capacity for e in endpoints})


def _uneven_fill(index: PrefixIndex, endpoints: list[Endpoint]) -> dict[str, float]:
    """For a request some endpoint holds: the emptiest caches best where the caches' fill
    differs by a quarter of a cache or more (what the request adds evicts others' blocks
    from a full cache, not from an empty one); else nothing (the prefix scorer decides)."""
    fill = _fill(index, endpoints)
    if fill is None or max(fill.values()) - min(fill.values()) < SIGNIFICANT:
        return {}
    return min_max_low_is_best(fill, SIGNIFICANT)


def _fill(index: PrefixIndex, endpoints: list[Endpoint]) -> dict[str, int] | None:
    """Each endpoint's cache fill as the index believes it, per mille of its capacity; None
    while some capacity is not scraped yet."""
    capacity = {e.address: index.capacity_of(e) for e in endpoints}
    if not all(capacity.values()):
        return None
    return {a: index.blocks_of(a) * PER_MILLE // c for a, c in capacity.items()}
