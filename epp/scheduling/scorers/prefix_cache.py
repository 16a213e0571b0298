"""``prefix-cache-scorer``: the leading blocks of the request an endpoint holds beyond what
every candidate holds, as a share of the blocks not held by all.

Blocks that every candidate holds distinguish none of them (a chat template's first block,
say, which every endpoint that served anything has), and a match of fewer than
``min_match_blocks`` distinguishing blocks scores nothing, so that a sliver of shared prefix
never outweighs load: when no endpoint holds a useful part of the prefix, every score is 0 and
the other scorers (queue, KV use) decide.

Its parameters choose the prefix index it reads (``PrefixIndexParams``): ``mode: approximate``
(default, GIE's) learns from the picker's own decisions; ``mode: precise`` reads the engines' KV
events, each engine's lower tiers (host memory, storage) included at their weights
(``cpu_tier_weight``, ``storage_tier_weight``: 0 ignores a tier). The EPP service owns the
index (``PluginHandle.prefix_index``) and teaches it each dispatched pick (and takes it back if
refused); this scorer only reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from epp.datalayer.indexes.prefix_index import PrefixIndex, PrefixIndexParams
from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import ParamError, parse_params

POSITIVE = (
    "block_size_tokens",
    "chars_per_token",
    "max_prefix_blocks",
    "lru_capacity_per_endpoint",
    "speculative_ttl",
    "min_match_blocks",
)


class PrefixCacheScorer:
    """Scores each endpoint by the share of the request's leading blocks it holds."""

    def __init__(self, name: str, index: PrefixIndex) -> None:
        self.name = name
        self.index = index

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> PrefixIndexParams:
        checks = {k: (lambda v: v > 0) for k in POSITIVE}
        checks["mode"] = lambda v: v in ("approximate", "precise")
        checks["cpu_tier_weight"] = checks["storage_tier_weight"] = lambda v: 0 <= v <= 1
        params = parse_params(PrefixIndexParams, name, raw, checks)
        if params.tokenizer != "byte" and not Path(params.tokenizer).exists():
            raise ParamError(f"{name}.tokenizer: no such file or folder: {params.tokenizer!r}")
        return params

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> PrefixCacheScorer:
        params = cls.parse_config(name, raw)
        try:
            return cls(name, handle.prefix_index(params))
        except ValueError as exc:
            raise ParamError(f"{name}.tokenizer: {exc}") from exc

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        keys = self.index.keys(request)
        if not keys:
            return {e.address: 0.0 for e in endpoints}
        matched = self.index.match(keys, [e.address for e in endpoints])
        request.prefix_match.update(matched)
        common = min(matched.values(), default=0)
        if max(matched.values(), default=0) - common < self.index.params.min_match_blocks:
            return {e.address: 0.0 for e in endpoints}
        return {
            address: (blocks - common) / (len(keys) - common) for address, blocks in matched.items()
        }
