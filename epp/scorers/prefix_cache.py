"""``prefix-cache-scorer`` (approximate): matched leading blocks / total blocks of the request.

Blocks are ``block_size_tokens x chars_per_token`` characters of the routing text (GIE's 16 x 4);
at most ``max_prefix_blocks`` are considered. After each pick the request's blocks are
recorded for the chosen endpoint, in an LRU sized from its ``num_gpu_blocks`` (or
``lru_capacity_per_endpoint`` while unknown).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.indexes.approximate import DEFAULT_CAPACITY, ApproximatePrefixIndex, prefix_hashes
from epp.params import parse_params


@dataclass(frozen=True)
class Params:
    block_size_tokens: int = 16
    chars_per_token: int = 4
    max_prefix_blocks: int = 256
    lru_capacity_per_endpoint: int = DEFAULT_CAPACITY


class PrefixCacheScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.index = ApproximatePrefixIndex()
        self._block_chars = params.block_size_tokens * params.chars_per_token
        self._last: tuple[str, list[int]] = ("", [])

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> PrefixCacheScorer:
        names = (
            "block_size_tokens",
            "chars_per_token",
            "max_prefix_blocks",
            "lru_capacity_per_endpoint",
        )
        positive = {k: (lambda v: v > 0) for k in names}
        return cls(name, parse_params(Params, name, raw, positive))

    def hashes(self, request: SchedulingRequest) -> list[int]:
        if self._last[0] == request.request_id and request.request_id:
            return self._last[1]
        hashes = prefix_hashes(
            request.model, request.routing_text, self._block_chars, self.params.max_prefix_blocks
        )
        self._last = (request.request_id, hashes)
        return hashes

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        hashes = self.hashes(request)
        if not hashes:
            return {e.address: 0.0 for e in endpoints}
        matched = self.index.match(hashes, [e.address for e in endpoints])
        return {address: blocks / len(hashes) for address, blocks in matched.items()}

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        hashes = self.hashes(request)
        if hashes:
            capacity = self._capacity(endpoint)
            self.index.record(endpoint.address, hashes, capacity)

    def _capacity(self, endpoint: Endpoint) -> int:
        m = endpoint.metrics
        if m.num_gpu_blocks and m.block_size:
            # KV capacity in this index's blocks (characters, not tokens)
            return max(1, m.num_gpu_blocks * m.block_size // self.params.block_size_tokens)
        return self.params.lru_capacity_per_endpoint
