"""``kv-cache-utilization-scorer``: 1 - KV-cache usage (0..1)."""

from __future__ import annotations

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import Parameterless


class KVCacheUtilizationScorer(Parameterless):
    """Scores 1 - KV-cache usage: emptier caches first."""

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return {e.address: 1.0 - e.metrics.kv_usage for e in endpoints}
