"""``kv-cache-utilization-scorer``: 1 - KV-cache usage (0..1)."""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params
from epp.scorers.queue import Params


class KVCacheUtilizationScorer:
    """Scores 1 - KV-cache usage: emptier caches first."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> KVCacheUtilizationScorer:
        cls.parse_config(name, raw)
        return cls(name)

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return {e.address: 1.0 - e.metrics.kv_usage for e in endpoints}
