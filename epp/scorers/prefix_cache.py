"""``prefix-cache-scorer``: matched leading blocks / total blocks of the request.

``mode: approximate`` (default, GIE's): blocks are ``block_size_tokens x chars_per_token``
characters of the routing text, at most ``max_prefix_blocks``; after each pick the request's
blocks are recorded for the chosen endpoint in an LRU sized from its ``num_gpu_blocks``.

``mode: precise``: the request is tokenized as the backend does (``tokenizer``: ``byte`` or a
``tokenizer.json`` path) and cut into ``block_size_tokens`` blocks, matched against the blocks
the engines report in their KV events (the EPP feeds ``precise_index``); picks are recorded
speculatively for ``speculative_ttl`` seconds to cover event lag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epp.framework import Endpoint, SchedulingRequest
from epp.indexes.approximate import DEFAULT_CAPACITY, ApproximatePrefixIndex, prefix_hashes
from epp.indexes.precise import PreciseIndex, block_keys
from epp.params import ParamError, parse_params
from epp.routing_text import routing_text
from epp.tokenize import make_encoder, request_token_ids


@dataclass(frozen=True)
class Params:
    mode: str = "approximate"  # approximate | precise
    block_size_tokens: int = 16
    chars_per_token: int = 4
    max_prefix_blocks: int = 256
    lru_capacity_per_endpoint: int = DEFAULT_CAPACITY
    tokenizer: str = "byte"  # precise mode: byte | path to an HF tokenizer.json
    speculative_ttl: float = 2.0


class PrefixCacheScorer:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.index = ApproximatePrefixIndex()
        self.precise_index = PreciseIndex(params.speculative_ttl)
        self.precise = params.mode == "precise"
        self._encode = make_encoder(params.tokenizer) if self.precise else None
        self._block_chars = params.block_size_tokens * params.chars_per_token
        self._last: tuple[str, list[int]] = ("", [])

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        checks = {
            k: (lambda v: v > 0)
            for k in (
                "block_size_tokens",
                "chars_per_token",
                "max_prefix_blocks",
                "lru_capacity_per_endpoint",
                "speculative_ttl",
            )
        }
        checks["mode"] = lambda v: v in ("approximate", "precise")
        params = parse_params(Params, name, raw, checks)
        if params.tokenizer != "byte" and not Path(params.tokenizer).is_file():
            raise ParamError(f"{name}.tokenizer: no such file: {params.tokenizer!r}")
        return params

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> PrefixCacheScorer:
        params = cls.parse_config(name, raw)
        try:
            return cls(name, params)
        except ValueError as exc:
            raise ParamError(f"{name}.tokenizer: {exc}") from exc

    def hashes(self, request: SchedulingRequest) -> list[int]:
        """The request's block keys (cached for the request id across score and pick)."""
        if request.request_id and self._last[0] == request.request_id:
            return self._last[1]
        p = self.params
        if self._encode is not None:
            tokens = request_token_ids(request.body, self._encode)
            hashes = block_keys(
                tokens, p.block_size_tokens, request.lora, max_blocks=p.max_prefix_blocks
            )
        else:
            hashes = prefix_hashes(
                request.model, request.routing_text, self._block_chars, p.max_prefix_blocks
            )
        self._last = (request.request_id, hashes)
        return hashes

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        hashes = self.hashes(request)
        if not hashes:
            return {e.address: 0.0 for e in endpoints}
        index = self.precise_index if self.precise else self.index
        matched = index.match(hashes, [e.address for e in endpoints])
        return {address: blocks / len(hashes) for address, blocks in matched.items()}

    def uncached_tokens(self, request: SchedulingRequest, endpoint: Endpoint) -> int:
        """About how many prompt tokens ``endpoint`` would have to compute (not cached there)."""
        hashes = self.hashes(request)
        index = self.precise_index if self.precise else self.index
        matched = index.match(hashes, [endpoint.address])[endpoint.address] if hashes else 0
        if self._encode is not None:
            total = len(request_token_ids(request.body, self._encode))
        else:  # the routing text is cut to what the index uses: measure the whole request
            text = routing_text(request.body) if request.body else request.routing_text
            total = len(text) // self.params.chars_per_token
        return max(0, total - matched * self.params.block_size_tokens)

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        hashes = self.hashes(request)
        if not hashes:
            return
        if self.precise:
            self.precise_index.record_speculative(endpoint.address, hashes)
        else:
            self.index.record(endpoint.address, hashes, self._capacity(endpoint))

    def _capacity(self, endpoint: Endpoint) -> int:
        m = endpoint.metrics
        if m.num_gpu_blocks and m.block_size:
            # KV capacity in this index's blocks (characters, not tokens)
            return max(1, m.num_gpu_blocks * m.block_size // self.params.block_size_tokens)
        return self.params.lru_capacity_per_endpoint
